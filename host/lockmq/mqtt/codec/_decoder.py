"""The incremental MQTT decoder: bytes in any chunks, whole packets out, no I/O.

``feed(data)`` then ``next_packet()`` until it returns None (needs more data). The
remaining length is checked against ``max_packet`` as soon as the fixed header is
read, so an oversized packet is refused before its body is buffered; every other
defect is a :class:`MalformedPacket` or :class:`ProtocolViolation` naming it. The
buffer never holds more than one packet plus one read.
"""

from __future__ import annotations

from ._errors import (UNSUPPORTED_PROTOCOL_VERSION, MalformedPacket, MqttError,
                      PacketTooLarge, ProtocolViolation)
from ._packets import (AUTH, CONNACK, CONNECT, DISCONNECT, PINGREQ, PINGRESP, PUBACK, PUBCOMP,
                       PUBLISH, PUBREC, PUBREL, SUBACK, SUBSCRIBE, UNSUBACK, UNSUBSCRIBE, V5,
                       V311, Ack, AuthPacket, ConnAck, Connect, Disconnect, Packet, Ping,
                       Publish, SubAck, Subscribe, Subscription, UnsubAck, Unsubscribe, Will)
from ._wire import Reader

#: the flags nibble each packet type must carry (PUBLISH's are its own)
_FLAGS = {CONNECT: 0, CONNACK: 0, PUBACK: 0, PUBREC: 0, PUBREL: 2, PUBCOMP: 0, SUBSCRIBE: 2,
          SUBACK: 0, UNSUBSCRIBE: 2, UNSUBACK: 0, PINGREQ: 0, PINGRESP: 0, DISCONNECT: 0,
          AUTH: 0}


class Decoder:
    """Incremental decoder for one direction of one connection.

    ``version`` is 4 (v3.1.1) or 5: a server sets it from the CONNECT (which parses
    under either), a client from what it sent."""

    def __init__(self, max_packet: int = 1 << 20, version: int = V5) -> None:
        self.max_packet = max_packet
        self.version = version
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        """Add received bytes."""
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a packet."""
        return len(self._buf)

    def next_packet(self) -> Packet | None:
        """The next whole packet, or None until more bytes arrive."""
        buf = self._buf
        if len(buf) < 2:
            return None
        n = shift = 0
        i = 1
        while True:
            if i >= len(buf):
                return None
            b = buf[i]
            n |= (b & 0x7F) << shift
            i += 1
            if not b & 0x80:
                break
            shift += 7
            if i > 4:
                raise MalformedPacket("remaining length longer than 4 bytes")
        if i + n > self.max_packet:
            raise PacketTooLarge(i + n, self.max_packet)
        if len(buf) < i + n:
            return None
        first = buf[0]
        body = bytes(buf[i:i + n])
        del buf[:i + n]
        return parse(first >> 4, first & 0x0F, body, self.version)


def parse(ptype: int, flags: int, body: bytes, version: int = V5) -> Packet:
    """One packet from its type, flags nibble and body."""
    if ptype == PUBLISH:
        return _publish(flags, body, version)
    want = _FLAGS.get(ptype)
    if want is None:
        raise MalformedPacket(f"packet type {ptype} is reserved")
    if flags != want:
        raise MalformedPacket(f"packet type {ptype} with flags {flags:#x} (must be {want:#x})")
    r = Reader(body)
    v5 = version == V5
    if ptype == CONNECT:
        return _connect(r)
    if ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        pid = r.u16()
        reason, props = 0, {}
        if v5 and r.left():
            reason = r.u8()
            if r.left():
                props = r.props()
        _done(r)
        return Ack(ptype, pid, reason, props)
    if ptype == SUBSCRIBE:
        pid = r.u16()
        props = r.props() if v5 else {}
        subs = []
        while r.left():
            flt = r.string()
            opt = r.u8()
            if opt & 0xC0 or (not v5 and opt & 0xFC) or opt & 3 == 3 or (opt >> 4) & 3 == 3:
                raise MalformedPacket(f"subscription options {opt:#x} are reserved")
            subs.append(Subscription(flt, opt & 3, bool(opt & 4), bool(opt & 8), (opt >> 4) & 3))
        if not subs:
            raise ProtocolViolation("SUBSCRIBE without a topic filter")
        return Subscribe(pid, subs, props)
    if ptype == UNSUBSCRIBE:
        pid = r.u16()
        props = r.props() if v5 else {}
        filters = []
        while r.left():
            filters.append(r.string())
        if not filters:
            raise ProtocolViolation("UNSUBSCRIBE without a topic filter")
        return Unsubscribe(pid, filters, props)
    if ptype in (PINGREQ, PINGRESP):
        _done(r)
        return Ping(ptype)
    if ptype == DISCONNECT:
        reason, props = 0, {}
        if v5 and r.left():
            reason = r.u8()
            if r.left():
                props = r.props()
        _done(r)
        return Disconnect(reason, props)
    if ptype == CONNACK:
        ack_flags = r.u8()
        if ack_flags & 0xFE:
            raise MalformedPacket("CONNACK flags are reserved")
        reason = r.u8()
        props = r.props() if v5 and r.left() else {}
        _done(r)
        return ConnAck(reason, bool(ack_flags & 1), props)
    if ptype == SUBACK:
        pid = r.u16()
        props = r.props() if v5 else {}
        return SubAck(pid, list(r.rest()), props)
    if ptype == UNSUBACK:
        pid = r.u16()
        props = r.props() if v5 and r.left() else {}
        return UnsubAck(pid, list(r.rest()), props)
    # AUTH
    if not v5:
        raise ProtocolViolation("AUTH exists in MQTT 5 only")
    reason, props = 0, {}
    if r.left():
        reason = r.u8()
        if r.left():
            props = r.props()
    _done(r)
    return AuthPacket(reason, props)


def _done(r: Reader) -> None:
    if r.left():
        raise MalformedPacket(f"{r.left()} bytes after the packet's last field")


def _publish(flags: int, body: bytes, version: int) -> Publish:
    qos = (flags >> 1) & 3
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    dup = bool(flags & 8)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH QoS 0 with the DUP flag")
    r = Reader(body)
    topic = r.string()
    pid = 0
    if qos:
        pid = r.u16()
        if pid == 0:
            raise MalformedPacket("PUBLISH with packet identifier 0")
    props = r.props() if version == V5 else {}
    return Publish(topic, r.rest(), qos, bool(flags & 1), dup, pid, props)


def _connect(r: Reader) -> Connect:
    name = r.string()
    level = r.u8()
    if name == "MQIsdp" or (name == "MQTT" and level not in (V311, V5)):
        raise MqttError(UNSUPPORTED_PROTOCOL_VERSION,
                        f"protocol {name} level {level}: this server speaks MQTT 3.1.1 "
                        "(level 4) and 5")
    if name != "MQTT":
        raise MalformedPacket(f"protocol name {name!r} is not MQTT")
    flags = r.u8()
    if flags & 1:
        raise MalformedPacket("CONNECT reserved flag set")
    keepalive = r.u16()
    v5 = level == V5
    props = r.props() if v5 else {}
    client_id = r.string()
    will = None
    wqos = (flags >> 3) & 3
    if flags & 0x04:
        if wqos == 3:
            raise MalformedPacket("will QoS 3")
        wprops = r.props() if v5 else {}
        will = Will(r.string(), r.binary(), wqos, bool(flags & 0x20), wprops)
    elif wqos or flags & 0x20:
        raise MalformedPacket("will QoS or retain set without a will")
    username = r.string() if flags & 0x80 else None
    if not v5 and flags & 0x40 and not flags & 0x80:
        raise MalformedPacket("password without a user name (MQTT 3.1.1)")
    password = r.binary() if flags & 0x40 else None
    _done(r)
    return Connect(client_id, level, bool(flags & 0x02), keepalive, username, password, will,
                   props)
