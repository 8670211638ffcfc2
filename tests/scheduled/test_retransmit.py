"""A retransmitted PUBLISH_AT (same producer id and seq) is answered DUPLICATE with
the schedule id of the waiting original -- also after a restart -- and with 0 once
the original was delivered."""
from __future__ import annotations

from lockmq.clock import ManualClock
from lockmq.protocol import Op, PublishAck
from lockmq.protocol.schedule import PublishAt
from lockmq.testing import BrokerThread, open_peer, wait_for

from .helpers import consume, publish_at

T0 = 1_800_000_000_000.0
FAST = {"max_sleep_ms": 20}


def _again(peer, seq: int, at_ms: float) -> PublishAck:
    return peer.request(Op.PUBLISH_AT, PublishAt("t", seq, 0, int(at_ms), b"x").encode())


def test_a_retransmission_gets_the_original_schedule_id(tmp_path):
    clock = ManualClock(T0)
    d = str(tmp_path / "d")
    with BrokerThread(d, clock=clock, scheduled=FAST) as b, open_peer(b.port, "svc") as p:
        first = publish_at(p, "t", 1, T0 + 60_000, b"x")
        other = publish_at(p, "t", 2, T0 + 60_000, b"x")
        assert _again(p, 1, T0 + 60_000) == PublishAck(PublishAck.DUPLICATE, first)
        assert p.admin("scheduled.list")["waiting"] == 2
    with BrokerThread(d, clock=clock, scheduled=FAST) as b, open_peer(b.port, "svc") as p:
        assert _again(p, 2, T0 + 60_000) == PublishAck(PublishAck.DUPLICATE, other)
        clock.advance(60_000)
        consume(p, "t", 2)
        wait_for(lambda: p.admin("scheduled.list")["waiting"] == 0, "the delivered marks")
        assert _again(p, 1, T0 + 60_000) == PublishAck(PublishAck.DUPLICATE, 0)
        assert b.broker.scheduler.pub_ids == {}          # nothing kept for delivered items
