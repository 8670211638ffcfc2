"""Steps of the wall clock under a running ``lockmq broker`` (issue 34), made with
Debian's libfaketime (``faketime``'s preload library; the monotonic clocks are left
alone, as an NTP step leaves them): +8 days deletes and expires nothing, -1 hour
holds no retry; the step is logged and counted (``lockmq_clock_steps_total``)."""

from __future__ import annotations

import glob
import os
import time

import pytest

from lockmq.testing import BrokerProcess, open_peer

LIBS = glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + \
    glob.glob("/usr/lib/faketime/libfaketime.so.1")
pytestmark = pytest.mark.skipif(not LIBS, reason="libfaketime (Debian: faketime) missing")
TOPIC = "ev"


@pytest.fixture
def faketime(tmp_path, monkeypatch):
    """A broker started in this test runs under libfaketime; writing ``"+8d"`` or
    ``"-1h"`` to the returned file steps its wall clock at once."""
    path = tmp_path / "faketime"
    path.write_text("+0\n")
    monkeypatch.setenv("LD_PRELOAD", LIBS[0])
    monkeypatch.setenv("FAKETIME_TIMESTAMP_FILE", str(path))
    monkeypatch.setenv("FAKETIME_NO_CACHE", "1")
    monkeypatch.setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1")

    def step(spec: str) -> None:
        tmp = path.with_suffix(".new")
        tmp.write_text(spec + "\n")
        os.replace(tmp, path)
    return step


def _drain(port: int, cluster: str) -> list[str]:
    ids: list[str] = []
    with open_peer(port) as cons:
        sub = cons.subscribe(TOPIC, cluster).sub_id
        empty = 0
        while empty < 2:
            got = cons.pull(sub, 500, wait_ms=300).messages
            empty = 0 if got else empty + 1
            if got:
                cons.ack(sub, [m.lease for m in got])
                ids.extend(m.message_id for m in got)
    return ids


#: records of the eight-days test: ~36 KB, two closed 16 KB segments retention could delete
N_RECORDS = 600


def test_eight_days_forward_deletes_and_expires_nothing(tmp_path, faketime):
    b = BrokerProcess(str(tmp_path / "data"), {
        "broker": {"auth": "off", "retention_interval_s": 0.2},
        "store": {"segment_bytes": 16384}})
    try:
        with open_peer(b.port, sn="LOCK-1") as p:
            for seq in range(N_RECORDS):
                p.publish(TOPIC, seq, b"r" * 24)
        acked = [f"LOCK-1:{s}" for s in range(N_RECORDS)]
        with open_peer(b.port) as cons:           # an offline cluster, 10 acked
            sub = cons.subscribe(TOPIC, "offline").sub_id
            got = cons.pull(sub, 10, wait_ms=1000).messages
            cons.ack(sub, [m.lease for m in got])
        mark = b.mark()
        faketime("+8d")
        line = b.wait_log("event=clock_step", start=mark, timeout=20)
        assert "direction=forward" in line
        time.sleep(2.0)   # ten retention runs on the stepped clock (a bounded wait)
        assert not [x for x in b.lines[mark:] if "event=retention " in x
                    or "event=cluster_expired" in x]
        assert _drain(b.port, "fresh") == acked
        off = _drain(b.port, "offline")
        assert off == acked[len(off) and N_RECORDS - len(off):]
        assert len(off) == N_RECORDS - 10
        assert b.metrics().get("lockmq_clock_steps_total", 0) >= 1
        assert b.stop() == 0
        # a restart on the same boot continues steady time: still nothing is old
        mark = b.mark()
        b.start()
        b.wait_log("event=clock_restored", start=mark)
        time.sleep(1.0)
        assert not [x for x in b.lines[mark:] if "event=retention " in x]
        assert _drain(b.port, "fresh2") == acked
    finally:
        b.kill()


def test_one_hour_back_holds_no_retry(tmp_path, faketime):
    b = BrokerProcess(str(tmp_path / "data"), {
        "broker": {"auth": "off"}, "consumers": {"retry_levels_s": [3.0]}})
    try:
        with open_peer(b.port, sn="LOCK-1") as p:
            p.publish(TOPIC, 0, b"x" * 24)
        with open_peer(b.port) as cons:
            sub = cons.subscribe(TOPIC, "c").sub_id
            [m] = cons.pull(sub, 1, wait_ms=2000).messages
            cons.nack(sub, [m.lease], delay_ms=3000)
            mark = b.mark()
            faketime("-1h")
            assert "direction=back" in b.wait_log("event=clock_step", start=mark, timeout=20)
            again = []
            deadline = time.monotonic() + 30   # bounded: due 3 s after the nack
            while not again and time.monotonic() < deadline:
                again = cons.pull(sub, 1, wait_ms=1000).messages
            assert again and again[0].message_id == m.message_id
            cons.ack(sub, [again[0].lease])
        assert b.stop() == 0
    finally:
        b.kill()


def test_a_scheduled_message_never_fires_early_on_a_forward_step(tmp_path):
    """Tied to the wall clock (a user asked for a time) but never early: after the
    wall clock jumps past its time, it still waits for its steady due time."""
    from lockmq.clock import ManualClock
    from lockmq.testing import BrokerThread, wait_for

    from ..scheduled.helpers import consume, publish_at

    t0 = 1_800_000_000_000.0
    clock = ManualClock(t0)
    with BrokerThread(str(tmp_path / "d"), clock=clock,
                      scheduled={"max_sleep_ms": 20}) as b, open_peer(b.port) as p:
        publish_at(p, "door.reminders", 1, t0 + 60_000, b"still open?")
        clock.step(2 * 3600_000)                       # NTP: two hours forward at once
        sched = b.broker.scheduler
        wait_for(lambda: sched.looked_at_ms >= t0 + 2 * 3600_000, "the timer to look")
        core = b.broker.core
        assert "door.reminders" not in core.topics() or core.queue_end("door.reminders") == 0
        clock.advance(60_000)                          # its minute really passed
        [m] = consume(p, "door.reminders", 1)
        assert m.payload == b"still open?"


def test_a_backward_step_does_not_hold_a_waiting_items_refresh(tmp_path):
    """The refresh that keeps a waiting item's record from retention runs on steady
    time: a wall clock stepped days back does not postpone it (the item could
    otherwise vanish with its segment)."""
    from lockmq.clock import ManualClock
    from lockmq.testing import BrokerThread, wait_for

    from ..scheduled.helpers import publish_at

    t0 = 1_800_000_000_000.0
    clock = ManualClock(t0)
    with BrokerThread(str(tmp_path / "d"), clock=clock,
                      scheduled={"max_sleep_ms": 20, "refresh_after_s": 10.0}) as b, \
            open_peer(b.port) as p:
        publish_at(p, "later", 1, t0 + 30 * 86400_000, b"in a month")
        clock.step(-2 * 86400_000)                     # two days back
        clock.advance(11_000)                          # the refresh age really passed
        wait_for(lambda: b.broker.stats.c.get("scheduled_refreshed", 0) >= 1,
                 "the waiting item's refresh")
