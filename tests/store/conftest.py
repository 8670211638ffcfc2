"""Fixtures of the storage-engine tests (their helpers are in helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def data_dir(tmp_path):
    """An empty data directory."""
    return tmp_path / "data"
