"""Retention wins over abandoned clusters, clusters skip forward and expire (issue 12),
over real TCP with the broker on a ManualClock: simulated hours pass in no time."""

from __future__ import annotations

import json
import os

from lockmq.clock import ManualClock
from lockmq.protocol import Role

from lockmq.testing import Peer, drain, open_peer, wait_for

HOUR = 3600 * 1000
DAY = 24 * HOUR
T0 = 1_700_000_000_000


def _publish(b, topic: str, start: int, n: int) -> None:
    """Publish as the lock LOCK-R, then wait until the broker has stored its offline
    ``$devices`` record: written after the lock leaves, it must not land after the
    test moves the clock (it would be a write at the new time)."""
    core = b.broker.core

    def offline_records() -> int:
        recs = b.call(lambda: core.store.read("$devices", 0, 10_000))
        return sum(1 for r in recs if json.loads(r.payload).get("event") == "offline")

    before = offline_records()
    p = open_peer(b.port, sn="LOCK-R", role=Role.LOCK)
    for seq in range(start, start + n):
        p.publish(topic, seq, b"x" * 200)
    p.close()
    wait_for(lambda: offline_records() > before, "LOCK-R's offline record to be stored")


def _cluster(peer: Peer, name: str) -> dict:
    found = peer.admin("clusters", cluster=name)["clusters"]
    return found[0] if found else {}


def _settings(**clusters):
    return dict(store={"segment_bytes": 4096, "retention_ms": 2 * HOUR, "segment_ms": -1},
                broker={"retention_interval_s": 3600.0},   # the tests run the sweep
                clusters=clusters or {"offsets_retention_ms": -1})


def test_an_abandoned_cluster_no_longer_keeps_the_log_and_skips_forward(make_broker):
    clock = ManualClock(T0)
    b = make_broker(clock=clock, **_settings())
    core = b.broker.core
    _publish(b, "t1", 0, 200)
    c = open_peer(b.port)
    sub = c.subscribe("t1", "cli").sub_id           # `lockmq consume t1 -n 1`
    assert len(drain(c, sub, 1, batch=1)) == 1
    c.close()
    live = open_peer(b.port)                             # a member that lags: connected, idle
    live_sub = live.subscribe("t1", "lagging").sub_id
    wait_for(lambda: _cluster(live, "cli").get("live") is False or
          not _cluster(live, "cli").get("members"), "the cli member to leave")
    clock.advance(3 * HOUR)
    _publish(b, "t1", 200, 200)
    segments = lambda: len(os.listdir(os.path.join(core.store.data_dir, "message.log")))  # noqa: E731
    before = segments()
    b.call(core.enforce_retention)
    start = core.store.queue_start("t1")
    assert 100 < start <= 200 and segments() < before   # the old segments are gone
    info = _cluster(live, "cli")
    assert info["committed"] == start and info["skipped"] == start - 1
    lag = _cluster(live, "lagging")
    assert lag["skipped"] == start and lag["stats"]["skipped"] == start
    stats = live.admin("stats")
    assert stats["broker"]["retention_skipped"] == 2 * start - 1
    assert stats["store"]["skipped_records"] == start
    # consumers get the next available message: no error, no hang
    got = live.pull(live_sub, 5).messages
    assert [m.queue_offset for m in got] == list(range(start, start + 5))
    again = open_peer(b.port)
    sub = again.subscribe("t1", "cli").sub_id
    assert drain(again, sub, 1, batch=1)[0].queue_offset == start
    # the skip was saved: a restart keeps it
    again.close()
    live.close()
    b.stop()
    b2 = make_broker(data_dir=core.store.data_dir, clock=clock, **_settings())
    p = open_peer(b2.port)
    info = _cluster(p, "cli")
    assert info["committed"] >= start and info["skipped"] == start - 1
    p.close()


def test_unused_clusters_expire_and_the_clock_survives_a_restart(make_broker, tmp_path):
    clock = ManualClock(T0)
    data = str(tmp_path / "data")
    settings = _settings(offsets_retention_ms=DAY)
    b = make_broker(data_dir=data, clock=clock, **settings)
    _publish(b, "t", 0, 10)
    old = open_peer(b.port)
    sub = old.subscribe("t", "old").sub_id
    drain(old, sub, 10)
    old.close()
    busy = open_peer(b.port)
    busy.subscribe("t", "busy")                     # connected, never commits
    wait_for(lambda: _cluster(busy, "old").get("members") == [], "the old member to leave")
    assert _cluster(busy, "old")["last_active_ms"] >= T0
    clock.advance(12 * HOUR)
    busy.close()
    wait_for(lambda: _cluster(open_peer(b.port), "busy").get("members") == [], "busy to leave")
    b.stop()                                        # a restart half-way
    b = make_broker(data_dir=data, clock=clock, **settings)
    core = b.broker.core
    clock.advance(12 * HOUR - 2)
    assert b.call(core.expire_clusters) == []       # not a day since old was used
    clock.advance(2)
    assert b.call(core.expire_clusters) == ["old"]  # counted from before the restart
    p = open_peer(b.port)
    assert _cluster(p, "old") == {} and _cluster(p, "busy")
    assert not os.path.exists(os.path.join(data, "consume-old.log"))
    assert p.admin("stats")["broker"]["clusters_expired"] == 1
    clock.advance(12 * HOUR)
    assert b.call(core.expire_clusters) == ["busy"]
    # an expired name is free again and starts afresh
    sub = p.subscribe("t", "old").sub_id
    assert len(drain(p, sub, 10)) == 10
    p.close()


def test_forever_keeps_clusters_and_the_timer_closes_a_quiet_segment(make_broker):
    clock = ManualClock(T0)
    b = make_broker(clock=clock, store={"segment_ms": HOUR, "retention_ms": -1},
                    broker={"retention_interval_s": 0.02},
                    clusters={"offsets_retention_ms": -1})
    core = b.broker.core
    _publish(b, "q", 0, 3)
    p = open_peer(b.port)
    p.subscribe("q", "keep")
    p.close()
    clock.advance(HOUR)                             # no new write: the timer rolls
    wait_for(lambda: len(core.store._segments) == 2, "the quiet segment to be closed")
    clock.advance(365 * DAY)
    assert b.call(core.expire_clusters) == []
    assert core.store.stats["time_rolls"] == 1 and core.store.log_start == 0
