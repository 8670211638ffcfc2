"""Fixtures: a real broker on 127.0.0.1 in this process (its own loop thread)."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from lockmq.testing import BrokerThread, merge_tables

#: Fast retries and leases so redelivery and dead-letter tests take milliseconds.
FAST = {"consumers": {"time_scale": 0.01, "max_retries": 2, "visibility_timeout_ms": 3000}}


@pytest.fixture
def broker(tmp_path):
    """A running broker with auth off and fast retry timing; stopped after the test."""
    b = BrokerThread(str(tmp_path / "data"), **FAST).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def broker_factory(tmp_path):
    """Start brokers on demand (same data dir and port across restarts); every one is
    stopped after the test (all of them, even if stopping one fails)."""
    with ExitStack() as stack:
        def make(port: int = 0, **overrides) -> BrokerThread:
            b = BrokerThread(str(tmp_path / "data"), port=port,
                             **merge_tables(FAST, overrides)).start()
            stack.callback(b.stop)
            return b

        yield make
