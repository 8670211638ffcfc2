"""MQTT 3.1.1 and 5 control packets: one class each, ``encode(version)`` to bytes.

Parsing lives in ``_decoder.py``; both sides (a server and a client) use the same
classes, so a round trip ``decode(encode(p)) == p`` is what the property tests hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._wire import encode_bin, encode_props, encode_str, encode_varint

V311 = 4
V5 = 5

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = \
    8, 9, 10, 11, 12, 13, 14, 15


def _fixed(ptype: int, flags: int, body: bytes) -> bytes:
    return bytes((ptype << 4 | flags,)) + encode_varint(len(body)) + body


@dataclass
class Will:
    """A CONNECT's will message."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    props: dict[str, Any] = field(default_factory=dict)


@dataclass
class Connect:
    """CONNECT (client -> server)."""

    client_id: str = ""
    version: int = V5
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    props: dict[str, Any] = field(default_factory=dict)
    ptype = CONNECT

    def encode(self, version: int | None = None) -> bytes:
        v = self.version
        flags = (0x02 if self.clean_start else 0)
        w = self.will
        if w is not None:
            flags |= 0x04 | (w.qos & 3) << 3 | (0x20 if w.retain else 0)
        if self.username is not None:
            flags |= 0x80
        if self.password is not None:
            flags |= 0x40
        body = bytearray(encode_str("MQTT") + bytes((v, flags)) + self.keepalive.to_bytes(2, "big"))
        if v == V5:
            body += encode_props(self.props)
        body += encode_str(self.client_id)
        if w is not None:
            if v == V5:
                body += encode_props(w.props)
            body += encode_str(w.topic) + encode_bin(w.payload)
        if self.username is not None:
            body += encode_str(self.username)
        if self.password is not None:
            body += encode_bin(self.password)
        return _fixed(CONNECT, 0, bytes(body))


@dataclass
class ConnAck:
    """CONNACK: ``reason`` is the MQTT 5 reason code (v3.1.1: its return code)."""

    reason: int = 0
    session_present: bool = False
    props: dict[str, Any] = field(default_factory=dict)
    ptype = CONNACK

    def encode(self, version: int) -> bytes:
        body = bytes((1 if self.session_present else 0, self.reason))
        if version == V5:
            body += encode_props(self.props)
        return _fixed(CONNACK, 0, body)


@dataclass
class Publish:
    """PUBLISH (either way)."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0
    props: dict[str, Any] = field(default_factory=dict)
    ptype = PUBLISH

    def encode(self, version: int) -> bytes:
        body = bytearray(encode_str(self.topic))
        if self.qos:
            body += self.packet_id.to_bytes(2, "big")
        if version == V5:
            body += encode_props(self.props)
        body += self.payload
        flags = (8 if self.dup else 0) | self.qos << 1 | (1 if self.retain else 0)
        return _fixed(PUBLISH, flags, bytes(body))


@dataclass
class Ack:
    """PUBACK / PUBREC / PUBREL / PUBCOMP: a packet id and (v5) a reason."""

    ptype: int
    packet_id: int
    reason: int = 0
    props: dict[str, Any] = field(default_factory=dict)

    def encode(self, version: int) -> bytes:
        body = self.packet_id.to_bytes(2, "big")
        if version == V5 and (self.reason or self.props):
            body += bytes((self.reason,))
            if self.props:
                body += encode_props(self.props)
        return _fixed(self.ptype, 2 if self.ptype == PUBREL else 0, body)


@dataclass
class Subscription:
    """One topic filter of a SUBSCRIBE with its options."""

    filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0

    def options(self) -> int:
        return (self.qos | (4 if self.no_local else 0) | (8 if self.retain_as_published else 0)
                | self.retain_handling << 4)


@dataclass
class Subscribe:
    """SUBSCRIBE (client -> server)."""

    packet_id: int
    subscriptions: list[Subscription]
    props: dict[str, Any] = field(default_factory=dict)
    ptype = SUBSCRIBE

    def encode(self, version: int) -> bytes:
        body = bytearray(self.packet_id.to_bytes(2, "big"))
        if version == V5:
            body += encode_props(self.props)
        for s in self.subscriptions:
            body += encode_str(s.filter) + bytes((s.options() if version == V5 else s.qos,))
        return _fixed(SUBSCRIBE, 2, bytes(body))


@dataclass
class SubAck:
    """SUBACK: one reason code (v3.1.1: granted QoS or 0x80) per subscription."""

    packet_id: int
    reasons: list[int]
    props: dict[str, Any] = field(default_factory=dict)
    ptype = SUBACK

    def encode(self, version: int) -> bytes:
        body = bytearray(self.packet_id.to_bytes(2, "big"))
        if version == V5:
            body += encode_props(self.props)
            body += bytes(self.reasons)
        else:
            body += bytes(r if r < 0x80 else 0x80 for r in self.reasons)
        return _fixed(SUBACK, 0, bytes(body))


@dataclass
class Unsubscribe:
    """UNSUBSCRIBE (client -> server)."""

    packet_id: int
    filters: list[str]
    props: dict[str, Any] = field(default_factory=dict)
    ptype = UNSUBSCRIBE

    def encode(self, version: int) -> bytes:
        body = bytearray(self.packet_id.to_bytes(2, "big"))
        if version == V5:
            body += encode_props(self.props)
        for f in self.filters:
            body += encode_str(f)
        return _fixed(UNSUBSCRIBE, 2, bytes(body))


@dataclass
class UnsubAck:
    """UNSUBACK (v5: a reason per filter; v3.1.1: none)."""

    packet_id: int
    reasons: list[int] = field(default_factory=list)
    props: dict[str, Any] = field(default_factory=dict)
    ptype = UNSUBACK

    def encode(self, version: int) -> bytes:
        body = bytearray(self.packet_id.to_bytes(2, "big"))
        if version == V5:
            body += encode_props(self.props) + bytes(self.reasons)
        return _fixed(UNSUBACK, 0, bytes(body))


@dataclass
class Ping:
    """PINGREQ or PINGRESP."""

    ptype: int = PINGREQ

    def encode(self, version: int) -> bytes:
        return bytes((self.ptype << 4, 0))


@dataclass
class Disconnect:
    """DISCONNECT (v5 either way, with a reason; v3.1.1 client -> server only)."""

    reason: int = 0
    props: dict[str, Any] = field(default_factory=dict)
    ptype = DISCONNECT

    def encode(self, version: int) -> bytes:
        if version != V5 or (not self.reason and not self.props):
            return bytes((DISCONNECT << 4, 0))
        return _fixed(DISCONNECT, 0, bytes((self.reason,)) + encode_props(self.props))


@dataclass
class AuthPacket:
    """AUTH (v5 enhanced authentication)."""

    reason: int = 0
    props: dict[str, Any] = field(default_factory=dict)
    ptype = AUTH

    def encode(self, version: int) -> bytes:
        return _fixed(AUTH, 0, bytes((self.reason,)) + encode_props(self.props))


Packet = (Connect | ConnAck | Publish | Ack | Subscribe | SubAck | Unsubscribe | UnsubAck
          | Ping | Disconnect | AuthPacket)


def publish_bytes(topic_field: bytes, payload: bytes, qos: int, dup: bool, packet_id: int,
                  props_field: bytes | None) -> bytes:
    """A PUBLISH from fields encoded once (``topic_field``: ``encode_str(topic)``;
    ``props_field``: ``encode_props(...)`` for MQTT 5, None for 3.1.1): the delivery
    path's way, equal to ``Publish(...).encode(version)`` (the tests hold them equal)."""
    var = topic_field + (packet_id.to_bytes(2, "big") if qos else b"") + (props_field or b"")
    n = len(var) + len(payload)
    head = bytes((PUBLISH << 4 | (8 if dup else 0) | qos << 1,))
    return head + (bytes((n,)) if n < 128 else encode_varint(n)) + var + payload
