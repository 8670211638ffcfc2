# Scheduled delivery bodies: PUBLISH_AT, SCHEDULE_CANCEL, COMMAND_AT, COMMAND_SCHEDULED
# (SPEC "Scheduled delivery"). Services send them, locks never do: the firmware does
# not import this module; importing it registers the bodies with decode_body().
import struct

from ._constants import Op
from ._codec import Reader, pack8, pack16, check_range
from ._bodies import _Body, BODY_TYPES

_PUB_AT = ">IQQ"     # seq, lock_ts_ms, deliver_at_ms


class PublishAt(_Body):
    """Producer -> broker: a PUBLISH held by the broker until ``deliver_at_ms`` (wall
    time, ms since the epoch), then written to ``topic``. Answered by PUBLISH_ACK
    whose ``offset`` is the schedule id (0 for a duplicate)."""
    __slots__ = ("topic", "seq", "lock_ts_ms", "deliver_at_ms", "payload")
    OPCODE = Op.PUBLISH_AT

    def __init__(self, topic, seq, lock_ts_ms, deliver_at_ms, payload):
        self.topic = topic
        self.seq = seq
        self.lock_ts_ms = lock_ts_ms
        self.deliver_at_ms = deliver_at_ms
        self.payload = payload

    def encode(self):
        check_range(self.seq, 32, "seq")
        check_range(self.deliver_at_ms, 64, "deliver_at_ms")
        return (pack8(self.topic, "topic")
                + struct.pack(_PUB_AT, self.seq, self.lock_ts_ms, self.deliver_at_ms)
                + self.payload)

    @staticmethod
    def decode(body):
        r = Reader(body, "PUBLISH_AT")
        topic = r.str8()
        seq, lock_ts_ms, deliver_at_ms = r.unpack(_PUB_AT, 20)
        return PublishAt(topic, seq, lock_ts_ms, deliver_at_ms, bytes(r.rest()))


class ScheduleCancel(_Body):
    """Sender -> broker: cancel the scheduled publish or command ``schedule_id``
    (only its sender or an admin may). Answered OK, or ERROR INVALID_ARGUMENT when
    it is unknown, already delivered or not the sender's."""
    __slots__ = ("schedule_id",)
    OPCODE = Op.SCHEDULE_CANCEL

    def __init__(self, schedule_id):
        self.schedule_id = schedule_id

    def encode(self):
        check_range(self.schedule_id, 64, "schedule_id")
        return struct.pack(">Q", self.schedule_id)

    @staticmethod
    def decode(body):
        r = Reader(body, "SCHEDULE_CANCEL")
        schedule_id = r.u64()
        r.end()
        return ScheduleCancel(schedule_id)


class CommandAt(_Body):
    """Service -> broker: a COMMAND (without MAC) that enters the command path at
    ``not_before_ms``. ``expires_ms`` 0 = the broker's default expiry counted from
    then. Answered by COMMAND_SCHEDULED."""
    __slots__ = ("target", "cmd_id", "expires_ms", "kind", "args", "not_before_ms")
    OPCODE = Op.COMMAND_AT

    def __init__(self, target, cmd_id, expires_ms, kind, args, not_before_ms):
        self.target = target
        self.cmd_id = cmd_id
        self.expires_ms = expires_ms
        self.kind = kind
        self.args = args
        self.not_before_ms = not_before_ms

    def encode(self):
        check_range(self.not_before_ms, 64, "not_before_ms")
        return (struct.pack(">Q", self.not_before_ms) + pack8(self.target, "target")
                + struct.pack(">IQB", self.cmd_id, self.expires_ms, self.kind)
                + pack16(self.args, "args"))

    @staticmethod
    def decode(body):
        r = Reader(body, "COMMAND_AT")
        not_before_ms = r.u64()
        target = r.str8()
        cmd_id, expires_ms, kind = r.unpack(">IQB", 13)
        args = bytes(r.bytes16())
        r.end()
        return CommandAt(target, cmd_id, expires_ms, kind, args, not_before_ms)


class CommandScheduled(_Body):
    """Broker -> service: COMMAND_AT ``cmd_id`` for ``target`` is stored durably as
    ``schedule_id`` (the id to cancel or list it by)."""
    __slots__ = ("target", "cmd_id", "schedule_id")
    OPCODE = Op.COMMAND_SCHEDULED

    def __init__(self, target, cmd_id, schedule_id):
        self.target = target
        self.cmd_id = cmd_id
        self.schedule_id = schedule_id

    def encode(self):
        return pack8(self.target, "target") + struct.pack(">IQ", self.cmd_id, self.schedule_id)

    @staticmethod
    def decode(body):
        r = Reader(body, "COMMAND_SCHEDULED")
        target = r.str8()
        cmd_id, schedule_id = r.unpack(">IQ", 12)
        r.end()
        return CommandScheduled(target, cmd_id, schedule_id)


for _cls in (PublishAt, ScheduleCancel, CommandAt, CommandScheduled):
    BODY_TYPES[_cls.OPCODE] = _cls
