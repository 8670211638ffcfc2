# The lock-event record: the payload a lock publishes to "lock.events".
#
#   event_type u8 | method u8 | result u8 | value u16 | ts_ms u64 |
#   credential bytes8
#
# 14 bytes + credential; with an 8-byte card id, 22 bytes (the paper's
# records are 24). ``value`` depends on the type: seconds the door stayed
# open, battery percent, tamper sensor id.
import struct

from ._const import const
from ._codec import pack8
from ._errors import BadBody

# the record's fixed fields (a struct format) and their size
# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
EVENT_HEADER_SIZE = const(13)
_EVT = ">BBBHQ"
# -- end of generated protocol numbers --


class LockEvent:
    """Something that happened at a lock (see EventType, Method, Result)."""
    __slots__ = ("event_type", "method", "result", "value", "ts_ms", "credential")

    def __init__(self, event_type, ts_ms, method=0, result=0, value=0, credential=b""):
        self.event_type = event_type
        self.ts_ms = ts_ms
        self.method = method
        self.result = result
        self.value = value
        self.credential = bytes(credential)

    def encode(self):
        return struct.pack(_EVT, self.event_type, self.method, self.result, self.value,
                           self.ts_ms) + pack8(self.credential, "credential")

    @staticmethod
    def decode(payload):
        if len(payload) < EVENT_HEADER_SIZE + 1:
            raise BadBody("lock event truncated")
        etype, method, result, value, ts_ms = struct.unpack_from(_EVT, payload, 0)
        n = payload[EVENT_HEADER_SIZE]
        if len(payload) != EVENT_HEADER_SIZE + 1 + n:
            raise BadBody("lock event credential length does not match the record")
        return LockEvent(etype, ts_ms, method, result, value,
                         payload[EVENT_HEADER_SIZE + 1:])

    def __eq__(self, other):
        return isinstance(other, LockEvent) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __repr__(self):
        return "LockEvent(type=%d method=%d result=%d value=%d ts_ms=%d credential=%r)" % (
            self.event_type, self.method, self.result, self.value, self.ts_ms, self.credential)
