# Constants of the lockmq wire format: version, opcodes, flags, error codes, limits.
# Plain classes of ints so the same file runs under MicroPython and CPython.

VERSION = 1

# Fixed header: version u8 | length u32 | opcode u16 | sn_len u8, then the SN,
# then flags u8 | opaque u32, then the body, then crc u16.
HEADER_SIZE = 8          # version + length + opcode + sn_len
SUBHEADER_SIZE = 5       # flags + opaque
CRC_SIZE = 2
MIN_FRAME = HEADER_SIZE + SUBHEADER_SIZE + CRC_SIZE   # 15: empty SN, empty body
MAX_SN = 64
DEFAULT_MAX_FRAME = 64 * 1024
HARD_MAX_FRAME = 16 * 1024 * 1024
NONCE_SIZE = 16
NO_SEQ = 0xFFFFFFFF      # "no sequence stored yet" in CONNECT_ACK


class Op:
    """Opcodes (u16). 0x0000-0x00FF core, 0x0100-0x01FF admin, 0x8000+ vendor."""
    CONNECT = 0x01
    CHALLENGE = 0x02
    AUTH = 0x03
    CONNECT_ACK = 0x04
    HEARTBEAT = 0x05
    DISCONNECT = 0x06
    OK = 0x0E
    ERROR = 0x0F
    PUBLISH = 0x10
    PUBLISH_ACK = 0x11
    # transactional messages (SPEC "Transactional messages"; bodies in _txn.py)
    TXN_PUBLISH = 0x12
    TXN_PUBLISH_ACK = 0x13
    TXN_END = 0x14
    TXN_CHECK = 0x15
    TXN_CHECK_ANSWER = 0x16
    TXN_JOIN = 0x17
    # scheduled delivery (protocol/_schedule.py; SPEC "Scheduled delivery")
    PUBLISH_AT = 0x18         # a publish delivered at deliver_at_ms -> PUBLISH_ACK(schedule id)
    SCHEDULE_CANCEL = 0x19    # cancel a scheduled publish or command -> OK
    SUBSCRIBE = 0x20
    SUBSCRIBE_ACK = 0x21
    UNSUBSCRIBE = 0x22
    NOTIFY = 0x23
    PULL = 0x24
    MESSAGES = 0x25
    ACK = 0x26
    NACK = 0x27
    COMMAND = 0x30
    COMMAND_RESULT = 0x31
    COMMAND_AT = 0x32         # a command that enters the command path at not_before_ms
    COMMAND_SCHEDULED = 0x33  # -> COMMAND_AT accepted: its schedule id
    # firmware update over the lock's own link (protocol/_firmware.py; SPEC "Firmware bundles")
    FW_FETCH = 0x34           # lock -> broker: a piece of a released bundle -> FW_CHUNK
    FW_CHUNK = 0x35           # broker -> lock: that piece (RESPONSE)
    ADMIN_REQUEST = 0x100
    ADMIN_RESPONSE = 0x101


OP_NAMES = {}
for _name in dir(Op):
    if not _name.startswith("_"):
        OP_NAMES[getattr(Op, _name)] = _name


def op_name(opcode):
    """The name of an opcode, or its hex value when unknown."""
    return OP_NAMES.get(opcode, "0x%04x" % opcode)


class Flag:
    """Frame flags (u8). Reserved bits are sent as 0 and ignored on receipt."""
    ONEWAY = 0x01     # the sender wants no answer (oneway publish)
    RESPONSE = 0x02   # this frame answers the request with the same opaque
    MAC = 0x04        # the body ends with a 16-byte frame tag (SPEC 2.x "Frame MACs");
                      # on CONNECT: the lock asks for frame MACs


class Role:
    """Who connects (CONNECT body)."""
    LOCK = 1
    SERVICE = 2
    ADMIN = 3


class AuthMethod:
    """How a peer proves who it is (AUTH body); also a bitmask in CHALLENGE."""
    DEVICE_HMAC = 1
    TOKEN = 2


class ErrorCode:
    """Error codes (u16) carried by ERROR frames and by ProtocolError.code."""
    BAD_FRAME = 1
    UNSUPPORTED_VERSION = 2
    FRAME_TOO_LARGE = 3
    BAD_CHECKSUM = 4
    UNKNOWN_OPCODE = 5
    BAD_BODY = 6
    UNEXPECTED_FRAME = 7
    INVALID_ARGUMENT = 8
    NOT_AUTHENTICATED = 10
    AUTH_FAILED = 11
    FORBIDDEN = 12
    SN_MISMATCH = 13
    TOKEN_EXPIRED = 14
    REPLAY = 15
    AUTH_TIMEOUT = 16
    BAD_MAC = 17      # a frame tag missing, wrong, replayed or reordered (fatal)
    BUSY = 20
    RATE_LIMITED = 21
    TOO_MANY_CONNECTIONS = 22
    STORAGE_FULL = 23
    LIMIT_EXCEEDED = 24   # a configured cap on what one peer holds; retrying won't help
    UNKNOWN_TOPIC = 30
    UNKNOWN_SUBSCRIPTION = 31
    UNKNOWN_LEASE = 32
    INFLIGHT_LIMIT = 33
    LOCK_OFFLINE = 40
    COMMAND_EXPIRED = 41
    COMMAND_FAILED = 42
    INTERNAL = 50
    SHUTTING_DOWN = 51


class EventType:
    """LockEvent.event_type (u8)."""
    UNLOCK = 1
    FAILED_ATTEMPT = 2
    DOOR_LEFT_OPEN = 3
    TAMPER = 4
    LOW_BATTERY = 5
    DOOR_OPENED = 6
    DOOR_CLOSED = 7
    LOCKED = 8


class Method:
    """LockEvent.method (u8): how the lock was operated."""
    NONE = 0
    CARD = 1
    PIN = 2
    REMOTE = 3
    KEY = 4
    FINGERPRINT = 5


class Result:
    """LockEvent.result (u8)."""
    OK = 0
    DENIED_UNKNOWN = 1
    DENIED_EXPIRED = 2
    DENIED_SCHEDULE = 3
    ERROR = 4


class CommandKind:
    """COMMAND.kind (u8)."""
    UNLOCK = 1        # args: seconds u16
    CARDS_SET = 2     # args: count u16, then credential bytes8 each
    CONFIG = 3        # args: UTF-8 JSON object of settings
    REBOOT = 4        # args: empty
    FW_UPDATE = 5     # args: UTF-8 JSON {"version": ..., "size": ..., "sha256": ...}
                      # (a bundle released to the broker; fetched with FW_FETCH)


class CommandStatus:
    """COMMAND_RESULT.status (u8)."""
    OK = 0
    FAILED = 1
    REFUSED = 2       # bad MAC, replayed or unauthorised
    EXPIRED = 3
    OFFLINE = 4       # the broker gave up: the lock stayed offline past the expiry
    UNSUPPORTED = 5
