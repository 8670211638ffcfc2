# The body layouts a lock uses, as functions of its half only: the bodies it sends
# (CONNECT, AUTH, HEARTBEAT, PUBLISH, COMMAND_RESULT) are built from their fields and
# the ones it receives (CHALLENGE, CONNECT_ACK, ERROR, PUBLISH_ACK, COMMAND) read into
# a tuple of fields. The body classes of _bodies.py (host, tests) encode and decode
# these layouts through the same functions, so each is written once (SPEC.md has them
# byte by byte); a lock imports only this module: eleven classes with both halves
# took ~2.5 KiB of its heap, these functions a few hundred bytes.
import struct

from ._const import const
from ._codec import Reader, pack8, pack16, check_range
from ._errors import LocalProtocolError

# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
_NONCE_SIZE = const(16)
# -- end of generated protocol numbers --
PUBLISH_HEAD = ">IQ"          # PUBLISH: seq u32 | lock_ts_ms u64, after the topic


def check_nonce(nonce, what):
    """A nonce must be NONCE_SIZE bytes: LocalProtocolError otherwise."""
    if len(nonce) != _NONCE_SIZE:
        raise LocalProtocolError("%s must be %d bytes" % (what, _NONCE_SIZE))
    return bytes(nonce)


def connect_body(role, keepalive_s, client, proto_max, max_frame):
    """CONNECT: role u8 | keepalive_s u16 | proto_max u8 | client str8 [| max_frame u32]."""
    out = struct.pack(">BHB", role, keepalive_s, proto_max) + pack8(client, "client")
    if max_frame:
        check_range(max_frame, 32, "max_frame")
        out += struct.pack(">I", max_frame)
    return out


def challenge_body(nonce, server_time_ms, methods, broker_id=""):
    """CHALLENGE: nonce (16) | server_time_ms u64 | methods u8 [| broker_id str8]."""
    out = check_nonce(nonce, "nonce") + struct.pack(">QB", server_time_ms, methods)
    if broker_id:
        out += pack8(broker_id, "broker_id")
    return out


def challenge_fields(body):
    """CHALLENGE -> (nonce, server_time_ms, methods, broker_id); ``broker_id`` is the
    optional trailing str8 ("" when absent)."""
    r = Reader(body, "CHALLENGE")
    nonce = bytes(r.take(_NONCE_SIZE))
    server_time_ms, methods = r.unpack(">QB", 9)
    broker_id = r.str8() if r.pos < len(body) else ""
    r.end()
    return nonce, server_time_ms, methods, broker_id


def auth_body(method, cnonce, proof):
    """AUTH: method u8 | cnonce (16) | proof bytes16."""
    return struct.pack(">B", method) + check_nonce(cnonce, "client nonce") + pack16(proof, "proof")


def connect_ack_fields(body):
    """CONNECT_ACK -> (heartbeat_s, max_frame, server_time_ms, last_seq, session_id)."""
    r = Reader(body, "CONNECT_ACK")
    fields = r.unpack(">HIQII", 22)
    r.end()
    return fields


def heartbeat_body(ts_ms, uptime_s, queued, dropped, battery_pct, free_heap):
    """HEARTBEAT: ts_ms u64 | uptime_s u32 | queued u32 | dropped u32 | battery u8 | heap u32."""
    return struct.pack(">QIIIBI", ts_ms, uptime_s, queued, dropped, battery_pct, free_heap)


def error_fields(body):
    """ERROR -> (code, message, retry_after_ms)."""
    r = Reader(body, "ERROR")
    code, retry_after_ms = r.unpack(">HI", 6)
    message = r.str16()
    r.end()
    return code, message, retry_after_ms


def publish_body(topic, seq, lock_ts_ms, payload):
    """PUBLISH: topic str8 | seq u32 | lock_ts_ms u64 | payload (the rest)."""
    check_range(seq, 32, "seq")
    return pack8(topic, "topic") + struct.pack(PUBLISH_HEAD, seq, lock_ts_ms) + payload


def publish_ack_fields(body):
    """PUBLISH_ACK -> (status, offset)."""
    r = Reader(body, "PUBLISH_ACK")
    fields = r.unpack(">BQ", 9)
    r.end()
    return fields


def command_fields(body):
    """COMMAND -> (target, cmd_id, expires_ms, kind, args, mac)."""
    r = Reader(body, "COMMAND")
    target = r.str8()
    cmd_id, expires_ms, kind = r.unpack(">IQB", 13)
    args = r.bytes16()
    mac = r.bytes8()
    r.end()
    return target, cmd_id, expires_ms, kind, args, mac


def command_result_body(target, cmd_id, status, detail):
    """COMMAND_RESULT: target str8 | cmd_id u32 | status u8 | detail str16."""
    return pack8(target, "target") + struct.pack(">IB", cmd_id, status) + pack16(detail, "detail")


class LockAck:
    """A lock's CONNECT_ACK: the fields only (the host's session keeps a _bodies.ConnectAck)."""
    __slots__ = ("heartbeat_s", "max_frame", "server_time_ms", "last_seq", "session_id")

    def __init__(self, heartbeat_s, max_frame, server_time_ms, last_seq, session_id):
        self.heartbeat_s = heartbeat_s
        self.max_frame = max_frame
        self.server_time_ms = server_time_ms
        self.last_seq = last_seq
        self.session_id = session_id
