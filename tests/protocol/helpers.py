"""Helpers of the tests/protocol folder (CPython only: the MicroPython scripts here
import vector_checks / session_checks, never this)."""
from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

import lockmq

HOST = Path(lockmq.__file__).resolve().parent       # host/lockmq


def _compiled() -> ModuleType | None:
    """lockmq._core, or None when it was not built (no Rust toolchain at install).
    Not ``lockmq.accel``: the tests hold both paths equal whatever LOCKMQ_PURE_PYTHON
    says."""
    if not list(HOST.glob("_core*.so")):
        return None
    from lockmq import _core   # built: an import error is a failure, not a skip
    return _core


#: the compiled hot path, or None when it was not built
SPEEDUPS = _compiled()
#: skips a test of the compiled path, with the reason, when it was not built
NOT_BUILT = pytest.mark.skipif(SPEEDUPS is None, reason="lockmq._core is not built "
                               "(no Rust toolchain when lockmq was installed): pure path only")

#: how many times its usual number of examples each fuzz target of the compiled core
#: (a property over random and damaged input, per parser) runs: 1 in the suite
#: (seconds), more under bench/fuzz_core.py (minutes)
FUZZ = max(1, int(os.environ.get("LOCKMQ_FUZZ_SCALE", "1")))
