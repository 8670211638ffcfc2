"""Scheduled delivery on the client side: when a message is due, and the frames of a
scheduled publish, command and cancel (SPEC "Scheduled delivery").

A producer's ``send(..., deliver_at=..., delay=..., level=...)`` (give at most one)
becomes a PUBLISH_AT; the broker stores it durably and writes it to its topic when
due. ``level`` is RocketMQ's delay-level shorthand, resolved here, never on the wire:
1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h (levels 1..18).
"""

from __future__ import annotations

import time
from datetime import datetime

from lockmq.config_base import ROCKETMQ_LEVELS_S   # (below config: no import circle)
from lockmq.protocol import Op
from lockmq.protocol.schedule import CommandAt, CommandScheduled, PublishAt, ScheduleCancel

__all__ = ["DELAY_LEVELS_S", "due_ms", "publish_at_body", "command_at_body",
           "cancel_body", "scheduled_id_of", "level_delay_ms"]

#: RocketMQ's delay levels (level n is entry n-1): the one table, ``lockmq.config``'s,
#: which is also the default of a consumer's retry backoff.
DELAY_LEVELS_S = ROCKETMQ_LEVELS_S


def level_delay_ms(level: int) -> int:
    """The delay of RocketMQ delay level ``level`` (1..18) in ms."""
    if not 1 <= level <= len(DELAY_LEVELS_S):
        raise ValueError("delay level must be 1..%d" % len(DELAY_LEVELS_S))
    return int(DELAY_LEVELS_S[level - 1] * 1000)


def due_ms(deliver_at: float | datetime | None = None, delay: float | None = None,
           level: int | None = None, now_ms: float | None = None) -> int | None:
    """The delivery time in ms since the epoch, or None for "now" (a plain publish).

    ``deliver_at``: a datetime or seconds since the epoch; ``delay``: seconds from
    now; ``level``: a RocketMQ delay level (1..18). At most one may be given."""
    if deliver_at is None and delay is None and level is None:
        return None   # a plain publish: every send_async passes here first
    if (deliver_at is not None) + (delay is not None) + (level is not None) > 1:
        raise ValueError("give one of deliver_at, delay and level")
    now = time.time() * 1000 if now_ms is None else now_ms
    if level is not None:
        return int(now + level_delay_ms(level))
    if delay is not None:
        if delay < 0:
            raise ValueError("delay must be >= 0 seconds")
        return int(now + delay * 1000)
    if isinstance(deliver_at, datetime):
        return int(deliver_at.timestamp() * 1000)
    return int(float(deliver_at) * 1000)   # type: ignore[arg-type]


def publish_at_body(topic: str, seq: int, lock_ts_ms: int, at_ms: int, payload: bytes) -> bytes:
    """A PUBLISH_AT body."""
    return PublishAt(topic, seq, lock_ts_ms, at_ms, bytes(payload)).encode()


def command_at_body(target: str, kind: int, args: bytes, not_before_ms: int,
                    expires_ms: int = 0) -> bytes:
    """A COMMAND_AT body (``expires_ms`` 0: the broker's default, counted from then)."""
    return CommandAt(target, 0, expires_ms, kind, bytes(args), not_before_ms).encode()


def cancel_body(schedule_id: int) -> bytes:
    """A SCHEDULE_CANCEL body."""
    return ScheduleCancel(schedule_id).encode()


def scheduled_id_of(opcode: int, body: bytes) -> int:
    """The schedule id in a COMMAND_SCHEDULED answer."""
    if opcode != Op.COMMAND_SCHEDULED:
        raise ValueError(f"expected COMMAND_SCHEDULED, got opcode 0x{opcode:04x}")
    return CommandScheduled.decode(body).schedule_id



