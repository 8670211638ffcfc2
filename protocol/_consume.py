# Consumer-side bodies: subscribe, notify, pull, message batches, ack, nack.
# Kept apart from _bodies so the lock firmware, which never consumes, does not
# pay their RAM; importing this module registers them with decode_body().
import struct

from ._constants import Op
from ._codec import Reader, pack8, pack16, pack32
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
        r = Reader(body, "MESSAGES")
        sub_id, count = r.unpack(">IH", 6)
        out = []
        for _ in range(count):
            qo, delivery, seq, lock_ts_ms, broker_ts_us = r.unpack(_MSG, _MSG_SIZE)
            sn = r.str8()
            topic = r.str8()
            headers = r.bytes16()
            payload = r.bytes32()
            out.append(Message(qo, delivery, sn, seq, lock_ts_ms, broker_ts_us, topic,
                               payload, headers))
        r.end()
        return Messages(sub_id, out)


def _pack_leases(leases):
    parts = [struct.pack(">H", len(leases))]
    for queue_offset, delivery in leases:
        parts.append(struct.pack(">QH", queue_offset, delivery))
    return b"".join(parts)


def _read_leases(r):
    out = []
    for _ in range(r.u16()):
        out.append(r.unpack(">QH", 10))
    return out


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
        r = Reader(body, "ACK")
        sub_id = r.u32()
        leases = _read_leases(r)
        r.end()
        return Ack(sub_id, leases)


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
        r = Reader(body, "NACK")
        sub_id, delay_ms = r.unpack(">II", 8)
        reason = r.str16()
        leases = _read_leases(r)
        r.end()
        return Nack(sub_id, leases, delay_ms, reason)


for _cls in (Subscribe, SubscribeAck, Unsubscribe, Notify, Pull, Messages, Ack, Nack):
    BODY_TYPES[_cls.OPCODE] = _cls
