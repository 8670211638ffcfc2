"""Fixtures: a real broker on 127.0.0.1 in this process (its own loop thread)."""

from __future__ import annotations

import os

import pytest

from lockmq.client.embedded import EmbeddedBroker

#: Fast retries and leases so redelivery and dead-letter tests take milliseconds.
FAST = {"consumers": {"time_scale": 0.01, "max_retries": 2, "visibility_timeout_ms": 3000}}


def _uvloop() -> bool:
    return os.environ.get("LOCKMQ_TEST_UVLOOP", "1") == "1"


@pytest.fixture
def broker(tmp_path):
    """A running broker with auth off and fast retry timing; stopped after the test."""
    b = EmbeddedBroker(str(tmp_path / "data"), overrides=FAST, uvloop=_uvloop()).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def broker_factory(tmp_path):
    """Start brokers on demand (same data dir and port across restarts)."""
    started: list[EmbeddedBroker] = []

    def make(port: int = 0, **overrides) -> EmbeddedBroker:
        tables = {k: dict(v) for k, v in FAST.items()}
        for k, v in overrides.items():
            tables.setdefault(k, {}).update(v)
        b = EmbeddedBroker(str(tmp_path / "data"), port=port, overrides=tables,
                           uvloop=_uvloop()).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()
