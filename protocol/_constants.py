# Constants of the lockmq wire format: version, limits, opcodes, flags, error codes,
# event and command kinds. GENERATED from protocol/table.py by `python scripts/gen_protocol.py`:
# edit the table, not this file (tests/protocol/test_table.py checks it).
# Plain classes of ints so the same file runs under MicroPython and CPython.

VERSION = 1                     # the version byte of every frame
HEADER_SIZE = 8                 # version u8 | length u32 | opcode u16 | sn_len u8
SUBHEADER_SIZE = 5              # flags u8 | opaque u32 (after the SN)
CRC_SIZE = 2                    # the crc16 that ends a frame
MIN_FRAME = 15                  # header + subheader + crc: empty SN, empty body
MAX_SN = 64                     # the longest SN a frame carries
DEFAULT_MAX_FRAME = 65536       # the frame limit when none is configured
HARD_MAX_FRAME = 16777216       # the frame limit no setting goes above
NONCE_SIZE = 16                 # CHALLENGE nonce and AUTH cnonce
NO_SEQ = 0xFFFFFFFF             # CONNECT_ACK.last_seq: no sequence stored yet
TAG_SIZE = 16                   # a frame MAC: HMAC-SHA256 cut to 128 bits
TO_BROKER = 0                   # frame-MAC direction byte: client -> broker
TO_CLIENT = 1


class Op:
    """Opcodes (u16). 0x0000-0x00FF core, 0x0100-0x01FF admin, 0x8000+ vendor."""
    CONNECT = 0x01              # peer → broker: CHALLENGE
    CHALLENGE = 0x02            # broker → peer: AUTH
    AUTH = 0x03                 # peer → broker: CONNECT_ACK or ERROR
    CONNECT_ACK = 0x04          # broker → peer: —
    HEARTBEAT = 0x05            # both: HEARTBEAT with RESPONSE (unless ONEWAY)
    DISCONNECT = 0x06           # both: — (the sender closes)
    OK = 0x0E                   # both: generic success answer, empty body
    ERROR = 0x0F                # both: —
    PUBLISH = 0x10              # producer → broker: PUBLISH_ACK or ERROR (none if ONEWAY)
    PUBLISH_ACK = 0x11          # broker → producer: —
    TXN_PUBLISH = 0x12
    TXN_PUBLISH_ACK = 0x13      # broker → producer: —
    TXN_END = 0x14              # producer → broker: OK or ERROR
    TXN_CHECK = 0x15            # broker → producer (push): TXN_CHECK_ANSWER
    TXN_CHECK_ANSWER = 0x16     # producer → broker: — (never answered)
    TXN_JOIN = 0x17             # producer → broker: OK or ERROR
    PUBLISH_AT = 0x18
    SCHEDULE_CANCEL = 0x19      # service → broker: OK or ERROR
    SUBSCRIBE = 0x20            # consumer → broker: SUBSCRIBE_ACK
    SUBSCRIBE_ACK = 0x21        # broker → consumer: —
    UNSUBSCRIBE = 0x22          # consumer → broker: OK
    NOTIFY = 0x23               # broker → consumer: —
    PULL = 0x24                 # consumer → broker: MESSAGES (possibly empty)
    MESSAGES = 0x25             # broker → consumer: ACK / NACK later
    ACK = 0x26                  # consumer → broker: OK (none if ONEWAY)
    NACK = 0x27                 # consumer → broker: OK (none if ONEWAY)
    COMMAND = 0x30              # service → broker → lock: COMMAND_RESULT
    COMMAND_RESULT = 0x31       # lock → broker → service: —
    COMMAND_AT = 0x32           # service → broker: COMMAND_SCHEDULED or ERROR
    COMMAND_SCHEDULED = 0x33    # broker → service: —
    FW_FETCH = 0x34             # lock → broker: FW_CHUNK or ERROR ("Firmware bundles")
    FW_CHUNK = 0x35             # broker → lock: — (a RESPONSE)
    ADMIN_REQUEST = 0x100       # admin → broker: ADMIN_RESPONSE
    ADMIN_RESPONSE = 0x101      # broker → admin: —


OP_NAMES = {
    Op.CONNECT: "CONNECT",
    Op.CHALLENGE: "CHALLENGE",
    Op.AUTH: "AUTH",
    Op.CONNECT_ACK: "CONNECT_ACK",
    Op.HEARTBEAT: "HEARTBEAT",
    Op.DISCONNECT: "DISCONNECT",
    Op.OK: "OK",
    Op.ERROR: "ERROR",
    Op.PUBLISH: "PUBLISH",
    Op.PUBLISH_ACK: "PUBLISH_ACK",
    Op.TXN_PUBLISH: "TXN_PUBLISH",
    Op.TXN_PUBLISH_ACK: "TXN_PUBLISH_ACK",
    Op.TXN_END: "TXN_END",
    Op.TXN_CHECK: "TXN_CHECK",
    Op.TXN_CHECK_ANSWER: "TXN_CHECK_ANSWER",
    Op.TXN_JOIN: "TXN_JOIN",
    Op.PUBLISH_AT: "PUBLISH_AT",
    Op.SCHEDULE_CANCEL: "SCHEDULE_CANCEL",
    Op.SUBSCRIBE: "SUBSCRIBE",
    Op.SUBSCRIBE_ACK: "SUBSCRIBE_ACK",
    Op.UNSUBSCRIBE: "UNSUBSCRIBE",
    Op.NOTIFY: "NOTIFY",
    Op.PULL: "PULL",
    Op.MESSAGES: "MESSAGES",
    Op.ACK: "ACK",
    Op.NACK: "NACK",
    Op.COMMAND: "COMMAND",
    Op.COMMAND_RESULT: "COMMAND_RESULT",
    Op.COMMAND_AT: "COMMAND_AT",
    Op.COMMAND_SCHEDULED: "COMMAND_SCHEDULED",
    Op.FW_FETCH: "FW_FETCH",
    Op.FW_CHUNK: "FW_CHUNK",
    Op.ADMIN_REQUEST: "ADMIN_REQUEST",
    Op.ADMIN_RESPONSE: "ADMIN_RESPONSE",
}


def op_name(opcode):
    """The name of an opcode, or its hex value when unknown."""
    return OP_NAMES.get(opcode, "0x%04x" % opcode)


class Flag:
    """Frame flags (u8). Reserved bits are sent as 0 and ignored on receipt."""
    ONEWAY = 1                  # the sender wants no answer (oneway publish)
    RESPONSE = 2                # this frame answers the request with the same opaque
    MAC = 4


class Role:
    """Who connects (CONNECT body)."""
    LOCK = 1                    # a lock
    SERVICE = 2                 # a service (producer, consumer)
    ADMIN = 3                   # an admin tool


class AuthMethod:
    """How a peer proves who it is (AUTH body); also a bitmask in CHALLENGE."""
    DEVICE_HMAC = 1             # a lock's device key
    TOKEN = 2                   # a service token


class ErrorCode:
    """Error codes (u16) carried by ERROR frames and by ProtocolError.code."""
    BAD_FRAME = 1               # frame length or SN length impossible; connection closed
    UNSUPPORTED_VERSION = 2     # version byte is not 1; connection closed
    FRAME_TOO_LARGE = 3         # length over the receiver's `max_frame`; connection closed
    BAD_CHECKSUM = 4            # CRC mismatch; connection closed
    UNKNOWN_OPCODE = 5          # frame skipped; the stream goes on
    BAD_BODY = 6                # body does not match its opcode's layout
    UNEXPECTED_FRAME = 7        # valid frame at the wrong moment (e.g. PULL from a lock)
    INVALID_ARGUMENT = 8        # a field value is not acceptable (bad topic name, ...)
    NOT_AUTHENTICATED = 10      # frame before CONNECT_ACK
    AUTH_FAILED = 11            # unknown SN, wrong key, bad token — deliberately the same answer
    FORBIDDEN = 12              # authenticated, but not allowed to do this
    SN_MISMATCH = 13            # a lock's frame carries another SN
    TOKEN_EXPIRED = 14          # the service token is past its expiry
    REPLAY = 15                 # a nonce or command id seen before
    AUTH_TIMEOUT = 16           # did not authenticate in time; connection closed
    BAD_MAC = 17
    BUSY = 20                   # broker cannot take it now; retry after `retry_after_ms`
    RATE_LIMITED = 21           # over a configured rate; retry after `retry_after_ms`
    TOO_MANY_CONNECTIONS = 22   # connection limit reached; retry later
    STORAGE_FULL = 23           # disk reserve reached; retry after `retry_after_ms`
    LIMIT_EXCEEDED = 24
    UNKNOWN_TOPIC = 30          # no such topic
    UNKNOWN_SUBSCRIPTION = 31   # `sub_id` not open on this connection
    UNKNOWN_LEASE = 32          # ack/nack of a lease that expired or is not yours
    INFLIGHT_LIMIT = 33         # member or cluster in-flight cap reached
    LOCK_OFFLINE = 40           # command target offline (and the command expired)
    COMMAND_EXPIRED = 41        # command past `expires_ms`
    COMMAND_FAILED = 42         # the lock ran the command and it failed
    INTERNAL = 50               # broker bug; logged
    SHUTTING_DOWN = 51          # broker is stopping; reconnect elsewhere or later


class EventType:
    """LockEvent.event_type (u8)."""
    UNLOCK = 1                  # unlock
    FAILED_ATTEMPT = 2          # failed attempt
    DOOR_LEFT_OPEN = 3          # door left open (value = seconds)
    TAMPER = 4                  # tamper (value = sensor id)
    LOW_BATTERY = 5             # low battery (value = percent)
    DOOR_OPENED = 6             # door opened
    DOOR_CLOSED = 7             # door closed
    LOCKED = 8                  # locked


class Method:
    """LockEvent.method (u8): how the lock was operated."""
    NONE = 0                    # none
    CARD = 1                    # card
    PIN = 2                     # PIN
    REMOTE = 3                  # remote
    KEY = 4                     # mechanical key
    FINGERPRINT = 5             # fingerprint


class Result:
    """LockEvent.result (u8)."""
    OK = 0                      # ok
    DENIED_UNKNOWN = 1          # denied: unknown credential
    DENIED_EXPIRED = 2          # denied: expired
    DENIED_SCHEDULE = 3         # denied: schedule
    ERROR = 4                   # error


class CommandKind:
    """COMMAND.kind (u8); the text names in protocol/table.py."""
    UNLOCK = 1                  # "unlock": seconds u16
    CARDS_SET = 2               # "cards": count u16 · count × credential bytes8
    CONFIG = 3                  # "config": UTF-8 JSON object of settings
    REBOOT = 4                  # "reboot": empty
    FW_UPDATE = 5               # "fw-update": UTF-8 JSON `{"version", "size", "sha256"}`


class CommandStatus:
    """COMMAND_RESULT.status (u8)."""
    OK = 0                      # ok
    FAILED = 1                  # failed
    REFUSED = 2                 # refused (bad MAC, replay, unauthorised)
    EXPIRED = 3                 # expired
    OFFLINE = 4
    UNSUPPORTED = 5             # unsupported
