# Body layouts, one class per opcode. Each has encode() -> bytes and a
# static decode(body) that raises BadBody on a malformed body. Layouts are
# documented byte by byte in SPEC.md.
import json
import struct

from ._constants import Op, VERSION, NONCE_SIZE, NO_SEQ
from ._codec import Reader, pack8, pack16
from ._errors import BadBody
from ._lockbodies import (PUBLISH_HEAD, check_nonce, connect_body, challenge_body,
                          challenge_fields, auth_body, connect_ack_fields, heartbeat_body, error_fields, publish_body,
                          publish_ack_fields, command_fields, command_result_body)

__all__ = []


class _Body:
    __slots__ = ()

    def __eq__(self, other):
        return type(self) is type(other) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % (k, getattr(self, k)) for k in self.__slots__))


class Connect(_Body):
    """Peer -> broker: who is connecting. Frame SN = lock SN or client id.

    ``max_frame`` is the largest frame the peer can receive (an optional trailing
    u32: 0 = not stated, the field is then left out and the broker assumes its
    default for the role). A lock states it so that the broker never forwards a
    command the lock's decoder would refuse (SPEC §4, §7)."""
    __slots__ = ("role", "keepalive_s", "client", "proto_max", "max_frame")
    OPCODE = Op.CONNECT

    def __init__(self, role, keepalive_s=30, client="", proto_max=VERSION, max_frame=0):
        self.role = role
        self.keepalive_s = keepalive_s
        self.client = client
        self.proto_max = proto_max
        self.max_frame = max_frame

    def encode(self):
        return connect_body(self.role, self.keepalive_s, self.client, self.proto_max, self.max_frame)

    @staticmethod
    def decode(body):
        r = Reader(body, "CONNECT")
        role, keepalive_s, proto_max = r.unpack(">BHB", 4)
        client = r.str8()
        # the one optional field: absent (older peers) or exactly a u32
        max_frame = r.u32() if r.pos < len(body) else 0
        r.end()
        return Connect(role, keepalive_s, client, proto_max, max_frame)


class Challenge(_Body):
    """Broker -> peer: a fresh single-use nonce to sign, and the broker's id (optional)."""
    __slots__ = ("nonce", "server_time_ms", "methods", "broker_id")
    OPCODE = Op.CHALLENGE

    def __init__(self, nonce, server_time_ms, methods=3, broker_id=""):
        self.nonce = check_nonce(nonce, "nonce")
        self.server_time_ms = server_time_ms
        self.methods = methods
        self.broker_id = broker_id

    def encode(self):
        return challenge_body(self.nonce, self.server_time_ms, self.methods, self.broker_id)

    @staticmethod
    def decode(body):
        return Challenge(*challenge_fields(body))


class Auth(_Body):
    """Peer -> broker: the answer to a challenge (HMAC proof or token)."""
    __slots__ = ("method", "cnonce", "proof")
    OPCODE = Op.AUTH

    def __init__(self, method, cnonce, proof):
        self.method = method
        self.cnonce = check_nonce(cnonce, "client nonce")
        self.proof = bytes(proof)

    def encode(self):
        return auth_body(self.method, self.cnonce, self.proof)

    @staticmethod
    def decode(body):
        r = Reader(body, "AUTH")
        method = r.u8()
        cnonce = bytes(r.take(NONCE_SIZE))
        proof = r.bytes16()
        r.end()
        return Auth(method, cnonce, proof)


class ConnectAck(_Body):
    """Broker -> peer: the session is open, with its parameters."""
    __slots__ = ("heartbeat_s", "max_frame", "server_time_ms", "last_seq", "session_id")
    OPCODE = Op.CONNECT_ACK

    def __init__(self, heartbeat_s, max_frame, server_time_ms, last_seq=NO_SEQ, session_id=0):
        self.heartbeat_s = heartbeat_s
        self.max_frame = max_frame
        self.server_time_ms = server_time_ms
        self.last_seq = last_seq
        self.session_id = session_id

    def encode(self):
        return struct.pack(">HIQII", self.heartbeat_s, self.max_frame, self.server_time_ms,
                           self.last_seq, self.session_id)

    @staticmethod
    def decode(body):
        return ConnectAck(*connect_ack_fields(body))


class Heartbeat(_Body):
    """Liveness plus the lock's health; an empty body is allowed (services)."""
    __slots__ = ("ts_ms", "uptime_s", "queued", "dropped", "battery_pct", "free_heap")
    OPCODE = Op.HEARTBEAT

    def __init__(self, ts_ms=0, uptime_s=0, queued=0, dropped=0, battery_pct=255, free_heap=0):
        self.ts_ms = ts_ms
        self.uptime_s = uptime_s
        self.queued = queued
        self.dropped = dropped
        self.battery_pct = battery_pct
        self.free_heap = free_heap

    def encode(self):
        return heartbeat_body(self.ts_ms, self.uptime_s, self.queued, self.dropped,
                              self.battery_pct, self.free_heap)

    @staticmethod
    def decode(body):
        if not body:
            return Heartbeat()
        r = Reader(body, "HEARTBEAT")
        fields = r.unpack(">QIIIBI", 25)
        r.end()
        return Heartbeat(*fields)


class Disconnect(_Body):
    """Either side: I am closing, and why."""
    __slots__ = ("code", "message")
    OPCODE = Op.DISCONNECT

    def __init__(self, code=0, message=""):
        self.code = code
        self.message = message

    def encode(self):
        return struct.pack(">H", self.code) + pack16(self.message, "message")

    @staticmethod
    def decode(body):
        r = Reader(body, "DISCONNECT")
        code = r.u16()
        message = r.str16()
        r.end()
        return Disconnect(code, message)


class ErrorReply(_Body):
    """An error, as an answer (RESPONSE flag, same opaque) or unsolicited."""
    __slots__ = ("code", "retry_after_ms", "message")
    OPCODE = Op.ERROR

    def __init__(self, code, message="", retry_after_ms=0):
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms

    def encode(self):
        return struct.pack(">HI", self.code, self.retry_after_ms) + pack16(self.message, "message")

    @staticmethod
    def decode(body):
        return ErrorReply(*error_fields(body))


_PUB = PUBLISH_HEAD


class Publish(_Body):
    """Producer -> broker: one message. (frame SN, seq) is its global id."""
    __slots__ = ("topic", "seq", "lock_ts_ms", "payload")
    OPCODE = Op.PUBLISH

    def __init__(self, topic, seq, lock_ts_ms, payload):
        self.topic = topic
        self.seq = seq
        self.lock_ts_ms = lock_ts_ms
        self.payload = payload

    def encode(self):
        return publish_body(self.topic, self.seq, self.lock_ts_ms, self.payload)

    @staticmethod
    def decode(body):
        n = body[0] if body else 0
        if len(body) < 13 + n:
            raise BadBody("PUBLISH body truncated")
        seq, lock_ts_ms = struct.unpack_from(_PUB, body, 1 + n)
        try:
            topic = bytes(body[1:1 + n]).decode()
        except UnicodeError:
            raise BadBody("PUBLISH topic is not UTF-8")
        return Publish(topic, seq, lock_ts_ms, bytes(body[13 + n:]))


class PublishAck(_Body):
    """Broker -> producer: stored (status 0) or already stored (1, duplicate)."""
    __slots__ = ("status", "offset")
    OPCODE = Op.PUBLISH_ACK
    STORED = 0
    DUPLICATE = 1

    def __init__(self, status, offset):
        self.status = status
        self.offset = offset

    def encode(self):
        return struct.pack(">BQ", self.status, self.offset)

    @staticmethod
    def decode(body):
        return PublishAck(*publish_ack_fields(body))


class Command(_Body):
    """A downlink command. Service -> broker with an empty ``mac``; broker ->
    lock with ``mac`` = command_mac(device key, ...), which the lock checks,
    together with the expiry and a ``cmd_id`` higher than the last it ran."""
    __slots__ = ("target", "cmd_id", "expires_ms", "kind", "args", "mac")
    OPCODE = Op.COMMAND

    def __init__(self, target, cmd_id, expires_ms, kind, args=b"", mac=b""):
        self.target = target
        self.cmd_id = cmd_id
        self.expires_ms = expires_ms
        self.kind = kind
        self.args = args
        self.mac = mac

    def encode(self):
        return (pack8(self.target, "target") + struct.pack(">IQB", self.cmd_id, self.expires_ms, self.kind)
                + pack16(self.args, "args") + pack8(self.mac, "mac"))

    @staticmethod
    def decode(body):
        return Command(*command_fields(body))


class CommandResult(_Body):
    """Lock -> broker -> sender: what became of a command."""
    __slots__ = ("target", "cmd_id", "status", "detail")
    OPCODE = Op.COMMAND_RESULT

    def __init__(self, target, cmd_id, status, detail=""):
        self.target = target
        self.cmd_id = cmd_id
        self.status = status
        self.detail = detail

    def encode(self):
        return command_result_body(self.target, self.cmd_id, self.status, self.detail)

    @staticmethod
    def decode(body):
        r = Reader(body, "COMMAND_RESULT")
        target = r.str8()
        cmd_id, status = r.unpack(">IB", 5)
        detail = r.str16()
        r.end()
        return CommandResult(target, cmd_id, status, detail)


def encode_json(obj):
    """ADMIN_REQUEST / ADMIN_RESPONSE body: a UTF-8 JSON object."""
    return json.dumps(obj).encode()


def decode_json(body):
    try:
        obj = json.loads(bytes(body).decode())
    except (ValueError, UnicodeError):
        raise BadBody("admin body is not UTF-8 JSON")
    if not isinstance(obj, dict):
        raise BadBody("admin body must be a JSON object")
    return obj


BODY_TYPES = {}
for _cls in (Connect, Challenge, Auth, ConnectAck, Heartbeat, Disconnect, ErrorReply, Publish,
             PublishAck, Command, CommandResult):
    BODY_TYPES[_cls.OPCODE] = _cls


def decode_body(opcode, body):
    """Decode a frame body by opcode: a body object, a dict (admin), or b"" (OK).

    Consumer-side bodies are known once ``_consume`` is imported (always on
    CPython; the lock firmware does not need them and saves the RAM).
    """
    cls = BODY_TYPES.get(opcode)
    if cls is not None:
        return cls.decode(body)
    if opcode in (Op.ADMIN_REQUEST, Op.ADMIN_RESPONSE):
        return decode_json(body)
    if opcode == Op.OK:
        return body
    raise BadBody("no body layout for opcode 0x%04x" % opcode)
