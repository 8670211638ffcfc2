"""The message a consumer handler receives."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lockmq import accel
from lockmq.protocol import Messages
# the protocol's name cache: an SN or topic is decoded once, on either path
from lockmq.protocol.batch import TEXT_CACHE_MAX as _CACHE_MAX, TEXTS as _texts

#: compiled: a MESSAGES body's messages as field tuples (None without the extension)
_FIELDS = accel.speedups.messages_fields if accel.COMPILED else None


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
        """Decode the payload as a lock event: an :class:`~lockmq.client.Event`, its
        codes as enums named by the protocol table (``str(ev.event_type)`` is
        ``"door_left_open"``; they compare equal to the wire's ints too)."""
        from .events import decode_event

        return decode_event(self.payload)

    @staticmethod
    def from_wire(m: Any, sub_id: int, generation: int) -> "Message":
        """Build from a protocol ``Message`` inside a MESSAGES frame."""
        # positional: one message per delivery, keyword matching is measurable here
        return Message(m.topic, m.sn, m.seq, m.payload, m.delivery, m.lock_ts_ms,
                       m.broker_ts_us, _headers(m.headers) if m.headers else {},
                       m.queue_offset, sub_id, generation)


def _headers(raw: bytes) -> dict[str, Any]:
    """A message's headers: their JSON object, or ``{"_raw": hex}`` if they are not one."""
    try:
        loaded = json.loads(bytes(raw).decode())
        if isinstance(loaded, dict):
            return loaded
    except (ValueError, UnicodeError):
        pass
    return {"_raw": bytes(raw).hex()}


def messages_from_body(body: bytes, sub_id: int, generation: int) -> list[Message]:
    """The messages of a MESSAGES body as a handler gets them, leased to subscription
    ``sub_id`` of connection ``generation``.

    Compiled (``_core.messages_fields``), the body's fields come as one tuple per
    message and each :class:`Message` is made from its tuple: no protocol object in
    between. A body the compiled scan does not take (a bad one) goes through the
    protocol's decoder, which raises its ``BadBody``."""
    if _FIELDS is not None:
        got = _FIELDS(body, _texts, _CACHE_MAX)
        if got is not None:
            return [Message(topic, sn, seq, payload, delivery, lock_ts, broker_ts,
                            _headers(raw) if raw else {}, offset, sub_id, generation)
                    for topic, sn, seq, payload, delivery, lock_ts, broker_ts, raw, offset
                    in got[1]]
    return [Message.from_wire(m, sub_id, generation) for m in Messages.decode(body).messages]
