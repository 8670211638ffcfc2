"""Wire helpers of the scheduled-delivery tests (PUBLISH_AT, COMMAND_AT, cancel)."""
from __future__ import annotations

import json
from typing import Any

from lockmq.protocol import Op, PublishAck
from lockmq.protocol.schedule import CommandAt, CommandScheduled, PublishAt, ScheduleCancel
from lockmq.testing import Peer, drain


def publish_at(peer: Peer, topic: str, seq: int, at_ms: float, payload: bytes = b"later",
               sn: str | None = None) -> int:
    """Schedule one message; returns its schedule id (the PUBLISH_ACK offset)."""
    ack = peer.request(Op.PUBLISH_AT, PublishAt(topic, seq, 0, int(at_ms), payload).encode(),
                       sn=sn)
    assert isinstance(ack, PublishAck) and ack.status == PublishAck.STORED, ack
    return ack.offset


def command_at(peer: Peer, target: str, kind: int, args: bytes, not_before_ms: float,
               cmd_id: int = 1, expires_ms: int = 0) -> int:
    """Schedule one command; returns its schedule id."""
    ans = peer.request(Op.COMMAND_AT, CommandAt(target, cmd_id, expires_ms, kind, args,
                                                int(not_before_ms)).encode())
    assert isinstance(ans, CommandScheduled) and ans.cmd_id == cmd_id, ans
    return ans.schedule_id


def cancel(peer: Peer, schedule_id: int) -> Any:
    """SCHEDULE_CANCEL; raises Refused when the broker says no."""
    return peer.request(Op.SCHEDULE_CANCEL, ScheduleCancel(schedule_id).encode())


def consume(peer: Peer, topic: str, expect: int, cluster: str = "c") -> list[Any]:
    """Subscribe and take ``expect`` messages (acked)."""
    sub = peer.subscribe(topic, cluster).sub_id
    return drain(peer, sub, expect)


def headers(message: Any) -> dict[str, Any]:
    """A delivered message's headers (``scheduled_id``, ``producer``, ...)."""
    return json.loads(message.headers) if message.headers else {}
