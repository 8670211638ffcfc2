"""Only what the lock runs goes on the lock: the flash folder and the frozen manifest
carry the protocol package without its host-only modules, and every module the app
imports under MicroPython is one that ships (lockmq.firmware_tools.targets)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from lockmq.firmware_tools.build import firmware_src, protocol_src
from lockmq.firmware_tools.frozen import write_manifest
from lockmq.firmware_tools.targets import HOST_ONLY, lock_modules

#: Named by the issue (#39) as host-only; the lock must never carry them.
NEVER_ON_A_LOCK = {"batch", "compiled", "_server_session", "_consume", "txn", "schedule"}


def _shipped() -> set[str]:
    return {p.stem for p in lock_modules(protocol_src())}


def test_host_only_modules_exist_and_are_left_out():
    every = {p.stem for p in protocol_src().glob("*.py")}
    assert NEVER_ON_A_LOCK <= HOST_ONLY <= every       # no stale name in the list
    assert _shipped() == every - HOST_ONLY


def test_the_flash_folder_lists_only_the_lock_modules(built):
    protocol = {p.stem for p in (built / "lib/lockmq/protocol").iterdir()}
    assert protocol == _shipped()
    assert not protocol & NEVER_ON_A_LOCK
    app = {p.stem for p in (built / "lib/lockapp").iterdir()}
    assert app == {p.stem for p in (firmware_src() / "lockapp").glob("*.py")} | {"_version"}


def test_the_frozen_manifest_lists_only_the_lock_modules(tmp_path):
    write_manifest(tmp_path)
    protocol = {p.stem for p in (tmp_path / "modules/lockmq/protocol").glob("*.py")}
    assert protocol == _shipped()
    assert not protocol & NEVER_ON_A_LOCK


def test_the_app_imports_exactly_what_ships(run_app, tmp_path: Path):
    """Every lock module imported (the command handler, the config writer, frame MACs,
    the simulator...), under MicroPython: the protocol modules loaded are the shipped
    ones, so none is missing and none ships unused."""
    app = sorted(p.stem for p in (firmware_src() / "lockapp").glob("*.py")
                 if p.stem not in ("__init__", "hw_esp32"))   # hw_esp32 needs machine.Pin
    script = ("import sys\n"
              + "".join(f"import lockapp.{m}\n" for m in app)
              + "import lockmq.protocol._mac\n"
              + "print('MODS', ' '.join(sorted(k[len('lockmq.protocol.'):] for k in sys.modules "
                "if k.startswith('lockmq.protocol.'))))\n")
    shutil.copy(firmware_src() / "lockboot.py", tmp_path)   # beside main.py on a board
    out = run_app(script, tmp_path)
    line = next(ln for ln in out.splitlines() if ln.startswith("MODS"))
    assert set(line.split()[1:]) | {"__init__"} == _shipped()


def test_the_boot_half_imports_nothing_from_the_app():
    """lockboot runs before lib/ is known to be whole (it finishes or undoes a swap, puts
    the old app back): at module level it imports only what the interpreter has. The
    app's update code takes its file helpers from it (one copy), never the reverse."""
    tree = ast.parse((firmware_src() / "lockboot.py").read_text())
    top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert top == {"os", "json"}
    ota = ast.parse((firmware_src() / "lockapp" / "ota.py").read_text())
    assert any(isinstance(n, ast.Import) and n.names[0].name == "lockboot" for n in ast.walk(ota))
    assert not any(isinstance(n, ast.FunctionDef) and n.name in ("_rm", "_has") for n in ota.body)
