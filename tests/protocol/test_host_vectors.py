"""The host-only vectors (protocol/vectors.json ``host_frames``: transactional and
scheduled messages), checked by CPython and by the real MicroPython with the same
checks (host_vector_checks.py)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from lockmq import protocol as p
from lockmq.protocol import txn as t
from lockmq.testing.micropython import PROTOCOL, build_mpy_lib, run_micropython

HERE = Path(__file__).resolve().parent
VECTORS = PROTOCOL / "vectors.json"


def test_host_vectors_pass_under_cpython() -> None:
    sys.path.insert(0, str(HERE))   # the checks import vector_checks as MicroPython does
    try:
        from . import host_vector_checks
        passed, failures = host_vector_checks.run(str(VECTORS))
    finally:
        sys.path.remove(str(HERE))
    assert failures == []
    assert passed >= 11 * 4


def test_host_vectors_pass_under_micropython(tmp_path: Path) -> None:
    lib = build_mpy_lib(tmp_path, False)
    for name in ("mpy_host_vectors.py", "host_vector_checks.py", "vector_checks.py"):
        shutil.copy(HERE / name, tmp_path / name)
    proc = run_micropython(tmp_path / "mpy_host_vectors.py", [str(VECTORS)], tmp_path,
                           [lib, tmp_path], "512K")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 failed" in proc.stdout


def test_the_firmware_does_not_load_the_host_only_bodies() -> None:
    # each byte of the frozen protocol costs lock RAM: only the host imports these
    init = (PROTOCOL / "__init__.py").read_text()
    assert "txn" not in init and "schedule" not in init


def test_an_outcome_not_allowed_is_refused_on_both_sides() -> None:
    with pytest.raises(p.LocalProtocolError):
        t.TxnEnd(1, 3).encode()
    with pytest.raises(p.BadBody):
        t.TxnEnd.decode(bytes(8) + b"\x07")
    assert t.TxnEnd.decode(bytes(8) + b"\x00").outcome == t.TxnOutcome.UNKNOWN
