"""The message a consumer handler receives."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Message:
    """One delivered message.

    Attributes:
        topic: the topic it was published to.
        sn: the producer id / lock SN that published it.
        seq: the producer's sequence number.
        payload: the message bytes (for lock events, a protocol ``LockEvent``).
        delivery: how many times it has been delivered, this time included (1 first).
        lock_ts_ms: the producer's clock when it was created (0 = unknown).
        broker_ts_us: when the broker stored it.
        headers: metadata (dead letters carry ``reason``, ``original_topic`` ...).
        queue_offset: its position in the topic queue.
    """

    topic: str
    sn: str
    seq: int
    payload: bytes
    delivery: int = 1
    lock_ts_ms: int = 0
    broker_ts_us: int = 0
    headers: dict[str, Any] = field(default_factory=dict)
    queue_offset: int = 0
    # Internal: which subscription and connection generation leased it.
    _sub_id: int = field(default=0, repr=False)
    _generation: int = field(default=0, repr=False)

    @property
    def id(self) -> str:
        """The globally unique message id, ``sn:seq`` (the idempotency key)."""
        return f"{self.sn}:{self.seq}"

    @property
    def lease(self) -> tuple[int, int]:
        """What the broker needs to ack or nack this delivery."""
        return (self.queue_offset, self.delivery)

    @property
    def redelivered(self) -> bool:
        """Whether an earlier delivery of this message was not acknowledged."""
        return self.delivery > 1

    def event(self) -> Any:
        """Decode the payload as a protocol ``LockEvent``."""
        from lockmq.protocol import LockEvent

        return LockEvent.decode(self.payload)

    @staticmethod
    def from_wire(m: Any, sub_id: int, generation: int) -> "Message":
        """Build from a protocol ``Message`` inside a MESSAGES frame."""
        headers: dict[str, Any] = {}
        if m.headers:
            try:
                loaded = json.loads(bytes(m.headers).decode())
                if isinstance(loaded, dict):
                    headers = loaded
            except (ValueError, UnicodeError):
                headers = {"_raw": bytes(m.headers).hex()}
        # positional: one message per delivery, keyword matching is measurable here
        return Message(m.topic, m.sn, m.seq, m.payload, m.delivery, m.lock_ts_ms,
                       m.broker_ts_us, headers, m.queue_offset, sub_id, generation)
