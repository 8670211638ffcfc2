"""Fixtures for the firmware tests: a compiled flash folder, a fresh board copied from
it, and running locks (:class:`lockmq.testing.Lock`: the real firmware in the
MicroPython unix port) stopped after each test.

Every test that boots a lock runs twice: on the 64-bit unix port with the app as
``.mpy`` in ``lib/`` (``mpy64``), and on the 32-bit port with the app frozen in at a
64K heap, as on an ESP32 image (``mpy32-frozen``; skipped with the reason when
``gcc -m32`` or the shared toolchain is missing).
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from pathlib import Path

import pytest

from lockmq.testing import Lock, require_micropython
from lockmq.testing.lock import build_flash
from lockmq.testing.micropython import (INTERPRETERS, Interpreter, get_interpreter,
                                        interpreter_unavailable, run_mpy)


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    """One compiled flash folder (no state), the template every test copies."""
    require_micropython()
    return build_flash(tmp_path_factory.mktemp("fw") / "flash")


@pytest.fixture(scope="session", params=INTERPRETERS)
def firmware_interp(request) -> Interpreter:
    """The interpreter the locks of this test run on."""
    why = interpreter_unavailable(request.param)
    if why:
        pytest.skip(f"{request.param}: {why}")
    return get_interpreter(request.param)


@pytest.fixture(scope="session")
def board_template(firmware_interp, built, tmp_path_factory) -> Path:
    """The flash folder for ``firmware_interp``: ``built``, or (frozen) one without lib/."""
    if not firmware_interp.frozen:
        return built
    return build_flash(tmp_path_factory.mktemp("fw-frozen") / "flash", frozen=True)


@pytest.fixture(scope="session")
def app_lib(firmware_interp, built, tmp_path_factory) -> Path:
    """The ``lib/`` a unit-test script imports the app from: the compiled one, or
    (frozen interpreter) an empty one, so that the app comes from the executable."""
    if not firmware_interp.frozen:
        return built / "lib"
    return tmp_path_factory.mktemp("frozen-lib")


#: The heap of the firmware's unit-test scripts: they compile their own source in the
#: heap and some fill a whole queue, so more than a running lock's.
UNIT_HEAP = "256K"


@pytest.fixture
def run_app(firmware_interp, app_lib):
    """``run_app(script, cwd, heap=UNIT_HEAP, timeout=60)``: run a script that imports
    the app under ``firmware_interp`` (64-bit with .mpy, 32-bit frozen); its stdout."""
    def run(script: str, cwd: Path, heap: str = UNIT_HEAP, timeout: float = 60) -> str:
        return run_mpy(script, cwd, app_lib, heap, timeout, firmware_interp.exe)

    return run


@pytest.fixture
def build_args(firmware_interp, tmp_path) -> list[str]:
    """Extra ``lockmq firmware build`` arguments for a board of ``firmware_interp``."""
    return ["--frozen", "--manifest-dir", str(tmp_path / "manifest")] if firmware_interp.frozen else []


@pytest.fixture
def needs_tls(firmware_interp) -> None:
    """Skip on an interpreter built without ``ssl``."""
    if not firmware_interp.has_tls:
        pytest.skip(f"{firmware_interp.name} is built without ssl (TLS runs in mbedTLS outside "
                    "the heap on an ESP32)")


@pytest.fixture
def flash(board_template, tmp_path) -> Path:
    """A fresh board: a copy of the template folder."""
    dst = tmp_path / "board"
    shutil.copytree(board_template, dst)
    return dst


@pytest.fixture
def lock_factory(firmware_interp):
    """``lock_factory(folder)`` boots a lock; every lock is killed after the test (all
    of them, even if killing one fails)."""
    with ExitStack() as stack:
        def make(folder: Path, heap: str | None = None) -> Lock:
            lk = Lock(folder, heap or firmware_interp.heap, micropython=firmware_interp.exe)
            stack.callback(lk.close)
            return lk

        yield make
