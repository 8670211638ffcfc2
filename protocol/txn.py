# Transactional messages (SPEC "Transactional messages"): the bodies of
# TXN_PUBLISH, TXN_END and TXN_CHECK_ANSWER (one layout), TXN_CHECK and TXN_JOIN;
# TXN_PUBLISH_ACK is PUBLISH_ACK's layout (its offset is the txn id).
# A lock never sends these: the firmware does not import this module (each
# byte of the frozen protocol costs lock RAM). MicroPython subset only.
import struct

from ._constants import Op
from ._codec import Reader, pack8, pack16, check_range
from ._bodies import _Body, BODY_TYPES, PublishAck, _PUB
from ._errors import BadBody, LocalProtocolError


class TxnOutcome:
    """How a transaction ends (TXN_END, TXN_CHECK_ANSWER.outcome, u8)."""
    UNKNOWN = 0     # only in a check answer: "not decided yet, ask again later"
    COMMIT = 1
    ROLLBACK = 2


OUTCOME_NAMES = {TxnOutcome.UNKNOWN: "unknown", TxnOutcome.COMMIT: "commit",
                 TxnOutcome.ROLLBACK: "rollback"}


class TxnPublish(_Body):
    """Producer -> broker: a half message. The producer group, then PUBLISH's
    fields in PUBLISH's layout (_PUB);
    (frame SN, seq) is the id the committed message will carry."""
    __slots__ = ("group", "topic", "seq", "lock_ts_ms", "payload")
    OPCODE = Op.TXN_PUBLISH

    def __init__(self, group, topic, seq, lock_ts_ms, payload):
        self.group = group
        self.topic = topic
        self.seq = seq
        self.lock_ts_ms = lock_ts_ms
        self.payload = payload

    def encode(self):
        check_range(self.seq, 32, "seq")
        return (pack8(self.group, "group") + pack8(self.topic, "topic")
                + struct.pack(_PUB, self.seq, self.lock_ts_ms) + self.payload)

    @staticmethod
    def decode(body):
        r = Reader(body, "TXN_PUBLISH")
        group = r.str8()
        topic = r.str8()
        seq, lock_ts_ms = r.unpack(_PUB, 12)
        return TxnPublish(group, topic, seq, lock_ts_ms, r.rest())


class TxnEnd(_Body):
    """Producer -> broker: how transaction ``txn_id`` ends. The body of TXN_END
    (COMMIT or ROLLBACK; answered OK) and of TXN_CHECK_ANSWER (also UNKNOWN: "ask
    again later"; never answered)."""
    __slots__ = ("txn_id", "outcome")
    OPCODE = Op.TXN_END

    def __init__(self, txn_id, outcome):
        self.txn_id = txn_id
        self.outcome = outcome

    def encode(self):
        if self.outcome not in OUTCOME_NAMES:
            raise LocalProtocolError("outcome %r is not 0, 1 or 2" % (self.outcome,))
        return struct.pack(">QB", self.txn_id, self.outcome)

    @staticmethod
    def decode(body):
        r = Reader(body, "TXN_END")
        txn_id, outcome = r.unpack(">QB", 9)
        r.end()
        if outcome not in OUTCOME_NAMES:
            raise BadBody("TXN_END outcome %d is not 0, 1 or 2" % outcome)
        return TxnEnd(txn_id, outcome)


class TxnCheck(_Body):
    """Broker -> a producer of the group: what became of transaction ``txn_id``?
    Carries the half message so the producer can look its local transaction up."""
    __slots__ = ("txn_id", "topic", "sn", "seq", "headers", "payload")
    OPCODE = Op.TXN_CHECK

    def __init__(self, txn_id, topic, sn, seq, headers, payload):
        self.txn_id = txn_id
        self.topic = topic
        self.sn = sn
        self.seq = seq
        self.headers = headers      # UTF-8 JSON text, "" when none
        self.payload = payload

    def encode(self):
        check_range(self.seq, 32, "seq")
        return (struct.pack(">Q", self.txn_id) + pack8(self.topic, "topic")
                + pack8(self.sn, "sn") + struct.pack(">I", self.seq)
                + pack16(self.headers, "headers") + self.payload)

    @staticmethod
    def decode(body):
        r = Reader(body, "TXN_CHECK")
        txn_id = r.u64()
        topic = r.str8()
        sn = r.str8()
        seq = r.u32()
        headers = r.str16()
        return TxnCheck(txn_id, topic, sn, seq, headers, r.rest())


class TxnJoin(_Body):
    """Producer -> broker: this connection answers check-backs of ``group``
    (a restarted producer joins before it has sent anything). Answered OK."""
    __slots__ = ("group",)
    OPCODE = Op.TXN_JOIN

    def __init__(self, group):
        self.group = group

    def encode(self):
        return pack8(self.group, "group")

    @staticmethod
    def decode(body):
        r = Reader(body, "TXN_JOIN")
        group = r.str8()
        r.end()
        return TxnJoin(group)


for _cls in (TxnPublish, TxnEnd, TxnCheck, TxnJoin):
    BODY_TYPES[_cls.OPCODE] = _cls
BODY_TYPES[Op.TXN_CHECK_ANSWER] = TxnEnd
# the half message's commit-log offset is the txn id: PUBLISH_ACK's body says it
BODY_TYPES[Op.TXN_PUBLISH_ACK] = PublishAck
