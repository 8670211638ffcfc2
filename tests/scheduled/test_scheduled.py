"""Scheduled publishes over real TCP: on time (never before), after a restart, once
across a crash between the write and its mark, cancel, caps.

Most tests run the broker on a ManualClock: time moves only when the test says, so
"not before" is checked without sleeping (the timer's last look at the clock is
waited for), and "on time" is exact: the delivered record's broker timestamp is the
due time (the stated tolerance for a real clock is one ``max_sleep_ms`` plus a group
commit; docs/operators.md)."""
from __future__ import annotations

from lockmq.clock import ManualClock
from lockmq.protocol import ErrorCode, Op
from lockmq.store import NewRecord
from lockmq.testing import BrokerThread, open_peer, refusal, wait_for

from .helpers import cancel, consume, headers, publish_at

T0 = 1_800_000_000_000.0
FAST = {"max_sleep_ms": 20}


def _sched(b):
    return b.broker.scheduler


def _looked_past(b, t_ms: float) -> None:
    """Wait until the timer has looked at the clock at or after ``t_ms``."""
    wait_for(lambda: _sched(b).looked_at_ms >= t_ms, "the scheduler's timer to run")


def _queue_end(b, topic: str) -> int:
    """How many records ``topic`` holds (0 when it does not exist yet)."""
    core = b.broker.core
    return core.queue_end(topic) if topic in core.topics() else 0


def test_delivered_at_its_time_and_not_before(tmp_path):
    clock = ManualClock(T0)
    with BrokerThread(str(tmp_path / "d"), clock=clock, scheduled=FAST) as b, \
            open_peer(b.port) as p:
        sid = publish_at(p, "door.reminders", 1, T0 + 60_000, b"still open?")
        assert p.admin("scheduled.list")["items"][0]["id"] == sid
        clock.advance(59_999)
        _looked_past(b, T0 + 59_999)
        assert _queue_end(b, "door.reminders") == 0          # not a millisecond early
        assert p.admin("scheduled.list")["waiting"] == 1
        clock.advance(1)
        [m] = consume(p, "door.reminders", 1)
        assert m.payload == b"still open?"
        assert m.broker_ts_us // 1000 == T0 + 60_000          # on the due ms (clock stood)
        assert headers(m)["scheduled_id"] == sid and headers(m)["producer_seq"] == 1
        wait_for(lambda: p.admin("scheduled.list")["waiting"] == 0, "the delivered mark")


def test_due_during_downtime_is_delivered_once_on_restart(tmp_path):
    clock = ManualClock(T0)
    d = str(tmp_path / "d")
    with BrokerThread(d, clock=clock, scheduled=FAST) as b, open_peer(b.port) as p:
        ids = [publish_at(p, "t", i, T0 + 10_000 * (i + 1)) for i in range(3)]
    clock.advance(25_000)                     # two fall due while the broker is down
    with BrokerThread(d, clock=clock, scheduled=FAST) as b, open_peer(b.port) as p:
        got = consume(p, "t", 2)
        assert sorted(headers(m)["scheduled_id"] for m in got) == ids[:2]
        wait_for(lambda: p.admin("scheduled.list")["waiting"] == 1, "the delivered marks")
    with BrokerThread(d, clock=clock, scheduled=FAST) as b, open_peer(b.port) as p:
        _looked_past(b, T0 + 25_000)
        assert _queue_end(b, "t") == 2          # not again after a second restart
        clock.advance(10_000)
        wait_for(lambda: _queue_end(b, "t") == 3, "the third on time")


def test_written_but_unmarked_before_a_crash_is_not_written_again(tmp_path):
    """The state a SIGKILL between the topic write and the ``done`` mark leaves: the
    message is in its topic, the schedule record unmarked. (tests/scheduled/
    test_kill.py kills a real broker process during deliveries.)"""
    clock = ManualClock(T0)
    d = str(tmp_path / "d")
    with BrokerThread(d, clock=clock, scheduled=FAST) as b:
        core = b.broker.core
        [a] = b.run(core.append([NewRecord("$scheduled", "svc", 7, 0, b"x", {
            "t": "pub", "at": T0 + 1000, "topic": "t", "owner": "svc", "q0": 0})]))
        b.run(core.append([NewRecord("t", "$scheduled", a.queue_offset, 0, b"x", {
            "scheduled_id": a.queue_offset})]))
    clock.advance(5000)
    with BrokerThread(d, clock=clock, scheduled=FAST) as b, open_peer(b.port) as p:
        assert p.admin("scheduled.list")["waiting"] == 0
        assert b.broker.stats.c["scheduled_dedup"] == 1
        _looked_past(b, T0 + 5000)
        assert _queue_end(b, "t") == 1


def test_cancel_is_durable_and_only_once(tmp_path):
    clock = ManualClock(T0)
    d = str(tmp_path / "d")
    with BrokerThread(d, clock=clock, scheduled=FAST) as b, open_peer(b.port) as p:
        keep = publish_at(p, "t", 1, T0 + 1000, b"keep")
        drop = publish_at(p, "t", 2, T0 + 1000, b"drop")
        cancel(p, drop)
        assert refusal(lambda: cancel(p, drop)).code == ErrorCode.INVALID_ARGUMENT
        assert [i["id"] for i in p.admin("scheduled.list")["items"]] == [keep]
    clock.advance(2000)
    with BrokerThread(d, clock=clock, scheduled=FAST) as b, open_peer(b.port) as p:
        [m] = consume(p, "t", 1)
        assert m.payload == b"keep"
        _looked_past(b, T0 + 2000)
        assert _queue_end(b, "t") == 1
        assert p.admin("scheduled.cancel", id=keep)["ok"] is False   # delivered already


def test_caps_per_principal_and_horizon(tmp_path):
    clock = ManualClock(T0)
    with BrokerThread(str(tmp_path / "d"), clock=clock,
                      scheduled={"max_per_principal": 3, "max_horizon_s": 3600.0}) as b, \
            open_peer(b.port) as p:
        ids = [publish_at(p, "t", i, T0 + 1000) for i in range(3)]
        assert refusal(lambda: publish_at(p, "t", 3, T0 + 1000)).code == \
            ErrorCode.LIMIT_EXCEEDED
        assert refusal(lambda: publish_at(p, "t", 4, T0 + 3_601_000)).code == \
            ErrorCode.INVALID_ARGUMENT
        assert refusal(lambda: publish_at(p, "$devices", 5, T0 + 1000)).code in (
            ErrorCode.INVALID_ARGUMENT, ErrorCode.FORBIDDEN)
        cancel(p, ids[0])
        publish_at(p, "t", 6, T0 + 1000)          # room again
        with open_peer(b.port, "bad-input") as bad:   # a malformed body: that link only
            bad.send(Op.PUBLISH_AT, b"\x05ab")
            assert [e.code for e in bad.wait_closed()] == [ErrorCode.BAD_BODY]
        assert p.admin("scheduled.list")["waiting"] == 3
        assert p.publish("t", 7).status == 0        # the broker keeps serving


def test_a_long_wait_is_rewritten_under_its_id_before_retention_could_take_it(tmp_path):
    clock = ManualClock(T0)
    d = str(tmp_path / "d")
    day = 24 * 3600 * 1000
    tables = {"scheduled": {**FAST, "refresh_after_s": 3600.0}}
    with BrokerThread(d, clock=clock, **tables) as b, open_peer(b.port) as p:
        sid = publish_at(p, "t", 1, T0 + 10 * day, b"in ten days")
        clock.advance(2 * 3600 * 1000)
        wait_for(lambda: b.broker.stats.c.get("scheduled_refreshed", 0) == 1, "a refresh")
        assert _queue_end(b, "$scheduled") == 2
    with BrokerThread(d, clock=clock, **tables) as b, open_peer(b.port) as p:
        assert [i["id"] for i in p.admin("scheduled.list")["items"]] == [sid]
        clock.advance(10 * day)
        [m] = consume(p, "t", 1)
        assert headers(m)["scheduled_id"] == sid and headers(m)["producer_seq"] == 1
        wait_for(lambda: p.admin("scheduled.list")["waiting"] == 0, "the delivered mark")
