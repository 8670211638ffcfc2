# The broker's side of the session (see _session.py for the rules and the tables).
# Kept apart so that a lock, which only ever is a client, does not load it.
import struct

from ._constants import VERSION, MIN_FRAME, NONCE_SIZE, Op, Flag, Role, AuthMethod, ErrorCode, \
    op_name
from . import _crc
from ._mac import TO_CLIENT
from ._errors import ProtocolError
from ._frame import encode_frame
from ._bodies import Connect, Auth, ErrorReply
from ._lockbodies import check_nonce, challenge_body
from ._auth import transcript_hash
from ._session import _Session, SessionError, SERVER_TABLE, CONNECTING, ESTABLISHED, fatal_error
from ._identity import check_identity

# What an authenticated client may send, by its role (decided by the broker from
# the credentials, not by what the client claimed).
_COMMON = (Op.HEARTBEAT, Op.DISCONNECT, Op.PUBLISH)
_SERVICE = _COMMON + (Op.SUBSCRIBE, Op.UNSUBSCRIBE, Op.PULL, Op.ACK, Op.NACK, Op.COMMAND,
                      # scheduled delivery (SPEC "Scheduled delivery")
                      Op.PUBLISH_AT, Op.SCHEDULE_CANCEL, Op.COMMAND_AT,
                      # transactional producers (SPEC "Transactional messages")
                      Op.TXN_PUBLISH, Op.TXN_END, Op.TXN_CHECK_ANSWER, Op.TXN_JOIN)
CLIENT_REQUESTS = {
    Role.LOCK: _COMMON + (Op.COMMAND_RESULT, Op.FW_FETCH),
    Role.SERVICE: _SERVICE,
    Role.ADMIN: _SERVICE + (Op.ADMIN_REQUEST,),
}
# ... as sets, built once (checked on every frame; shared by every session of a
# role, never written: a storm accepts 10,000 locks a second)
_ALLOWED = dict((role, set(ops)) for role, ops in CLIENT_REQUESTS.items())


def _packer(fmt):
    try:
        return struct.Struct(fmt).pack
    except AttributeError:           # MicroPython has no struct.Struct
        return lambda *values: struct.pack(fmt, *values)


# The two handshake answers of a storm of locks, each packed whole in one call (the
# broker's frames carry an empty SN): the same bytes as encode_frame(Op.CHALLENGE /
# Op.CONNECT_ACK, "", body.encode(), opaque, Flag.RESPONSE): tests/protocol/
# test_server_handshake.py checks it.
_CHALLENGE_FRAME = _packer(">BIHBBI%dsQB" % NONCE_SIZE)
_CHALLENGE_LEN = MIN_FRAME + NONCE_SIZE + 9
_CONNECT_ACK_FRAME = _packer(">BIHBBIHIQII")
_CONNECT_ACK_LEN = MIN_FRAME + 22
_CRC = _packer(">H")


def _with_crc(data):
    return data + _CRC(_crc.crc16_init(data, 0xFFFF))


def _unpacker(fmt):
    try:
        return struct.Struct(fmt).unpack_from
    except AttributeError:           # MicroPython has no struct.Struct
        return lambda buf, pos=0: struct.unpack_from(fmt, buf, pos)


_CONNECT_HEAD = _unpacker(">BHB")
_U32 = _unpacker(">I")


def decode_connect(body):
    """``Connect.decode(body)``, with the well-formed shapes read in one unpack (a storm
    of locks sends one each); anything else, and every error, goes through
    ``Connect.decode``."""
    n = len(body)
    if n >= 5:
        cl = body[4]
        if n == 5 + cl or n == 9 + cl:
            try:
                client = bytes(body[5:5 + cl]).decode()
            except UnicodeError:
                return Connect.decode(body)
            role, keepalive_s, proto_max = _CONNECT_HEAD(body, 0)
            max_frame = _U32(body, 5 + cl)[0] if n == 9 + cl else 0
            return Connect(role, keepalive_s, client, proto_max, max_frame)
    return Connect.decode(body)


def decode_auth(body):
    """``Auth.decode(body)``, a well-formed body taken apart by slicing; anything else,
    and every error, goes through ``Auth.decode``."""
    n = len(body)
    if n >= 19 and n == 19 + (body[17] << 8 | body[18]):
        return Auth(body[0], body[1:17], body[19:])
    return Auth.decode(body)


STATE_NAMES = ("CONNECTING", "CHALLENGED", "ESTABLISHED", "CLOSING")
ROLE_NAMES = {Role.LOCK: "lock", Role.SERVICE: "service", Role.ADMIN: "admin"}


class ServerSession(_Session):
    """The broker's side of one connection.

    Feed every decoded frame to :meth:`receive`; it returns the frame when the rules
    allow it (a CONNECT or AUTH decoded into :attr:`connect` / :attr:`auth`) and raises
    :class:`SessionError` otherwise. Answer the handshake with :meth:`challenge`,
    then :meth:`accept` or :meth:`refuse`; each returns the bytes to send. After
    that, encode every frame with :meth:`seal`.

    A CONNECT flagged MAC asks for frame MACs (:attr:`mac_wanted`); only a device-key
    AUTH can have them, and :meth:`accept` then needs the session key.
    """

    _OUT = TO_CLIENT
    _TABLE = SERVER_TABLE

    def __init__(self):
        _Session.__init__(self)
        self.connect = None    # the decoded CONNECT body
        self.auth = None       # the decoded AUTH body, until accepted or refused
        self._allowed = ()     # the requests the granted role may send (set by accept)
        self.mac_wanted = False

    def _failed(self, exc):
        # an action raised ``exc``: a fatal one ends the session
        if exc.fatal:
            self._process(None)

    def state_name(self):
        """The state's name, for logs."""
        return STATE_NAMES[self.state]

    def unknown_opcode(self, exc):
        """The decoder skipped a frame with an unknown opcode (``exc``): the error to
        answer. Fatal before the handshake is done (an unauthenticated peer gets one
        answer, never a stream of them), and in a session with frame MACs (a frame
        whose tag cannot be checked is a session violation: BAD_MAC, no tagged answer);
        otherwise the frame is just refused."""
        if self.state != ESTABLISHED:
            err = fatal_error("%s before authentication" % exc.message, ErrorCode.NOT_AUTHENTICATED)
        elif self.mac_key is not None:
            err = fatal_error("%s in a session with frame MACs: its tag cannot be checked"
                              % exc.message, ErrorCode.BAD_MAC)
        else:
            return SessionError(exc.message, exc.code, False)
        self._failed(err)
        return err

    def receive(self, frame):
        op = frame.opcode
        state = self.state
        try:
            self._process(op)       # SERVER_TABLE: the next state, or the refusal
            if state == ESTABLISHED:
                self._established(frame)
            elif op == Op.CONNECT:
                self._on_connect(frame)
            elif op == Op.AUTH:
                self._on_auth(frame)
        except ProtocolError as e:
            self._failed(e)
            raise
        return frame

    def _established(self, frame):
        # the rules of the granted role for one request
        self._open(frame)       # frame MACs: fatal BAD_MAC before anything else
        op = frame.opcode
        if op not in self._allowed:
            # another role's request is a matter of rights; anything else is no
            # request at all
            admin_only = op in CLIENT_REQUESTS[Role.ADMIN]
            raise SessionError("%s is not a request a %s may send%s" % (
                op_name(op), ROLE_NAMES.get(self.role, "client"),
                " (it needs a token with the admin right)" if admin_only else ""),
                ErrorCode.FORBIDDEN if admin_only else ErrorCode.UNEXPECTED_FRAME, False)
        sn = frame.sn
        if sn and sn != self.name:
            if not (op == Op.PUBLISH and self.role == Role.ADMIN):
                raise fatal_error("%s %s sent a frame claiming %r" % (
                    ROLE_NAMES.get(self.role, "client"), self.name, sn), ErrorCode.SN_MISMATCH)
            try:     # an admin's producer id: still an id (never "$broker")
                check_identity(sn, "producer id")
            except SessionError as e:
                e.fatal = False
                raise

    def _on_connect(self, frame):
        c = decode_connect(frame.body)
        if c.role not in CLIENT_REQUESTS:
            raise fatal_error("unknown role %d" % c.role, ErrorCode.INVALID_ARGUMENT)
        sn = frame.sn
        if sn or c.role == Role.LOCK:
            check_identity(sn, "lock SN" if c.role == Role.LOCK else "client id")
        self.connect = c
        self.role = c.role
        self.name = sn
        self.mac_wanted = bool(frame.flags & Flag.MAC)
        self._cflags = frame.flags      # the transcript covers them as received
        self._cbody = bytes(frame.body)

    def _on_auth(self, frame):
        if self.auth is not None or not self.nonce:
            raise fatal_error("AUTH before CHALLENGE or twice", ErrorCode.UNEXPECTED_FRAME)
        self.auth = decode_auth(frame.body)
        self.cnonce = self.auth.cnonce
        if self.mac_wanted and self.auth.method != AuthMethod.DEVICE_HMAC:
            raise fatal_error("frame MACs need a device key (AUTH method 1)", ErrorCode.INVALID_ARGUMENT)

    def challenge(self, nonce, server_time_ms, opaque, methods=3, broker_id=""):
        """The CHALLENGE answering the CONNECT just received (``nonce``: fresh, random;
        ``broker_id``: this broker's name, sent when set). Fixes :attr:`transcript`, which
        the AUTH's proof and the session key must cover (``lockmq.protocol._auth``)."""
        self.nonce = nonce = check_nonce(nonce, "nonce")
        body = challenge_body(nonce, server_time_ms, methods, broker_id)
        self.transcript = transcript_hash(self.name, self._cflags, self._cbody, body)
        if broker_id:
            return encode_frame(Op.CHALLENGE, "", body, opaque, Flag.RESPONSE)
        return _with_crc(_CHALLENGE_FRAME(VERSION, _CHALLENGE_LEN, Op.CHALLENGE, 0, Flag.RESPONSE,
                                          opaque, nonce, server_time_ms, methods))

    def accept(self, role, name, ack, opaque, mac_key=None, mac_required=False):
        """Authentication succeeded as ``role`` / ``name`` (the broker's decision, which
        may differ from the claim): return the CONNECT_ACK ``ack`` to send.

        ``mac_key``: the session key (``session_key(device key, nonce, cnonce, sn,
        transcript)``),
        needed when the lock asked for frame MACs; the CONNECT_ACK is then the first
        tagged frame, which also proves to the lock that the broker knows its key.
        ``mac_required`` (the broker's policy on plain TCP): a lock that did not ask
        for frame MACs is refused (fatal BAD_MAC)."""
        try:
            if mac_required and role == Role.LOCK and not self.mac_wanted:
                raise fatal_error("this broker requires frame MACs from locks on plain TCP: "
                                  "set the MAC flag on CONNECT, or use TLS", ErrorCode.BAD_MAC)
            if self.mac_wanted and not mac_key:
                raise ProtocolError("frame MACs asked for but no session key given")
            self._process(-Op.CONNECT_ACK)     # SERVER_TABLE: CHALLENGED -> ESTABLISHED
        except ProtocolError as e:
            self._failed(e)
            raise
        self.role = role
        self._allowed = _ALLOWED[role]   # (shared, read only)
        self.name = name
        self.auth = None
        if self.mac_wanted:
            self.mac_key = bytes(mac_key)
        if self.mac_key is not None:
            return self.seal(Op.CONNECT_ACK, "", ack.encode(), opaque, Flag.RESPONSE)
        return _with_crc(_CONNECT_ACK_FRAME(
            VERSION, _CONNECT_ACK_LEN, Op.CONNECT_ACK, 0, Flag.RESPONSE, opaque, ack.heartbeat_s,
            ack.max_frame, ack.server_time_ms, ack.last_seq, ack.session_id))

    def refuse(self, code, message, opaque, retry_after_ms=0):
        """Authentication failed: the ERROR to send before closing."""
        self._process(None)
        return error_frame(code, message, opaque, retry_after_ms)


def error_frame(code, message, opaque=0, retry_after_ms=0):
    """An ERROR frame (answering ``opaque`` when it is not 0)."""
    return encode_frame(Op.ERROR, "", ErrorReply(code, message[:1000], retry_after_ms).encode(),
                        opaque, Flag.RESPONSE if opaque else 0)
