"""The compiled core's own tests (``cargo test`` in host/rust/: its parsers, codecs,
checksums and MACs as plain Rust, no Python linked), run with the suite wherever a
Rust toolchain is."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CRATE = Path(__file__).resolve().parents[2] / "host" / "rust"


@pytest.mark.slow  # cargo test of the crate; the Python/Rust parity tests run by default
@pytest.mark.skipif(shutil.which("cargo") is None, reason="no Rust toolchain (cargo) here")
def test_cargo_test_passes() -> None:
    out = subprocess.run(["cargo", "test", "--release", "--quiet"], cwd=CRATE, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "test result: ok" in out.stdout
