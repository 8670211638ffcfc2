"""Fixtures: a ``lockmq broker`` child process on 127.0.0.1, as an operator runs it."""

from __future__ import annotations

import pytest

from lockmq.testing.process import BrokerProcess


@pytest.fixture
def broker_process(tmp_path):
    """A broker process with auth off; stopped (SIGTERM) after the test."""
    b = BrokerProcess(tmp_path / "data", {"broker": {"auth": "off"}})
    try:
        yield b
    finally:
        b.stop()
