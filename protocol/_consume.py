# Consumer-side bodies: subscribe, notify, pull, message batches, ack, nack.
# Kept apart from _bodies so the lock firmware, which never consumes, does not
# pay their RAM; importing this module registers them with decode_body().
import struct

from ._constants import Op
from ._codec import Reader, pack8, pack16, pack32
from ._errors import BadBody
from ._bodies import _Body, BODY_TYPES


class Subscribe(_Body):
    """Consumer -> broker: join ``cluster`` on ``topic``."""
    __slots__ = ("topic", "cluster", "flags", "max_inflight", "lease_ms")
    OPCODE = Op.SUBSCRIBE
    ORDERED = 0x01    # flags: per-lock ordering (one message per lock in flight)

    def __init__(self, topic, cluster, flags=0, max_inflight=0, lease_ms=0):
        self.topic = topic
        self.cluster = cluster
        self.flags = flags
        self.max_inflight = max_inflight
        self.lease_ms = lease_ms

    def encode(self):
        return (pack8(self.topic, "topic") + pack8(self.cluster, "cluster")
                + struct.pack(">BHI", self.flags, self.max_inflight, self.lease_ms))

    @staticmethod
    def decode(body):
        r = Reader(body, "SUBSCRIBE")
        topic = r.str8()
        cluster = r.str8()
        flags, max_inflight, lease_ms = r.unpack(">BHI", 7)
        r.end()
        return Subscribe(topic, cluster, flags, max_inflight, lease_ms)


class SubscribeAck(_Body):
    __slots__ = ("sub_id", "backlog")
    OPCODE = Op.SUBSCRIBE_ACK

    def __init__(self, sub_id, backlog):
        self.sub_id = sub_id
        self.backlog = backlog

    def encode(self):
        return struct.pack(">IQ", self.sub_id, self.backlog)

    @staticmethod
    def decode(body):
        r = Reader(body, "SUBSCRIBE_ACK")
        fields = r.unpack(">IQ", 12)
        r.end()
        return SubscribeAck(*fields)


class Unsubscribe(_Body):
    """Consumer -> broker: leave the subscription; its leases are released."""
    __slots__ = ("sub_id",)
    OPCODE = Op.UNSUBSCRIBE

    def __init__(self, sub_id):
        self.sub_id = sub_id

    def encode(self):
        return struct.pack(">I", self.sub_id)

    @staticmethod
    def decode(body):
        r = Reader(body, "UNSUBSCRIBE")
        sub_id = r.u32()
        r.end()
        return Unsubscribe(sub_id)


class Notify(_Body):
    """Broker -> idle consumer: messages are waiting for this subscription."""
    __slots__ = ("sub_id", "available")
    OPCODE = Op.NOTIFY

    def __init__(self, sub_id, available):
        self.sub_id = sub_id
        self.available = available

    def encode(self):
        return struct.pack(">II", self.sub_id, self.available)

    @staticmethod
    def decode(body):
        r = Reader(body, "NOTIFY")
        fields = r.unpack(">II", 8)
        r.end()
        return Notify(*fields)


class Pull(_Body):
    """Consumer -> broker: lease up to ``max_messages``; wait up to ``wait_ms``."""
    __slots__ = ("sub_id", "max_messages", "wait_ms")
    OPCODE = Op.PULL

    def __init__(self, sub_id, max_messages, wait_ms=0):
        self.sub_id = sub_id
        self.max_messages = max_messages
        self.wait_ms = wait_ms

    def encode(self):
        return struct.pack(">IHI", self.sub_id, self.max_messages, self.wait_ms)

    @staticmethod
    def decode(body):
        r = Reader(body, "PULL")
        fields = r.unpack(">IHI", 10)
        r.end()
        return Pull(*fields)


_MSG = ">QHIQQ"       # queue_offset, delivery, seq, lock_ts_ms, broker_ts_us
_MSG_SIZE = 30


class Message(_Body):
    """One leased message inside MESSAGES; (queue_offset, delivery) is the lease."""
    __slots__ = ("queue_offset", "delivery", "sn", "seq", "lock_ts_ms", "broker_ts_us",
                 "topic", "headers", "payload")

    def __init__(self, queue_offset, delivery, sn, seq, lock_ts_ms, broker_ts_us,
                 topic, payload, headers=b""):
        self.queue_offset = queue_offset
        self.delivery = delivery
        self.sn = sn
        self.seq = seq
        self.lock_ts_ms = lock_ts_ms
        self.broker_ts_us = broker_ts_us
        self.topic = topic
        self.headers = headers
        self.payload = payload

    @property
    def message_id(self):
        """The globally unique id, ``sn:seq``."""
        return "%s:%d" % (self.sn, self.seq)

    @property
    def lease(self):
        return (self.queue_offset, self.delivery)

    def encode(self):
        return b"".join((struct.pack(_MSG, self.queue_offset, self.delivery, self.seq,
                                     self.lock_ts_ms, self.broker_ts_us),
                         pack8(self.sn, "sn"), pack8(self.topic, "topic"),
                         pack16(self.headers, "headers"), pack32(self.payload)))


class Messages(_Body):
    """Broker -> consumer: a batch of leased messages (answer to PULL)."""
    __slots__ = ("sub_id", "messages")
    OPCODE = Op.MESSAGES

    def __init__(self, sub_id, messages):
        self.sub_id = sub_id
        self.messages = messages

    def encode(self):
        parts = [struct.pack(">IH", self.sub_id, len(self.messages))]
        for m in self.messages:
            parts.append(m.encode())
        return b"".join(parts)

    @staticmethod
    def decode(body):
        # every message a consumer gets in pure Python comes through here: one unpack
        # of the fixed fields, the names from a cache, bounds checked as it goes
        size = len(body)
        if size < 6:
            raise BadBody("MESSAGES body truncated at byte 0")
        sub_id, count = struct.unpack_from(">IH", body, 0)
        pos = 6
        out = []
        for _ in range(count):
            if pos + _MSG_SIZE > size:
                raise _cut("MESSAGES", pos, size)
            qo, delivery, seq, lock_ts_ms, broker_ts_us = struct.unpack_from(_MSG, body, pos)
            sn, pos = _text8(body, pos + _MSG_SIZE, size)
            topic, pos = _text8(body, pos, size)
            if pos + 2 > size:
                raise _cut("MESSAGES", pos, size)
            end = pos + 2 + (body[pos] << 8 | body[pos + 1])
            headers = bytes(body[pos + 2:end])
            if end + 4 > size:
                raise _cut("MESSAGES", min(end, size), size)
            pos = end + 4 + struct.unpack_from(">I", body, end)[0]
            if pos > size:
                raise _cut("MESSAGES", size, size)
            out.append(Message(qo, delivery, sn, seq, lock_ts_ms, broker_ts_us, topic,
                               bytes(body[end + 4:pos]), headers))
        if pos != size:
            raise BadBody("MESSAGES body has %d trailing bytes" % (size - pos))
        return Messages(sub_id, out)


#: str8 bytes -> text: the SNs and topics a consumer hears again and again (emptied
#: at TEXT_CACHE_MAX entries); the client's compiled path shares it
_texts = {}
TEXT_CACHE_MAX = 100000


def _cut(what, pos, size):
    return BadBody("%s body truncated at byte %d" % (what, min(pos, size)))


def _text8(body, pos, size):
    """The str8 at ``pos``: (text, next pos); decoded names are cached."""
    if pos >= size:
        raise _cut("MESSAGES", pos, size)
    end = pos + 1 + body[pos]
    if end > size:
        raise _cut("MESSAGES", pos, size)
    raw = bytes(body[pos + 1:end])
    text = _texts.get(raw)
    if text is None:
        try:
            text = raw.decode()
        except UnicodeError:
            raise BadBody("MESSAGES body has a text field that is not UTF-8")
        if len(_texts) >= TEXT_CACHE_MAX:
            _texts.clear()
        _texts[raw] = text
    return text, end


def _pack_leases(leases):
    parts = [struct.pack(">H", len(leases))]
    for queue_offset, delivery in leases:
        parts.append(struct.pack(">QH", queue_offset, delivery))
    return b"".join(parts)


def _leases_at(body, pos, what):
    """The u16 count at ``pos`` and that many (queue_offset u64, delivery u16) leases
    after it, which must end the body: one unpack for them all."""
    if len(body) < pos + 2:
        raise BadBody("%s body truncated" % what)
    count = body[pos] << 8 | body[pos + 1]
    pos += 2
    if len(body) != pos + count * 10:
        raise BadBody("%s body: %d leases need %d bytes, got %d" % (
            what, count, count * 10, len(body) - pos))
    if count == 1:   # (a consumer acking one message at a time)
        return [struct.unpack_from(">QH", body, pos)]
    if not count:
        return []
    fmt = _LEASE_FORMATS.get(count)
    if fmt is None:
        fmt = ">" + "QH" * count
        if len(_LEASE_FORMATS) < 64:
            _LEASE_FORMATS[count] = fmt
    flat = iter(struct.unpack_from(fmt, body, pos))
    return list(zip(flat, flat))


#: lease count -> its unpack format (the common counts, made once)
_LEASE_FORMATS = {}


class Ack(_Body):
    """Consumer -> broker: these leases are done."""
    __slots__ = ("sub_id", "leases")
    OPCODE = Op.ACK

    def __init__(self, sub_id, leases):
        self.sub_id = sub_id
        self.leases = [tuple(x) for x in leases]

    def encode(self):
        return struct.pack(">I", self.sub_id) + _pack_leases(self.leases)

    @staticmethod
    def decode(body):
        if len(body) < 4:
            raise BadBody("ACK body truncated")
        a = object.__new__(Ack)   # (the leases are tuples already: no __init__ pass)
        a.sub_id = struct.unpack_from(">I", body, 0)[0]
        a.leases = _leases_at(body, 4, "ACK")
        return a


class Nack(_Body):
    """Consumer -> broker: these leases failed; retry after ``delay_ms``
    (0 = the broker's backoff level for the delivery count)."""
    __slots__ = ("sub_id", "leases", "delay_ms", "reason")
    OPCODE = Op.NACK

    def __init__(self, sub_id, leases, delay_ms=0, reason=""):
        self.sub_id = sub_id
        self.leases = [tuple(x) for x in leases]
        self.delay_ms = delay_ms
        self.reason = reason

    def encode(self):
        return (struct.pack(">II", self.sub_id, self.delay_ms) + pack16(self.reason, "reason")
                + _pack_leases(self.leases))

    @staticmethod
    def decode(body):
        if len(body) < 10:
            raise BadBody("NACK body truncated")
        sub_id, delay_ms, rlen = struct.unpack_from(">IIH", body, 0)
        if len(body) < 10 + rlen:
            raise BadBody("NACK reason truncated")
        try:
            reason = bytes(body[10:10 + rlen]).decode()
        except UnicodeError:
            raise BadBody("NACK body has a text field that is not UTF-8")
        n = object.__new__(Nack)
        n.sub_id, n.delay_ms, n.reason = sub_id, delay_ms, reason
        n.leases = _leases_at(body, 10 + rlen, "NACK")
        return n


for _cls in (Subscribe, SubscribeAck, Unsubscribe, Notify, Pull, Messages, Ack, Nack):
    BODY_TYPES[_cls.OPCODE] = _cls
