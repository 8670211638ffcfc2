"""The client library's scheduled sends: deliver_at / delay / level, cancel, and a
scheduled command's rights checked at submit."""
from __future__ import annotations

import time

import pytest

from lockmq.client import BrokerError, Producer
from lockmq.client.scheduled import DELAY_LEVELS_S, due_ms
from lockmq.testing import BrokerThread, open_peer, wait_for

from .helpers import consume, headers


def test_due_ms_resolves_levels_delays_and_times():
    assert due_ms(level=1, now_ms=1000) == 2000
    assert due_ms(level=18, now_ms=0) == 2 * 3600 * 1000
    assert len(DELAY_LEVELS_S) == 18
    assert due_ms(delay=1.5, now_ms=0) == 1500
    assert due_ms(deliver_at=12.0) == 12000
    assert due_ms() is None
    for bad in ({"level": 0}, {"level": 19}, {"delay": -1}, {"delay": 1, "level": 1}):
        with pytest.raises(ValueError):
            due_ms(**bad)


def test_producer_schedules_cancels_and_the_message_arrives_after_its_time(tmp_path):
    with BrokerThread(str(tmp_path / "d"), scheduled={"max_sleep_ms": 50}) as b, \
            Producer(b.address, producer_id="sched-client") as prod, open_peer(b.port) as p:
        later = prod.send_sync("t", b"one hour", level=17)
        soon = prod.send_sync("t", b"soon", delay=0.3)
        before = time.time() * 1000
        items = {i["id"]: i for i in p.admin("scheduled.list")["items"]}
        assert set(items) == {later.offset, soon.offset}
        assert items[later.offset]["at_ms"] >= before + 3600 * 1000 - 5000
        prod.cancel_scheduled(later.offset)
        with pytest.raises(BrokerError):
            prod.cancel_scheduled(later.offset)
        [m] = consume(p, "t", 1)
        assert m.payload == b"soon" and headers(m)["scheduled_id"] == soon.offset
        assert m.broker_ts_us // 1000 >= headers(m)["deliver_at_ms"]     # never early
        wait_for(lambda: p.admin("scheduled.list")["waiting"] == 0, "the delivered mark")
