"""Fixtures of the MQTT tests: a real broker with the MQTT listener on."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from lockmq.testing import FAST_TIMERS, BrokerThread, merge_tables

from .helpers import MQTT_ON


@pytest.fixture
def mqtt_broker(tmp_path: Any) -> Iterator[BrokerThread]:
    """A broker in this process (auth off, fast timers) with MQTT on a free port
    (``broker.broker.mqtt.port``)."""
    b = BrokerThread(str(tmp_path / "data"), **merge_tables(FAST_TIMERS, MQTT_ON)).start()
    try:
        yield b
    finally:
        b.stop()
