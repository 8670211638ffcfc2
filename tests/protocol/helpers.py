"""Helpers of the tests/protocol folder (CPython only: the MicroPython scripts here
import vector_checks / session_checks, never this)."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

import lockmq

HOST = Path(lockmq.__file__).resolve().parent       # host/lockmq


def _compiled() -> ModuleType | None:
    """lockmq._speedups, or None when it was not built (no C compiler at install).
    Not ``lockmq.accel``: the tests hold both paths equal whatever LOCKMQ_PURE_PYTHON
    says."""
    if not list(HOST.glob("_speedups*.so")):
        return None
    from lockmq import _speedups   # built: an import error is a failure, not a skip
    return _speedups


#: the compiled hot path, or None when it was not built
SPEEDUPS = _compiled()
#: skips a test of the compiled path, with the reason, when it was not built
NOT_BUILT = pytest.mark.skipif(SPEEDUPS is None, reason="lockmq._speedups is not built "
                               "(no C compiler when lockmq was installed): pure path only")
