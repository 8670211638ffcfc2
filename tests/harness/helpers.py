"""What the benchmark-tool tests share (imported by the test modules of this folder):
bench/'s modules imported by path, the compiled floor built as the benchmark builds
it, and a port probe."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """``bench/NAME.py``, imported by path as ``bench_NAME`` (bench/ is not a package:
    its modules import each other as top-level modules, so bench/ goes on sys.path)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def floor_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bench/floor_c.c compiled by the benchmark's own ``build_c_floor`` (skipped
    without a C compiler; a build that fails fails the test)."""
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler")
    exe = bench_module("bench_broker").build_c_floor(str(tmp_path_factory.mktemp("floor")))
    assert exe is not None, "bench/floor_c.c did not build (its errors are printed above)"
    return Path(exe)


def listening(port: int) -> bool:
    """Something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def start_floor(cmd: list[str]) -> tuple[subprocess.Popen, int]:
    """Start a floor (``bench/floors.py`` or the compiled one) with ``cmd``, which holds
    ``--port 0``; return the process and the port it bound, read from its one
    ``... listening on HOST:PORT`` line (no port picked first and handed over: another
    process could take it in between)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()   # (b"" if it died: the assert says so)
    proc.stdout.close()   # a floor prints nothing else to stdout
    assert " listening on " in line, f"the floor did not start: {line!r}, exit {proc.poll()}"
    return proc, int(line.rsplit(":", 1)[1])
