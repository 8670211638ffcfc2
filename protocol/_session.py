# The session: every rule of a connection's life in one place, as tables.
#
# A connection goes CONNECTING -> CHALLENGED -> ESTABLISHED -> CLOSING. Which frames
# each party may send in each state, which identities nobody may claim, and what a
# violation answers (an ErrorCode, and whether the connection closes) are written
# here once. The broker, the client library, the lock firmware, the simulator and
# the test peer all feed frames to a Session and act on what it says; none of them
# re-implements these rules. Sans-IO: no sockets, clocks or randomness -- the
# caller passes nonces in. Runs unchanged under MicroPython (small tables, no re).
import sys

from ._const import const
from ._errors import ProtocolError
from ._frame import encode_frame, op_name
from ._lockbodies import (connect_body, challenge_fields, auth_body, connect_ack_fields,
                          error_fields)
from ._auth import auth_proof, transcript_hash

if sys.implementation.name == "micropython":
    from ._lockbodies import LockAck as _Ack     # a lock holds no body classes (_lockbodies.py)
else:
    from ._bodies import ConnectAck as _Ack

# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
_AUTH_DEVICE_HMAC = const(1)
_E_AUTH_FAILED = const(11)
_E_BAD_MAC = const(17)
_E_NOT_AUTHENTICATED = const(10)
_E_UNEXPECTED_FRAME = const(7)
_FLAG_MAC = const(4)
_FLAG_RESPONSE = const(2)
_OP_AUTH = const(0x03)
_OP_CHALLENGE = const(0x02)
_OP_COMMAND = const(0x30)
_OP_CONNECT = const(0x01)
_OP_CONNECT_ACK = const(0x04)
_OP_DISCONNECT = const(0x06)
_OP_ERROR = const(0x0F)
_OP_HEARTBEAT = const(0x05)
_OP_NOTIFY = const(0x23)
_OP_TXN_CHECK = const(0x15)
_VERSION = const(1)
# -- end of generated protocol numbers --

CONNECTING = 0    # before CONNECT (broker) / CONNECT sent (client)
CHALLENGED = 1    # CHALLENGE sent, waiting for AUTH / AUTH sent, waiting for CONNECT_ACK
ESTABLISHED = 2   # authenticated: requests and answers
CLOSING = 3       # an error or DISCONNECT ended it: nothing more is accepted

# The transitions, as h11's _state.py keeps them: for each side, one row per state
# (indexed by the state's number), each row
#
#     ((event, next state), ...), what a frame received with no move here gets
#
# An event is the opcode of a frame received, or minus the opcode of a frame this side
# sends. A frame with no move in its state keeps the state when the row says None
# (ESTABLISHED: the role's rules below decide) and is otherwise refused with the row's
# (ErrorCode, message), fatally. A fatal error and the end of the connection move every
# state to CLOSING. _Session._process is the only code that writes ``state``.
# (Numbers, not names, for the next states: the tables are then constants, frozen
# into a lock's flash with its code, and take none of its heap.)
#: The client's side (a lock, a service, an admin tool): the broker's frames.
CLIENT_TABLE = (
    # 0 CONNECTING (our CONNECT sent): the CHALLENGE, or the broker's refusal
    (((-_OP_CONNECT, 0), (_OP_CHALLENGE, 1), (_OP_ERROR, 3), (_OP_DISCONNECT, 3)),
     (_E_UNEXPECTED_FRAME, "expected CHALLENGE, got %s")),
    # 1 CHALLENGED (our AUTH sent): the CONNECT_ACK, or the broker's refusal
    (((_OP_CONNECT_ACK, 2), (_OP_ERROR, 3), (_OP_DISCONNECT, 3)),
     (_E_UNEXPECTED_FRAME, "expected CONNECT_ACK, got %s")),
    # 2 ESTABLISHED: answers and the role's BROKER_PUSHES; an ERROR answers a request
    (((_OP_DISCONNECT, 3),), None),
    # 3 CLOSING: the broker's last word, if any
    (((_OP_ERROR, 3), (_OP_DISCONNECT, 3)), (_E_UNEXPECTED_FRAME, "the session is closed: %s")),
)
#: The broker's side: the client's frames (what a role may request once established is
#: _server_session.CLIENT_REQUESTS).
SERVER_TABLE = (
    # 0 CONNECTING: the CONNECT (unauthenticated: anything else is one answer, then close)
    (((_OP_CONNECT, 1), (_OP_DISCONNECT, 3)),
     (_E_NOT_AUTHENTICATED, "expected CONNECT, got %s")),
    # 1 CHALLENGED (our CHALLENGE sent): the AUTH; our CONNECT_ACK (accept) establishes it
    (((_OP_AUTH, 1), (-_OP_CONNECT_ACK, 2), (_OP_DISCONNECT, 3)),
     (_E_NOT_AUTHENTICATED, "expected AUTH, got %s")),
    # 2 ESTABLISHED: the requests of the role granted
    (((_OP_DISCONNECT, 3),), None),
    # 3 CLOSING
    ((), (_E_UNEXPECTED_FRAME, "the session is closing: %s")),
)

# What the broker may send without being asked (frames without the RESPONSE flag),
# by the client's role (indexed by it); every other broker frame must answer a request.
BROKER_PUSHES = (
    (),
    (_OP_COMMAND, _OP_DISCONNECT, _OP_ERROR, _OP_HEARTBEAT),                    # lock
    (_OP_NOTIFY, _OP_DISCONNECT, _OP_ERROR, _OP_HEARTBEAT, _OP_TXN_CHECK),      # service
    (_OP_NOTIFY, _OP_DISCONNECT, _OP_ERROR, _OP_HEARTBEAT, _OP_TXN_CHECK),      # admin
)


class SessionError(ProtocolError):
    """A frame the session's rules do not allow now.

    ``code`` is the ErrorCode to answer with; ``fatal`` says whether the connection
    must close after that answer.
    """

    def __init__(self, message, code, fatal=True, retry_after_ms=0):
        ProtocolError.__init__(self, message, code)
        self.fatal = fatal
        self.retry_after_ms = retry_after_ms


def fatal_error(message, code):
    """A SessionError that closes the connection."""
    return SessionError(message, code, True)


class _Session:
    _OUT = 0               # direction byte of the frames this side seals (_mac.TO_BROKER)
    _TABLE = CLIENT_TABLE  # this side's transitions

    def __init__(self):
        self.state = CONNECTING
        self.role = 0          # the role in effect (claimed, then granted by the broker)
        self.name = ""         # the identity in effect (lock SN or client id)
        self.nonce = b""       # the broker's challenge nonce
        self.cnonce = b""      # the client's nonce
        self.mac_key = None    # frame-MAC session key once MACs are on (_mac.py)
        self.transcript = b""  # hash of what the handshake agreed (_auth.transcript_hash)
        self._cflags = 0       # the CONNECT's flags and body, as sent / received
        self._cbody = b""
        self.tx = 0            # frames sealed / opened so far: the tags' counters
        self.rx = 0

    def _process(self, event):
        """The one writer of ``state``: the move ``event`` makes by this side's table.

        ``event``: the opcode of a frame received, minus the opcode of one this side
        sends, or None: the session ends (a fatal error, or the connection closed),
        which moves every state to CLOSING. A frame received with no move in this state
        keeps an ESTABLISHED session as it is and is refused anywhere else: a fatal
        SessionError, raised before anything changes (the caller's ``except`` then
        ends the session: ``_process(None)``)."""
        if event is None:
            self.state = CLOSING
            return
        moves, refusal = self._TABLE[self.state]
        for ev, nxt in moves:
            if ev == event:
                self.state = nxt
                return
        if event < 0:
            raise ProtocolError("cannot send %s in state %d" % (op_name(-event), self.state))
        if refusal is not None:
            raise fatal_error(refusal[1] % op_name(event), refusal[0])

    def close(self):
        """The connection is ending: accept nothing more."""
        self._process(None)

    def seal(self, opcode, sn, body, opaque=0, flags=0):
        """Encode a frame to send: with frame MACs on, flag MAC and append its tag."""
        if self.mac_key is None:
            return encode_frame(opcode, sn, body, opaque, flags)
        if _seal is None:
            _load_macs()
        return _seal(self, opcode, sn, body, opaque, flags)

    def _open(self, frame):
        # frame MACs: check and strip the tag, or raise (BAD_MAC, fatal: the caller
        # then ends the session)
        if self.mac_key is not None or frame.flags & _FLAG_MAC:
            if _open_frame is None:
                _load_macs()
            _open_frame(self, frame)


# _mac.py's seal and open_frame, loaded when a session first uses frame MACs (a lock
# on TLS never has it in RAM), then called without an import statement each frame
_seal = None
_open_frame = None


def _load_macs():
    global _seal, _open_frame
    from ._mac import seal, open_frame
    _seal = seal
    _open_frame = open_frame


class ClientSession(_Session):
    """A lock's, service's or admin tool's side of one connection.

    ``connect_frame()`` opens it; feed the broker's frames to :meth:`receive`, which
    returns the bytes to send next during the handshake (the AUTH answering the
    CHALLENGE) or None, and raises :class:`SessionError` when the broker refused
    (its ErrorCode) or broke the rules. ``ack`` holds the CONNECT_ACK once the
    state is ESTABLISHED. Encode every frame after that with :meth:`seal`.

    Pipelining: once :meth:`receive` has returned the AUTH, requests may follow it at
    once, sealed with :meth:`seal` (in the same write): the broker reads them after the
    AUTH and only if it accepted it (SPEC 2, "Pipelined requests"). Their answers come
    after the CONNECT_ACK. A lock whose sequence numbers are not confirmed yet waits
    for the CONNECT_ACK's ``last_seq`` instead.

    ``mac=True`` (a lock with its device key, on plain TCP) asks for frame MACs:
    the broker must confirm with a tagged CONNECT_ACK, else the session fails
    (BAD_MAC) -- an on-path attacker cannot strip the request. The AUTH proof and the
    session key cover the session transcript (the CONNECT and the CHALLENGE as this
    side saw them), so any byte an on-path party changes fails the handshake.

    ``broker_id``: the broker this client expects; a CHALLENGE naming another (or
    none) is refused before any proof is sent (AUTH_FAILED, fatal). Empty: not pinned.
    """

    def __init__(self, role, name, method, secret, client="", keepalive_s=30, max_frame=0,
                 mac=False, broker_id=""):
        _Session.__init__(self)
        self.mac = bool(mac) and method == _AUTH_DEVICE_HMAC
        self.role = role
        self.name = name
        self.method = method
        self.secret = bytes(secret or b"")
        self.client = client
        self.keepalive_s = keepalive_s
        self.max_frame = max_frame     # the largest frame we can receive (0: not stated)
        self.broker_id = broker_id or ""
        self.ack = None

    def connect_frame(self, opaque=1):
        """The CONNECT that starts the session."""
        self._process(-_OP_CONNECT)
        self._cflags = _FLAG_MAC if self.mac else 0
        self._cbody = connect_body(self.role, self.keepalive_s, self.client, _VERSION,
                                   self.max_frame)
        return encode_frame(_OP_CONNECT, self.name, self._cbody, opaque, self._cflags)

    def receive(self, frame, cnonce=None, opaque=2):
        """Check one broker frame; during the handshake return what to send next.

        ``cnonce`` (16 random bytes) is needed when the frame may be a CHALLENGE.
        """
        op = frame.opcode
        state = self.state
        try:
            self._process(op)        # CLIENT_TABLE: the next state, or the refusal
            if op == _OP_ERROR and state != ESTABLISHED:
                code, message, retry_after_ms = error_fields(frame.body)
                raise SessionError(message or "refused", code, True, retry_after_ms)
            if op == _OP_DISCONNECT:
                return None
            if state == ESTABLISHED:
                self._open(frame)
                if not frame.flags & _FLAG_RESPONSE and op not in BROKER_PUSHES[self.role]:
                    raise SessionError("the broker sent an unasked %s" % op_name(op),
                                       _E_UNEXPECTED_FRAME, False)
                return None
            if state == CONNECTING:
                return self._answer_challenge(frame, cnonce, opaque)
            # CHALLENGED: the CONNECT_ACK
            if self.mac and not frame.flags & _FLAG_MAC:
                raise fatal_error("the broker did not confirm frame MACs", _E_BAD_MAC)
            self._open(frame)
            self.ack = _Ack(*connect_ack_fields(frame.body))
            return None
        except ProtocolError as e:
            if e.fatal:          # a fatal error ends the session
                self._process(None)
            raise

    def _answer_challenge(self, frame, cnonce, opaque):
        # the AUTH answering the CHALLENGE ``frame``
        fields = challenge_fields(frame.body)
        nonce = fields[0]
        if cnonce is None:
            raise ProtocolError("a client nonce is needed to answer a CHALLENGE")
        if self.broker_id and fields[3] != self.broker_id:
            raise fatal_error("the broker says it is %r, not %r: no proof sent" % (
                fields[3], self.broker_id), _E_AUTH_FAILED)
        self.nonce = nonce
        self.cnonce = bytes(cnonce)
        self.transcript = th = transcript_hash(self.name, self._cflags, self._cbody,
                                               frame.body)
        if self.method == _AUTH_DEVICE_HMAC:
            proof = auth_proof(self.secret, nonce, self.cnonce, self.name, th)
        else:
            proof = self.secret
        if self.mac:
            # the key is known now: requests pipelined behind the AUTH are sealed
            from ._mac import session_key
            self.mac_key = session_key(self.secret, nonce, self.cnonce, self.name, th)
        return encode_frame(_OP_AUTH, self.name, auth_body(self.method, self.cnonce, proof),
                            opaque)
