"""`lockmq firmware build --frozen`: the manifest that freezes the app into a board's
image, the flash folder without lib/, and the 32-bit interpreter built from that very
manifest (booting and connecting is proven by the [mpy32-frozen] runs of the other
tests, e.g. test_broker_e2e against the real `lockmq broker` at a 64K heap)."""

from __future__ import annotations

import os
import subprocess

import pytest

import lockmq
from lockmq.cli import main as lockmq_main
from lockmq.firmware_tools.build import folder_files
from lockmq.testing.micropython import MPY32_FROZEN, get_interpreter, interpreter_unavailable

KEY = "ab" * 32


def _build(out, *extra: str) -> int:
    return lockmq_main(["firmware", "build", "--out", str(out), "--sn", "LOCKF1", "--key", KEY,
                        "--broker", "127.0.0.1:6800", "--hw", "sim", "--card", "0A1B", *extra])


def test_frozen_build_writes_a_manifest_and_a_folder_without_lib(tmp_path):
    out = tmp_path / "LOCKF1"
    assert _build(out) == 0                      # an .mpy board first ...
    assert (out / "lib" / "lockapp" / "app.mpy").exists()
    assert _build(out, "--frozen", "--no-image") == 0   # ... rebuilt frozen: no lib/ left to shadow the image
    assert [str(p) for p in folder_files(out)] == ["cards.bin", "config.json", "lockboot.mpy", "main.py"]

    man = tmp_path / "LOCKF1.frozen"
    text = (man / "manifest.py").read_text()
    assert 'package("lockapp", base_path="modules")' in text
    assert 'package("lockmq", base_path="modules")' in text
    assert 'include("$(PORT_DIR)/boards/manifest.py")' in (man / "esp32_manifest.py").read_text()
    mods = man / "modules"
    assert (mods / "lockapp" / "_version.py").read_text() == f'VERSION = "{lockmq.__version__}"\n'
    assert (mods / "lockmq" / "__init__.py").read_bytes() == b""
    assert {"app.py", "link.py", "oqueue.py"} <= {p.name for p in (mods / "lockapp").iterdir()}
    assert {"__init__.py", "_session.py", "_mac.py"} <= {p.name for p in (mods / "lockmq" / "protocol").iterdir()}


def test_frozen_image_holds_no_code(tmp_path):
    pytest.importorskip("littlefs")
    from littlefs import LittleFS

    out = tmp_path / "L"
    assert _build(out, "--frozen", "--manifest-dir", str(tmp_path / "m"), "--fs-size", "0x10000") == 0
    fs = LittleFS(block_size=4096, block_count=16, mount=False, read_size=32, prog_size=32,
                  lookahead_size=32)
    fs.context.buffer = bytearray((tmp_path / "L.lfs").read_bytes())
    fs.mount()
    assert sorted(fs.listdir("/")) == ["cards.bin", "config.json", "lockboot.mpy", "main.py"]
    assert (tmp_path / "m" / "manifest.py").exists()


def test_manifest_dir_needs_frozen(tmp_path, capsys):
    assert _build(tmp_path / "x", "--manifest-dir", str(tmp_path / "m"), "--no-image") == 2
    assert "--manifest-dir goes with --frozen" in capsys.readouterr().err


def test_the_cli_manifest_is_what_the_interpreter_froze(tmp_path):
    """The interpreter the tests and the rig use is built (and cached) from the same
    manifest the CLI writes for a board: same hash, same cached executable."""
    why = interpreter_unavailable(MPY32_FROZEN)
    if why:
        pytest.skip(why)
    from lockmq.firmware_tools.unix32 import build_unix32

    exe = get_interpreter(MPY32_FROZEN).exe
    before = os.stat(exe).st_mtime_ns
    assert _build(tmp_path / "L", "--frozen", "--no-image") == 0
    assert str(build_unix32(tmp_path / "L.frozen")) == exe          # a cache hit ...
    assert os.stat(exe).st_mtime_ns == before                        # ... not a rebuild
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run([exe, "-X", "heapsize=64K", "-c",
                           "import sys, lockapp.app, lockmq.protocol\n"
                           "print(sys.maxsize, lockapp.app.__file__)"],
                          cwd=tmp_path, env={"HOME": str(home), "MICROPYPATH": ".frozen"},
                          capture_output=True, text=True, timeout=30)
    assert proc.stdout.split() == [str(2**31 - 1), "lockapp/app.py"], proc.stdout + proc.stderr


def test_interpreter_command_prints_the_cached_32bit_interpreter(capsys):
    """`lockmq firmware interpreter --bits 32` is the tests' own frozen-app interpreter
    (same cache entry), and it is a 32-bit build."""
    why = interpreter_unavailable(MPY32_FROZEN)
    if why:
        pytest.skip(why)
    assert lockmq_main(["firmware", "interpreter", "--bits", "32"]) == 0
    exe = capsys.readouterr().out.strip()
    assert exe == get_interpreter(MPY32_FROZEN).exe
    out = subprocess.run([exe, "-c", "import sys; print(sys.maxsize)"], capture_output=True, text=True,
                         env={"HOME": os.environ.get("HOME", "/tmp")}).stdout
    assert out.strip() == str(2**31 - 1)


def test_interpreter_command_refuses_bad_sources(tmp_path, capsys):
    assert lockmq_main(["firmware", "interpreter", "--micropython-src", str(tmp_path)]) == 2
    assert "is not a MicroPython source tree" in capsys.readouterr().err
    assert lockmq_main(["firmware", "interpreter", "--manifest-dir", str(tmp_path)]) == 2
    assert "holds no manifest.py" in capsys.readouterr().err
    assert lockmq_main(["firmware", "interpreter", "--bits", "64", "--manifest-dir", str(tmp_path)]) == 2
