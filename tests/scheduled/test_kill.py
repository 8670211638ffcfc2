"""SIGKILL a broker process while it delivers scheduled messages: after the restart
every one is in its topic exactly once (the unmarked batch is found there, not
written again; tests/scheduled/test_scheduled.py pins that state exactly)."""
from __future__ import annotations

import time

from lockmq.testing import BrokerProcess, open_peer, wait_for

from .helpers import consume, headers, publish_at

N = 2000


def _topic_end(p, topic: str) -> int:
    for t in p.admin("topics")["topics"]:
        if t["topic"] == topic:
            return t["queue_end"]
    return 0


def test_kill_during_deliveries_delivers_each_once(tmp_path):
    b = BrokerProcess(tmp_path / "data", {"broker": {"auth": "off"},
                                          "scheduled": {"batch": 20, "max_sleep_ms": 50}})
    try:
        with open_peer(b.port) as p:
            at = time.time() * 1000 + 1000
            ids = {publish_at(p, "t", i, at, b"%d" % i) for i in range(N)}
            wait_for(lambda: _topic_end(p, "t") > 0, "deliveries to start", timeout=30)
            assert b.metrics()["lockmq_scheduled_accepted_total"] == N
        b.restart(crash=True)                   # SIGKILL mid-way (or just after)
        with open_peer(b.port) as p:
            wait_for(lambda: p.admin("scheduled.list")["waiting"] == 0, "all delivered",
                     timeout=60)
            assert _topic_end(p, "t") == N
            got = consume(p, "t", N)
            assert {headers(m)["scheduled_id"] for m in got} == ids
    finally:
        b.stop()
