"""Fixtures for the firmware tests: a compiled flash folder, a fresh board copied from
it, and running locks (:class:`lockmq.testing.Lock`: the real firmware in the
MicroPython unix port) stopped after each test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lockmq.testing import Lock, require_micropython
from lockmq.testing.lock import HEAP, build_flash


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    """One compiled flash folder (no state), the template every test copies."""
    require_micropython()
    return build_flash(tmp_path_factory.mktemp("fw") / "flash")


@pytest.fixture
def flash(built, tmp_path) -> Path:
    """A fresh board: a copy of the template folder."""
    dst = tmp_path / "board"
    shutil.copytree(built, dst)
    return dst


@pytest.fixture
def lock_factory():
    """``lock_factory(folder)`` boots a lock; every lock is killed after the test."""
    made: list[Lock] = []

    def make(folder: Path, heap: str = HEAP) -> Lock:
        lk = Lock(folder, heap)
        made.append(lk)
        return lk
    yield make
    for lk in made:
        lk.close()
