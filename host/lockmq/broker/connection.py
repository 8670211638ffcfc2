"""One client connection: an asyncio Protocol (the hot path; no streams).

Every read feeds the decoder and handles *all* whole frames in it; the publishes of
the read go to the publish path (``publish.py``), which stores the publishes of every
connection read in the same loop iteration with one append; every answer produced in
one loop iteration goes out in one socket write. A malformed frame gets an ERROR frame and the connection
is closed; other connections are not affected. Memory per connection is bounded by
``max_frame`` (decoder) and ``max_conn_buffer_bytes`` (unsent answers and publishes
waiting for the store: above it the broker stops reading from this peer).

Session: the rules of the handshake and of which frames each role may send when
live in ``lockmq.protocol.ServerSession``; this class feeds it every frame and acts
on its answers (the guard decides who a peer is, the session what it may send).
Before authentication every violation is fatal and the socket is aborted rather
than drained, so an unauthenticated peer can make the broker hold almost nothing.

Wiring: a connection gets its collaborators as one :class:`Services` built by the
server (``server.py``), each the narrow piece it uses -- never the whole broker. The
data path reads one way: socket -> decoder -> session -> this class -> the core
(``core.py``) and the publish path (``publish.py``) -> the store; results come back
through the callback a connection hands over (:meth:`Connection._publishes_stored`)
and through the clusters' member callback (:meth:`Connection._wake_member`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from lockmq.protocol import (NO_SEQ, Ack, CommandResult, Command, Nack, PublishAck,
                             ESTABLISHED, ConnectAck, ErrorCode, Flag, FrameDecoder, Heartbeat,
                             Notify, Op, ProtocolError,
                             Pull, Role, ServerSession, SessionError, Subscribe, SubscribeAck,
                             UnknownOpcode, Unsubscribe, decode_json, encode_json,
                             op_name)
from lockmq.config import Config
from lockmq.security import BrokerGuard, ConnectionRefused, Principal, SecurityError
from lockmq.store import Appended, InvalidRecord, NewRecord, validate_topic

from lockmq import accel
from lockmq.protocol._fast import SHAPES, encode_message, json_headers, message_shape, \
    feed_publishes, messages_head, publish_fields, take_frame, take_publishes, \
    take_sealed_publishes
from lockmq.protocol._fast import publish_acks as _py_publish_acks
from lockmq.protocol._macfast import sealed_publish_acks
from lockmq.protocol._fast import queue_run as _py_queue_run
from lockmq.protocol._frame import Frame

from .admin import Admin
from .clusters import Cluster, ClusterError, Lease, Member, ParkedPull
from .commands import Commands
from .core import BrokerCore
from .devices import Devices
from .handshakes import HandshakeDeadlines
from .logs import EventLog, Stats
from .publish import PublishPath, PublishRefused, Results
from .transactions import TXN_HANDLERS

_RESP = Flag.RESPONSE
_ONEWAY = Flag.ONEWAY
# The compiled hot path (lockmq.accel): a read's PUBLISH frames scanned in one call,
# a store answer's acks packed in one; None / the pure-Python twin otherwise.
_scan_publishes = accel.speedups.scan_publishes if accel.COMPILED else None
# ... and each run of them to one topic queued for the store in one call
_queue_run = accel.speedups.queue_run if accel.COMPILED else _py_queue_run
_publish_acks = accel.speedups.publish_acks if accel.COMPILED else _py_publish_acks
# ... and any other whole, valid frame (the handshake's CONNECT and AUTH) read in one
_scan_frame = accel.speedups.scan_frame if accel.COMPILED else None
# ... and a sealed session's PUBLISH frames, their tags checked there (None: the
# session's Python path opens them)
_scan_sealed = accel.speedups.scan_sealed_publishes if accel.COMPILED else None
_mac_pads = accel.speedups.mac_pads if accel.COMPILED else None
_sealed_acks = accel.speedups.sealed_publish_acks if accel.COMPILED else None
# ... and a pull's MESSAGES body written in one buffer (None: the Python loop below)
_encode_leases_c = accel.speedups.encode_leases if accel.COMPILED else None
#: at most this many publishes scanned per call (bounds the tuples made at once)
SCAN_LIMIT = 1024
_conn_ids = iter(range(1, 1 << 62))
_ROLE_OF_KIND = {"lock": Role.LOCK, "service": Role.SERVICE, "admin": Role.ADMIN}
_DEBUG = 10   # logging.DEBUG: the level of the per-connection connect/disconnect lines
#: the ``subs`` and ``_limits_logged`` of a connection that has none yet (shared,
#: never written: a connection makes its own on first use)
_NO_SUBS: dict = {}
_NONE_LOGGED: frozenset = frozenset()
_NO_TOPICS: set = set()   # (the same: never written)
#: a connection joins the lane after this many publish answers of its Python path
#: (a storm's lock, one publish and gone, never does: joining costs syscalls)
LANE_AFTER_ANSWERS = 2
#: records of a lock's message rate the lane may spend before it asks again
LANE_CREDIT = 256
#: topics a connection's lane may take at most (a lock publishes to a few)
LANE_TOPICS = 16
#: Seconds a closing connection may take to drain its last answers before it is
#: aborted (a peer that never reads must not pin its buffers).
CLOSE_LINGER_S = 2.0


def _code(name: str) -> int:
    return int(getattr(ErrorCode, name, ErrorCode.INTERNAL))


class Connections:
    """The open connections of the broker, their cap, and whether it is closing."""

    def __init__(self) -> None:
        self.by_id: dict[int, "Connection"] = {}
        #: most connections held at once (set at start from the file limit); 0 = none
        self.limit = 0
        #: the broker is shutting down: publishes are answered SHUTTING_DOWN
        self.closing = False
        #: the connections still in their handshake, and their deadlines
        self.handshakes = HandshakeDeadlines()

    def __len__(self) -> int:
        return len(self.by_id)

    def established(self) -> list["Connection"]:
        """Every connection past its handshake and not closed."""
        return [c for c in self.by_id.values() if c.established]

    def publishes_pending(self) -> bool:
        """Is any connection still waiting for the store to answer its publishes?"""
        return any(c.publishes_pending for c in self.by_id.values())


@dataclass(frozen=True)
class Services:
    """What a connection works with, built once by the server (see the module
    docstring): settings, counters and log, the security guard, and the broker
    pieces a request goes to."""

    config: Config
    stats: Stats
    log: EventLog
    guard: BrokerGuard
    core: BrokerCore
    publisher: PublishPath
    devices: Devices
    commands: Commands
    admin: Admin
    connections: Connections
    scheduler: Any = None      # scheduler.Scheduler: PUBLISH_AT, COMMAND_AT, SCHEDULE_CANCEL
    #: the compiled lane for steady publish reads (lane.py); None: every read is Python's
    lane: Any = None
    #: transactional messages (transactions.py); None: TXN_* frames are not served
    transactions: Any = None
    #: the one rights decision (admission.py); None: the guard's checks alone
    admission: Any = None
    #: firmware bundles (firmware_bundles.py); None: FW_FETCH is not served
    firmware: Any = None


class Connection(asyncio.Protocol):
    """A peer's connection: lock, service (producer/consumer/commander) or admin.

    The handshake state is the session's (:attr:`session`); the connection keeps
    only what is its own: the socket and whether it is :attr:`closed`.

    A storm holds 10,000 of these: the attributes are slots (no instance dict to
    build, smaller, faster to read), and what a lock rarely needs -- its
    subscriptions, the caps it hit -- is created on first use. ``__dict__`` stays
    for the rare attribute another module adds (``transactions``: ``txn_groups``)."""

    __slots__ = ("services", "id", "transport", "peer", "peer_ip", "closed", "session",
                 "claimed_sn", "nonce", "principal", "decoder", "out", "out_scheduled",
                 "last_seen", "connected_at", "subs", "_next_sub", "_pub", "_pub_recs",
                 "_pub_size", "_pub_bytes", "_topics_ok", "_producer_ok", "_limits_logged",
                 "_paused_for_pub", "_paused_for_write", "_admitted", "is_device",
                 "heartbeat", "heartbeat_answered_at", "close_reason", "tls",
                 "peer_max_frame", "_lane_fd", "_lane_topics", "_answered_reads", "_pads",
                 "__dict__", "__weakref__")

    def __init__(self, services: Services, tls: bool = False) -> None:
        """``tls``: accepted on a TLS listener (the server knows; no transport probe)."""
        self.services = services
        self.id = next(_conn_ids)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_ip = ""
        self.closed = False          # the socket is closed (or closing): send nothing more
        self.session = ServerSession()   # the protocol's rules for this connection
        self.claimed_sn = ""
        self.nonce = b""
        self.principal: Principal | None = None
        # Until AUTH succeeds only small frames (security: unauthenticated sockets
        # must not make the broker buffer max_frame each); raised in _on_auth.
        self.decoder = FrameDecoder(min(services.guard.preauth_max_frame,
                                        services.config.broker.max_frame))
        self.out: list[bytes] = []
        self.out_scheduled = False
        self.last_seen = time.monotonic()
        self.connected_at = time.time()
        #: subscriptions by id (a shared empty one until the first SUBSCRIBE)
        self.subs: dict[int, tuple[Cluster, Member]] = _NO_SUBS
        self._next_sub = 1
        self._pub: list[tuple[int, bool, NewRecord]] = []
        self._pub_recs: list[NewRecord] = []   # the records of _pub (what the store takes)
        self._pub_size = 0                     # their buffer cost (payload + 64 each)
        self._pub_bytes = 0
        self._topics_ok: set[str] = set()   # topic names already validated
        self._producer_ok = ""              # producer id already checked (guard)
        self._limits_logged: set[str] = _NONE_LOGGED   # caps hit: logged once (see _log_once)
        self._paused_for_pub = False
        self._paused_for_write = False
        self._admitted = False
        self.is_device = False       # registered in the online list
        self.heartbeat: Heartbeat | None = None
        self.heartbeat_answered_at: float | None = None   # monotonic (Devices' rate rule)
        self.close_reason = ""
        self.tls = tls
        self.peer_max_frame = 0      # largest frame the peer can receive (CONNECT); 0 = unstated
        self._lane_fd = -1           # the socket's fd while it is in the lane (lane.py)
        self._lane_topics: set[str] = _NO_TOPICS   # topics the lane may take (allowed here)
        self._answered_reads = 0     # publish answers written by the Python path (lane.py)
        self._pads = b""             # the frame-MAC key's pads for the C scan (mac_pads)

    @property
    def established(self) -> bool:
        """Authenticated (the session is ESTABLISHED) and not closed."""
        return not self.closed and self.session.state == ESTABLISHED

    # -- asyncio callbacks ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit the connection (limits) and start the handshake timer."""
        self.transport = transport  # type: ignore[assignment]  (uvloop: not a subclass)
        b = self.services
        conns = b.connections
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer_ip = str(peer[0])
            self.peer = f"{peer[0]}:{peer[1]}"
        b.stats.inc("connections_accepted")
        conns.by_id[self.id] = self
        transport.set_write_buffer_limits(high=b.config.broker.max_conn_buffer_bytes)
        limit = conns.limit
        try:
            if limit and len(conns) > limit:
                exc = ConnectionRefused("max_connections",
                                        f"the broker holds {limit} connections")
                exc.public_message = f"the broker holds {limit} connections (max_connections)"
                raise exc
            b.guard.admit(self.peer_ip)
            self._admitted = True
        except SecurityError as exc:
            b.stats.inc("connections_refused")
            b.log("connection_refused", conn=self.id, peer=self.peer, reason=exc.reason,
                  level="warning")
            self.fatal(exc.code, exc.public_message, retry_after_ms=exc.retry_after_ms or 1000)
            return
        # (one loop-wide timer for every handshake, not a timer per connection)
        conns.handshakes.add(self, b.config.broker.handshake_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        """Release leases, report the device offline, give back the admission."""
        b = self.services
        self.closed = True
        if self._lane_fd >= 0:
            self._lane_leave()
        self.session.close()
        b.connections.by_id.pop(self.id, None)
        if self.principal is None:
            b.connections.handshakes.discard(self)
        if self.subs:
            for cluster, member in list(self.subs.values()):
                member.unpark()
                cluster.leave(member, reason="disconnected")
            self.subs = _NO_SUBS
        if self.principal is None and self.nonce:
            b.guard.forget_challenge(self.nonce)
        if self.is_device:
            b.devices.offline(self, "evicted" if self.close_reason == "evicted" else "offline")
        b.commands.connection_closed(self)
        if self._admitted:
            self._admitted = False
            b.guard.release(self.peer_ip)
        b.stats.inc("connections_closed")
        if (self.principal is not None or self.close_reason) and b.log.level <= _DEBUG:
            b.log("disconnect", conn=self.id, peer=self.peer, sn=self.claimed_sn,
                  reason=self.close_reason or (repr(exc) if exc else "peer closed"),
                  level="debug")

    def pause_writing(self) -> None:
        """The peer does not read its answers: stop reading its requests."""
        self._paused_for_write = True
        self._update_reading()

    def resume_writing(self) -> None:
        """The socket drained: read again."""
        self._paused_for_write = False
        self._update_reading()

    def _update_reading(self) -> None:
        t = self.transport
        if t is None or t.is_closing() or self._lane_fd >= 0:   # (the lane reads it)
            return
        if self._paused_for_write or self._paused_for_pub:
            if t.is_reading():
                t.pause_reading()
                self.services.stats.inc("reads_paused")
        elif not t.is_reading():
            t.resume_reading()

    def data_received(self, data: bytes) -> None:
        """Decode every whole frame of this read and handle it."""
        c = self.services.stats.c
        c["bytes_in"] += len(data)
        self.last_seen = time.monotonic()
        dec = self.decoder
        session = self.session
        was = session.state
        got = None
        if _scan_publishes is not None and was == ESTABLISHED \
                and session.mac_key is None and not self.closed:
            # compiled, a lock's steady state: the read's leading PUBLISH frames
            # scanned straight from its bytes (the decoder held nothing; the session's
            # rules for them -- established, no MAC, its own SN -- checked by the
            # scanner); whatever it stops at is read by _read_frames
            got = feed_publishes(dec, data, session.name, SCAN_LIMIT, _scan_publishes)
        if got is None:
            try:
                dec.feed(data)
            except ProtocolError as exc:
                self._bad_input(exc)
                return
            n = self._read_frames()
        else:
            pubs, pos = got
            n = len(pubs)
            if n:
                self._on_publishes(pubs)
            if pos < len(data) or n == SCAN_LIMIT:   # (not the usual whole read)
                n += self._read_frames()
        c["frames_in"] += n
        if self._pub:
            # publishes pipelined behind the AUTH (SPEC 2): the CONNECT_ACK waits for
            # their acks, and the lock gets both in one write (ONEWAY ones have none)
            hold = was != ESTABLISHED and not all(oneway for _, oneway, _ in self._pub)
            self._submit_publishes()
            if hold:
                return
        if self.out:
            self.flush()

    def _read_frames(self) -> int:
        """Handle every whole frame the decoder holds; returns how many there were."""
        dec = self.decoder
        n = 0
        session = self.session
        # One iterator over every whole frame of this read (not one call per frame);
        # an unknown opcode ends it, and the next one resumes after the skipped frame.
        while not self.closed:
            if session.state == ESTABLISHED:
                # compiled: the read's leading PUBLISH frames in one call (the session's
                # rules for them -- its own SN, and with frame MACs each tag against the
                # session's next counter -- checked by the scanner); whatever it stops
                # at, a bad tag too, goes through the decoder below
                if session.mac_key is None:
                    pubs = None if _scan_publishes is None else \
                        take_publishes(dec, session.name, SCAN_LIMIT, _scan_publishes)
                else:
                    pubs = None if _scan_sealed is None else take_sealed_publishes(
                        dec, session, SCAN_LIMIT, _scan_sealed, self._seal_pads())
                if pubs:
                    n += len(pubs)
                    self._on_publishes(pubs)
                    if len(pubs) == SCAN_LIMIT:
                        continue
                    if self.closed or not dec.buffered():   # (the usual end of a read)
                        break
            if _scan_frame is not None:
                # compiled: a whole, valid frame of a known opcode in one call (the
                # handshake's CONNECT and AUTH: no generator, no frame walk in Python);
                # anything else -- partial, bad, unknown -- is the decoder's, below
                frame = take_frame(dec, _scan_frame)
                if frame is not None:
                    n += 1
                    try:
                        self._handle(frame)
                    except Exception as exc:  # noqa: BLE001 -- as below
                        if not self._frame_failed(frame, exc):
                            break
                    if dec.buffered():
                        continue
                    break   # (the usual end of a handshake read: one frame)
                if not dec.buffered():
                    break
            try:
                for frame in dec.frames():
                    n += 1
                    try:   # (inline: a call per frame costs on the publish path)
                        self._handle(frame)
                    except Exception as exc:  # noqa: BLE001 -- sorted out off the fast path
                        if not self._frame_failed(frame, exc):
                            break
                    if self.closed:
                        break
                break
            except UnknownOpcode as exc:
                err = self.session.unknown_opcode(exc)
                if err.fatal:
                    self._bad_input(err)
                    break
                self.send_error(err.code, err.message, 0)
            except ProtocolError as exc:
                self._bad_input(exc)
                break
        return n

    def _frame_failed(self, frame: Any, exc: Exception) -> bool:
        """Answer what handling ``frame`` raised; False: stop reading this peer."""
        if isinstance(exc, SessionError):
            if exc.fatal:
                self._session_violation(exc, frame)
                return False
            self.send_error(exc.code, exc.message, frame.opaque)
        elif isinstance(exc, ProtocolError):
            self._bad_input(exc)
            return False
        else:   # a broker bug or a store error
            b = self.services
            b.log("internal_error", conn=self.id, peer=self.peer,
                  op=op_name(frame.opcode), error=repr(exc), level="error")
            b.stats.inc("internal_errors")
            self.send_error(_code("INTERNAL"), f"internal error: {type(exc).__name__}",
                            frame.opaque)
        return True

    # -- output -----------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queue bytes; everything queued in one loop iteration is written at once."""
        if self.closed:
            return
        self.out.append(data)
        if not self.out_scheduled:
            self.out_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def send_frame(self, opcode: int, body: bytes, opaque: int = 0, flags: int = 0) -> None:
        """Encode and queue one frame (broker frames carry an empty SN)."""
        self.services.stats.c["frames_out"] += 1
        if self._lane_fd >= 0 and self.session.mac_key is not None:
            # the lane holds a sealed session's counters: they come back before a tag
            # is made here (the socket is Python's from now on, as any write makes it)
            self._lane_leave()
        # sealed: with frame MACs on (a lock on plain TCP), tagged and counted
        self.send(self.session.seal(opcode, "", body, opaque, flags))

    def flush(self) -> None:
        """Write everything queued in one ``write`` call."""
        self.out_scheduled = False
        if self._lane_fd >= 0:   # Python writes: the socket is Python's first
            self._lane_leave()
        if not self.out or self.transport is None or self.transport.is_closing():
            self.out.clear()
            return
        data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
        self.out.clear()
        self.services.stats.c["bytes_out"] += len(data)
        self.transport.write(data)

    def send_error(self, code: int, message: str, opaque: int, retry_after_ms: int = 0,
                   response: bool = True) -> None:
        """Queue an ERROR frame (as the answer to ``opaque``)."""
        from lockmq.protocol import ErrorReply

        self.services.stats.c["errors_sent"] += 1
        self.send_frame(Op.ERROR, ErrorReply(int(code), message[:1000], retry_after_ms).encode(),
                        opaque, _RESP if response else 0)

    def fatal(self, code: int, message: str, retry_after_ms: int = 0, opaque: int = 0) -> None:
        """Send ERROR and close the connection (after the write is flushed)."""
        if self.closed:
            return
        self.send_error(code, message, opaque, retry_after_ms)
        self.close(message)

    def close(self, reason: str) -> None:
        """Flush what is queued and close; abort if the peer does not take it in time."""
        if not self.close_reason:
            self.close_reason = reason
        self.flush()
        self.session.close()
        t = self.transport
        if t is not None and not t.is_closing():
            t.close()
            if t.get_write_buffer_size():
                linger = CLOSE_LINGER_S if self.principal is not None else 0.2
                asyncio.get_running_loop().call_later(linger, t.abort)
        self.closed = True

    def refused(self, exc: SecurityError, opaque: int) -> None:
        """Answer a refusal of the guard: ERROR, and close if it says so."""
        msg = exc.public_message or str(exc)
        if exc.close:
            self.fatal(exc.code, msg, retry_after_ms=exc.retry_after_ms, opaque=opaque)
        else:
            self.send_error(exc.code, msg, opaque, retry_after_ms=exc.retry_after_ms)

    def _bad_input(self, exc: ProtocolError) -> None:
        self.services.stats.inc("bad_frames")
        self.services.guard.record_protocol_error(self.peer_ip, type(exc).__name__)
        self.services.log("bad_frame", conn=self.id, peer=self.peer, sn=self.claimed_sn,
                        code=exc.code, error=exc.message, level="warning")
        self.fatal(exc.code, exc.message)

    def _handshake_timeout(self) -> None:
        """Not authenticated in time: answer once and drop the socket at once, whatever
        it still has unread (an unauthenticated peer gets no linger)."""
        if not self.closed and self.principal is None:
            self.services.stats.inc("handshakes_failed")
            err = self.services.guard.auth_timed_out(self.peer_ip, self.nonce or None)
            self.fatal(err.code, err.public_message or str(err))
            if self.transport is not None:
                self.transport.abort()

    def _session_violation(self, exc: SessionError, frame: Any) -> None:
        """A fatal break of the session's rules: log, count, answer once, close."""
        b = self.services
        if exc.code == ErrorCode.SN_MISMATCH:
            b.log("sn_mismatch", conn=self.id, peer=self.peer,
                  principal=self.principal.name if self.principal else "",
                  frame_sn=frame.sn, level="warning")
            try:   # the guard counts identity violations in its audit metrics
                b.guard.check_frame_sn(self.principal, frame.sn)
            except SecurityError:   # it raises: that is the point
                pass
        else:
            b.stats.inc("session_violations")
            if exc.code == ErrorCode.BAD_MAC:   # an altered/injected frame, or no MACs
                b.stats.inc("frame_mac_refused")
            b.guard.record_protocol_error(self.peer_ip, "session")
            # the state the frame arrived in (the session is CLOSING by now)
            state = ("ESTABLISHED" if self.principal is not None else
                     "CHALLENGED" if self.nonce else "CONNECTING")
            b.log("session_violation", conn=self.id, peer=self.peer, sn=self.claimed_sn,
                  state=state, op=op_name(frame.opcode), code=exc.code,
                  error=exc.message, level="warning")
        self.fatal(exc.code, exc.message, opaque=frame.opaque)

    # -- dispatch ---------------------------------------------------------------------

    def _handle(self, frame: Any) -> None:
        """Let the session check ``frame`` (it raises SessionError), then act on it."""
        session = self.session
        was = session.state
        session.receive(frame)
        op = frame.opcode
        if was == ESTABLISHED:
            _HANDLERS[op](self, frame)
        elif op == Op.DISCONNECT:
            self.close("client disconnect")
        elif op == Op.CONNECT:
            self._on_connect(frame)
        else:
            self._on_auth(frame)

    # -- handshake --------------------------------------------------------------------

    def _on_connect(self, frame: Any) -> None:
        self.claimed_sn = frame.sn
        # the command path never sends this peer a frame larger than it stated
        self.peer_max_frame = self.session.connect.max_frame
        self.nonce = nonce = self.services.guard.challenge()
        self._answer_handshake(self.session.challenge(nonce, int(time.time() * 1000),
                                                      frame.opaque,
                                                      broker_id=self.services.guard.broker_id))

    def _answer_handshake(self, data: bytes) -> None:
        """Queue a CHALLENGE or CONNECT_ACK: written with whatever else this read
        produced (the COMMANDs waiting for a lock) by the flush at the end of
        :meth:`data_received` -- one write, and no ``call_soon`` per answer."""
        self.services.stats.c["frames_out"] += 1
        if not self.closed:
            self.out.append(data)

    def _on_auth(self, frame: Any) -> None:
        b = self.services
        auth = self.session.auth
        try:
            principal = b.guard.authenticate(self.claimed_sn, auth, self.nonce, self.peer_ip,
                                             tls=self.tls, transcript=self.session.transcript)
        except SecurityError as exc:   # AuthFailed and friends
            b.stats.inc("handshakes_failed")
            b.log("auth_failed", conn=self.id, peer=self.peer, sn=self.claimed_sn,
                  reason=exc.reason, level="warning")
            self.session.close()
            self.fatal(exc.code, exc.public_message or "authentication failed",
                       retry_after_ms=exc.retry_after_ms, opaque=frame.opaque)
            return
        self.principal = principal
        self.decoder.max_frame = b.config.broker.max_frame   # authenticated: full limit
        b.connections.handshakes.discard(self)
        b.stats.inc("handshakes_ok")
        last_seq = NO_SEQ
        is_lock = principal.kind == "lock"
        if is_lock:
            s = b.core.last_seq(principal.name)
            last_seq = NO_SEQ if s is None else s
        cfg = b.config
        ack = ConnectAck(int(cfg.devices.heartbeat_s), cfg.broker.max_frame,
                         int(time.time() * 1000), last_seq, self.id & 0xFFFFFFFF)
        role = Role.ADMIN if principal.permissions.replicate \
            else _ROLE_OF_KIND.get(principal.kind, Role.SERVICE)   # (a standby: replica.*)
        # a lock provisioned for MACs never goes without them on plain TCP
        # (SPEC 2 "Per-device policy"); "optional" covers only locks registered without
        mac_required = not self.tls and (b.guard.lock_frames_need_mac or principal.need_mac)
        if is_lock and not self.tls and not self.session.mac_wanted and not mac_required \
                and b.guard.auth_mode != "off":
            # (a line a second at most: in a reconnect storm of such locks a line per
            # session was a fifth of the loop's time; ``suppressed`` counts the rest)
            b.log.limited("lock_without_mac", level="warning", conn=self.id, peer=self.peer,
                          sn=principal.name, note="registered without a MAC policy; frames "
                          "on plain TCP are not integrity-protected (lockmq devices policy --mac)")
        try:
            answer = self.session.accept(role, principal.name, ack, frame.opaque,
                                         mac_key=principal.session_key, mac_required=mac_required)
        except SessionError:
            b.stats.inc("handshakes_failed")
            b.log("auth_failed", conn=self.id, peer=self.peer, sn=principal.name,
                  reason="mac_required", level="warning")
            raise
        self._answer_handshake(answer)
        if b.log.level <= _DEBUG:   # (a line per lock only at DEBUG: skip its fields)
            b.log("connect", conn=self.id, peer=self.peer, sn=principal.name,
                  kind=principal.kind, level="debug")
        if is_lock:
            b.devices.online(self)
            b.commands.lock_online(self)

    # -- requests after the handshake -------------------------------------------------

    def _on_heartbeat(self, frame: Any) -> None:
        self.heartbeat = Heartbeat.decode(frame.body)
        try:   # heartbeats count inside the per-lock rate (issue 10 item 8)
            self.services.devices.check_heartbeat(self)
        except SecurityError as exc:   # RateLimited: answer it, keep the link
            if not frame.flags & Flag.ONEWAY:
                self.refused(exc, frame.opaque)
            return
        if self.is_device and frame.body:
            self.services.devices.heartbeat(self, self.heartbeat)
        if not frame.flags & Flag.ONEWAY:
            self.send_frame(Op.HEARTBEAT, b"", frame.opaque, _RESP)

    def _on_disconnect(self, frame: Any) -> None:
        self.close("client disconnect")

    def _on_publish(self, frame: Any) -> None:
        topic, seq, lock_ts_ms, payload = publish_fields(frame.body)   # Publish.decode's
        self._publish(frame.opaque, frame.flags, frame.sn, topic, seq, lock_ts_ms, payload)

    def _on_publishes(self, pubs: list[tuple]) -> None:
        """PUBLISH frames the compiled scanner took, as :meth:`_publish` arguments.

        The common case -- a run of records to a topic already checked, answers
        wanted, the broker not closing, the session's own SN -- is queued by one call
        (``queue_run``) and checked once (``guard.publish_quota``: the rights, and a
        lock's rate counted for the whole run); anything else, and every record over
        the quota (taken back out of the queue), goes through :meth:`_publish` one by
        one, which refuses each as before. Errors are answered as
        :meth:`data_received` answers a frame's."""
        b = self.services
        principal = self.principal
        inline = not b.connections.closing and principal.name == self._producer_ok
        topics_ok = self._topics_ok
        cap = b.config.broker.max_publish_batch
        done = i = slow = 0
        n = len(pubs)
        while i < n and not self.closed:
            p = pubs[i]
            first = i
            try:
                if inline and i >= slow and p[3] in topics_ok:
                    queue = self._pub
                    i, size = _queue_run(pubs, i, cap - len(queue), NewRecord, queue,
                                         self._pub_recs)
                    if i > first:
                        try:
                            granted = b.guard.publish_quota(principal, p[3], i - first)
                        except Exception:   # (a guard bug: nothing of the run stays)
                            del queue[first - i:]
                            del self._pub_recs[first - i:]
                            i = first
                            raise
                        if granted and b.lane is not None and p[3] not in self._lane_topics:
                            self._lane_allow(p[3])
                        if first + granted < i:   # over the quota: taken back out, and
                            slow = i              # then refused one by one (below)
                            i = first + granted
                            del queue[i - slow:]
                            del self._pub_recs[i - slow:]
                            size -= sum(len(q[6]) + 64 for q in pubs[i:slow])
                        self._pub_size += size
                        done += granted
                        if len(queue) >= cap:
                            self._submit_publishes()   # (the publish path stores it at once)
                        if granted:
                            continue
                # ONEWAY, a new topic or producer id, closing, over the quota
                i = first + 1
                self._publish(*p)
                inline = not b.connections.closing and principal.name == self._producer_ok
            except Exception as exc:  # noqa: BLE001 -- as in data_received
                i = max(i, first + 1)
                if not self._frame_failed(Frame(Op.PUBLISH, p[2], p[1], p[0], b""), exc):
                    break
        b.stats.c["publish_received"] += done

    def _publish(self, opaque: int, flags: int, sn: str, topic: str, seq: int,
                 lock_ts_ms: int, payload: bytes) -> None:
        """One PUBLISH the session allowed: checked (topic, rights, producer id) and
        queued for the store."""
        b = self.services
        oneway = bool(flags & _ONEWAY)
        b.stats.c["publish_received"] += 1
        if oneway:
            b.stats.c["publish_oneway"] += 1
        if topic not in self._topics_ok:
            try:
                validate_topic(topic)
            except InvalidRecord as exc:
                b.stats.inc("publish_refused")
                self._pub_error(oneway, _code("INVALID_ARGUMENT"), str(exc), opaque)
                return
            if len(self._topics_ok) >= 64:
                self._topics_ok.clear()
            self._topics_ok.add(topic)
        try:
            # (the frame's SN was bound to the principal by the session already)
            (b.admission or b.guard).check_publish(self.principal, topic, n=1)
        except SecurityError as exc:
            self._pub_refused(exc, oneway, opaque)
            return
        if b.connections.closing:
            self._pub_error(oneway, _code("SHUTTING_DOWN"), "the broker is shutting down",
                            opaque, 1000)
            return
        sn = sn or self.principal.name
        if sn != self._producer_ok:   # reserved ids, lookalikes, another's id: once per id
            try:
                b.guard.check_producer_id(self.principal, sn)
            except SecurityError as exc:   # FORBIDDEN
                b.stats.inc("producer_ids_refused")
                if self._log_once("producer"):   # (the guard logs each, rate-limited)
                    b.log("producer_id_refused", conn=self.id, peer=self.peer,
                          principal=self.principal.name, producer_id=sn[:80],
                          reason=exc.reason, level="warning")
                self._pub_refused(exc, oneway, opaque)
                return
            self._producer_ok = sn
        rec = NewRecord(topic, sn, seq, lock_ts_ms, payload)
        self._pub.append((opaque, oneway, rec))
        self._pub_recs.append(rec)
        self._pub_size += len(payload) + 64
        if len(self._pub) >= b.config.broker.max_publish_batch:
            self._submit_publishes()   # (the publish path stores it at once)

    def _log_once(self, cap: str) -> bool:
        """True the first time this connection hits ``cap`` (then it is logged)."""
        if cap in self._limits_logged:
            return False
        if self._limits_logged is _NONE_LOGGED:
            self._limits_logged = set()
        self._limits_logged.add(cap)
        return True

    def _pub_refused(self, exc: SecurityError, oneway: bool, opaque: int) -> None:
        """A publish the guard refused: counted; answered unless it was ONEWAY and the
        guard keeps the link (then only counted in ``publish_oneway_refused``)."""
        self.services.stats.inc("publish_refused")
        if exc.close or not oneway:
            self.refused(exc, opaque)
        else:
            self.services.stats.c["publish_oneway_refused"] += 1

    def _pub_error(self, oneway: bool, code: int, msg: str, opaque: int,
                   retry_after_ms: int = 0) -> None:
        """Answer a refused publish -- unless it was ONEWAY (SPEC: never an answer;
        it is counted in ``publish_oneway_refused``)."""
        if oneway:
            self.services.stats.c["publish_oneway_refused"] += 1
        else:
            self.send_error(code, msg, opaque, retry_after_ms=retry_after_ms)

    @property
    def publishes_pending(self) -> bool:
        """Publishes handed to the publish path and not answered yet?"""
        return self._pub_bytes > 0

    def _submit_publishes(self) -> None:
        batch = self._pub
        records = self._pub_recs
        size = self._pub_size
        self._pub = []
        self._pub_recs = []
        self._pub_size = 0
        self._pub_bytes += size
        if self._pub_bytes > self.services.config.broker.max_conn_buffer_bytes:
            self._paused_for_pub = True
            self._update_reading()
        self.services.publisher.submit(records, partial(self._publishes_stored, batch, size))

    def _publishes_stored(self, batch: list[tuple[int, bool, NewRecord]], size: int,
                          results: list[Appended | Exception]) -> None:
        """The publish path's answer for one :meth:`_submit_publishes`: per record, what
        the store did (:class:`Appended`), or why it was not stored (an
        :class:`InvalidRecord` alone, a :class:`PublishRefused` for the batch)."""
        c = self.services.stats.c
        # The acks of a run of stored records are packed in one call (lockmq._core,
        # or protocol/_fast.py; with frame MACs on, sealed by protocol/_macfast.py).
        # Answers keep the order of the requests.
        data, frames, stored, dup, i = self._ack_run(batch, results, 0)
        if frames:
            self._send_acks(data, frames)
        if i < len(results):   # a refusal (then the rest, one by one)
            st, dp = self._answer_publishes(batch, results, i)
            stored += st
            dup += dp
        c["publish_stored"] += stored
        c["publish_duplicates"] += dup
        self._pub_bytes -= size
        if self._paused_for_pub and self._pub_bytes <= \
                self.services.config.broker.max_conn_buffer_bytes // 2:
            self._paused_for_pub = False
            self._update_reading()
        if not self._pub_bytes and self._lane_topics:
            self._answered_reads += 1
            if self._answered_reads >= LANE_AFTER_ANSWERS:
                self._lane_join()

    def _ack_run(self, batch: list[tuple[int, bool, NewRecord]],
                 results: list[Appended | Exception], i: int) -> tuple[bytes, int, int, int, int]:
        """The acks of the run of stored records from ``results[i]`` on, in one call:
        ``(bytes, frames, stored, duplicates, next index)`` (sealed when the session has
        frame MACs: each ack takes the session's next counter)."""
        session = self.session
        if session.mac_key is None:
            return _publish_acks(batch, results, i)
        if _sealed_acks is None:
            return sealed_publish_acks(session, batch, results, i)
        got = _sealed_acks(batch, results, i, self._seal_pads(), session.tx)
        session.tx += got[1]   # (one counter per ack, as sealing each would take)
        return got

    def _seal_pads(self) -> bytes:
        """The session key's HMAC pads for the compiled tags (``mac_pads``), made once."""
        if not self._pads:
            self._pads = _mac_pads(self.session.mac_key)
        return self._pads

    def _answer_publishes(self, batch: list[tuple[int, bool, NewRecord]],
                          results: list[Appended | Exception], i: int) -> tuple[int, int]:
        """:meth:`_publishes_stored` from ``results[i]`` on: each refusal answered
        alone, each run of stored records' acks in one call; returns how many were
        stored and how many were duplicates."""
        stored = dup = 0
        n = len(results)
        while i < n:
            a = results[i]
            if isinstance(a, Exception):
                opaque, oneway, _r = batch[i]
                i += 1
                if isinstance(a, PublishRefused):
                    self._pub_error(oneway, a.code, a.message, opaque, a.retry_after_ms)
                else:
                    self._pub_error(oneway, _code("INVALID_ARGUMENT"), str(a), opaque)
                continue
            data, frames, st, dp, j = self._ack_run(batch, results, i)
            i = j if j > i else i + 1   # (never loops on an answer of no known kind)
            stored += st
            dup += dp
            if frames:
                self._send_acks(data, frames)
        return stored, dup

    def _send_acks(self, data: bytes, frames: int) -> None:
        c = self.services.stats.c
        c["frames_out"] += frames
        if self.closed:
            return
        if self._lane_fd >= 0:   # (an answer of the lane's for a socket it gave back)
            self._lane_leave()
        # the store's answer is all this connection gets now: written at once, not
        # one loop iteration later (after whatever else was queued, in order)
        if self.out:
            self.out.append(data)
            self.flush()
            return
        t = self.transport
        if t is not None and not t.is_closing():   # (flush, without the list)
            c["bytes_out"] += len(data)
            t.write(data)

    # -- the lane (lane.py) -------------------------------------------------------------

    def _lane_allow(self, topic: str) -> None:
        """``topic`` passed the guard's rights here: the lane may take it."""
        if self._lane_topics is _NO_TOPICS:
            self._lane_topics = set()
        if len(self._lane_topics) < LANE_TOPICS:
            self._lane_topics.add(topic)

    def _lane_join(self) -> None:
        """Hand the socket to the lane if this connection is in its steady state: past
        its handshake on plain TCP, its own producer id checked, and
        nothing held -- no bytes in the decoder, no answer unsent or unanswered. A
        session with frame MACs hands its key's pads and tag counters over with it."""
        b = self.services
        t = self.transport
        principal = self.principal
        if (b.lane is None or self._lane_fd >= 0 or self.closed or self.tls or t is None
                or principal is None or self.session.state != ESTABLISHED
                or principal.name != self._producer_ok
                or self.out or self._pub or self._pub_bytes or self.decoder.buffered()
                or self._paused_for_write or self._paused_for_pub or b.connections.closing
                or t.is_closing() or not t.is_reading() or t.get_write_buffer_size()):
            return
        sock = t.get_extra_info("socket")
        if sock is None:
            return
        credit = b.guard.publish_credit(principal, LANE_CREDIT)
        if credit == 0:
            return
        session = self.session
        sealed = None if session.mac_key is None else (self._seal_pads(), session.rx, session.tx)
        if b.lane.join(self, sock.fileno(), session.name, self._lane_topics, credit,
                       b.config.broker.max_conn_buffer_bytes, sealed):
            self._lane_fd = sock.fileno()
            t.pause_reading()
        elif credit > 0:
            b.guard.return_credit(principal, credit)

    def _lane_leave(self) -> None:
        """Take the socket back from the lane (before Python writes to it or closes it)."""
        back = self.services.lane.leave(self._lane_fd)
        if back is None:
            self._lane_left(b"", 0)
        else:
            self._lane_left(back[0], back[1], counters=back[2])

    def _lane_left(self, data: bytes, credit: int, unsent: bytes = b"",
                   counters: tuple[int, int] | None = None) -> None:
        """The socket is Python's again: ``credit`` goes back to the lock's budget, a
        sealed session takes its tag ``counters`` (rx, tx) back, the transport reads
        again, ``unsent`` acks are written and ``data`` -- the bytes the lane did not
        take, or the partial frame it held -- is read here."""
        self._lane_fd = -1
        session = self.session
        if counters is not None and session.mac_key is not None:
            # the lane counts mod 2**32 (a tag's counter is a u32): what it added since
            # it took the socket, onto the session's own count
            session.rx += (counters[0] - session.rx) & 0xFFFFFFFF
            session.tx += (counters[1] - session.tx) & 0xFFFFFFFF
        b = self.services
        if credit > 0:
            b.guard.return_credit(self.principal, credit)
        self._update_reading()
        if unsent:
            self._send_acks(unsent, 0)
        if data:   # (from flush too: data_received's own flush writes what is queued)
            self.data_received(data)

    def _lane_refused(self, batch: list[tuple[int, bool, None]], results: Results) -> None:
        """A lane answer with a refusal in it, or a sealed session's acks for a socket
        that left the lane: answered here, in order (the socket Python's first, so a
        sealed ack takes the session's counter)."""
        if self._lane_fd >= 0:
            self._lane_leave()
        stored, dup = self._answer_publishes(batch, results, 0)
        c = self.services.stats.c
        c["publish_stored"] += stored
        c["publish_duplicates"] += dup

    # -- consumers ----------------------------------------------------------------------

    def _on_subscribe(self, frame: Any) -> None:
        s = Subscribe.decode(frame.body)
        b = self.services
        try:
            b.guard.check_consume(self.principal, s.topic, s.cluster)
        except SecurityError as exc:
            self.refused(exc, frame.opaque)
            return
        cap = b.config.consumers.max_subscriptions_per_connection
        if len(self.subs) >= cap:   # bounded per connection (a cap: retrying won't help)
            b.stats.inc("subscriptions_refused")
            if self._log_once("subs"):
                b.log("subscription_limit", conn=self.id, peer=self.peer,
                      principal=self.principal.name, cap=cap, level="warning")
            self.send_error(_code("LIMIT_EXCEEDED"),
                            f"this connection already holds {cap} subscriptions "
                            "(consumers.max_subscriptions_per_connection): unsubscribe "
                            "first or use another connection", frame.opaque)
            return
        ordered = bool(s.flags & Subscribe.ORDERED) or b.config.consumers.ordered_default
        try:
            cluster = b.core.cluster(s.cluster, s.topic, ordered, principal=self.principal)
        except ClusterError as exc:
            self.send_error(_code(exc.code), exc.message, frame.opaque)
            return
        sub_id = self._next_sub
        self._next_sub += 1
        if self.subs is _NO_SUBS:
            self.subs = {}
        member = Member(sub_id, self.principal.name, self.peer, self._wake_member,
                        s.max_inflight, s.lease_ms)
        self.subs[sub_id] = (cluster, member)
        self.send_frame(Op.SUBSCRIBE_ACK, SubscribeAck(sub_id, cluster.backlog()).encode(),
                        frame.opaque, _RESP)
        cluster.join(member)   # (a NOTIFY it causes goes out after the SUBSCRIBE_ACK)

    def _sub(self, sub_id: int, opaque: int) -> tuple[Cluster, Member] | None:
        s = self.subs.get(sub_id)
        if s is None:
            self.send_error(_code("UNKNOWN_SUBSCRIPTION"),
                            f"no subscription {sub_id} on this connection", opaque)
        return s

    def _on_unsubscribe(self, frame: Any) -> None:
        u = Unsubscribe.decode(frame.body)
        s = self._sub(u.sub_id, frame.opaque)
        if s is None:
            return
        del self.subs[u.sub_id]
        s[1].unpark()
        s[0].leave(s[1], reason="unsubscribed")
        self.send_frame(Op.OK, b"", frame.opaque, _RESP)

    def _on_pull(self, frame: Any) -> None:
        p = Pull.decode(frame.body)
        s = self._sub(p.sub_id, frame.opaque)
        if s is None:
            return
        cluster, member = s
        self.services.stats.c["pulls"] += 1
        earlier = member.unpark()   # a new PULL answers the one still waiting, empty
        if earlier is not None:
            self._send_messages(member.member_id, [], earlier.opaque)
        leases = cluster.pull(member, max(1, p.max_messages))
        if leases or p.wait_ms <= 0:
            self._send_messages(p.sub_id, leases, frame.opaque)
            return
        wait = min(p.wait_ms, self.services.config.consumers.visibility_timeout_ms, 60_000)
        timer = asyncio.get_running_loop().call_later(
            wait / 1000.0, self._park_expired, member)
        member.park(ParkedPull(frame.opaque, max(1, p.max_messages), timer))

    def _park_expired(self, member: Member) -> None:
        parked = member.unpark()
        if parked is not None:
            self._send_messages(member.member_id, [], parked.opaque)

    def _wake_member(self, member: Member) -> None:
        """Called by the cluster when work arrives for an idle member."""
        if self.closed:
            return
        s = self.subs.get(member.member_id)
        if s is None:
            return
        cluster = s[0]
        parked = member.parked
        if parked is not None:
            leases = cluster.pull(member, parked.max_messages)
            if leases:
                member.unpark()
                self._send_messages(member.member_id, leases, parked.opaque)
            return
        self.services.stats.c["notifies"] += 1
        avail = min(0xFFFFFFFF, cluster.available())
        self.send_frame(Op.NOTIFY, Notify(member.member_id, avail).encode())

    def _send_messages(self, sub_id: int, leases: list[Lease], opaque: int) -> None:
        stats = self.services.stats
        stats.c["messages_delivered"] += len(leases)
        if leases:   # stored -> first delivery (not retries, not redeliveries)
            now_us = self.services.core.clock.wall_ms() * 1000.0   # the store's clock
            observe = stats.latency.publish_deliver.observe
            for lease in leases:
                if lease.deliveries == 1 and not lease.retries:
                    observe((now_us - lease.rec.broker_ts_us) / 1e6)
        self.send_frame(Op.MESSAGES, encode_leases(sub_id, leases), opaque, _RESP)

    def _on_ack(self, frame: Any) -> None:
        ack = Ack.decode(frame.body)
        sub_id, leases = ack.sub_id, ack.leases
        s = self._sub(sub_id, frame.opaque)
        if s is None:
            return
        cluster, member = s
        bad = cluster.ack_many(member, leases)   # the whole frame at once
        self.services.stats.c["acks"] += len(leases) - len(bad)
        self._lease_reply(frame, bad, len(leases))
        cluster.settled(member)

    def _on_nack(self, frame: Any) -> None:
        nack = Nack.decode(frame.body)
        sub_id, delay_ms, reason, leases = nack.sub_id, nack.delay_ms, nack.reason, nack.leases
        s = self._sub(sub_id, frame.opaque)
        if s is None:
            return
        cluster, member = s
        bad = []
        for qoff, delivery in leases:
            try:
                cluster.nack(member, qoff, delivery, delay_ms or None, reason)
            except ClusterError:
                bad.append((qoff, delivery))
        self.services.stats.c["nacks"] += len(leases) - len(bad)
        self._lease_reply(frame, bad, len(leases))
        cluster.settled(member)

    def _lease_reply(self, frame: Any, bad: list[tuple[int, int]], total: int) -> None:
        if bad:
            self.services.stats.c["unknown_leases"] += len(bad)
            if frame.flags & Flag.ONEWAY:
                return
            shown = ", ".join(f"({q},{d})" for q, d in bad[:20])
            self.send_error(_code("UNKNOWN_LEASE"),
                            f"{len(bad)} of {total} leases unknown, expired or not yours "
                            f"(the others were applied): {shown}", frame.opaque)
        elif not frame.flags & Flag.ONEWAY:
            self.send_frame(Op.OK, b"", frame.opaque, _RESP)

    # -- commands and admin -----------------------------------------------------------

    def _on_command(self, frame: Any) -> None:
        self.services.commands.submit(self, frame.opaque, Command.decode(frame.body))

    def _on_command_result(self, frame: Any) -> None:
        self.services.commands.result(self, CommandResult.decode(frame.body))

    def _on_admin(self, frame: Any) -> None:
        req = decode_json(frame.body)
        self.services.stats.c["admin_requests"] += 1
        try:
            b = self.services
            (b.admission or b.guard).check_admin(self.principal, str(req.get("op", "")))
        except SecurityError as exc:
            self.send_frame(Op.ADMIN_RESPONSE, encode_json(
                {"ok": False, "error": "FORBIDDEN",
                 "message": exc.public_message or str(exc)}),
                frame.opaque, _RESP)
            return
        reply = self.services.admin.handle(self.principal, req)
        if asyncio.isfuture(reply) or asyncio.iscoroutine(reply):
            async def later() -> None:
                out = await reply
                self.send_frame(Op.ADMIN_RESPONSE, encode_json(out), frame.opaque, _RESP)
            asyncio.ensure_future(later())
            return
        self.send_frame(Op.ADMIN_RESPONSE, encode_json(reply), frame.opaque, _RESP)

    def info(self) -> dict[str, Any]:
        """Admin view of the connection."""
        p = self.principal
        return {"conn": self.id, "peer": self.peer, "name": p.name if p else self.claimed_sn,
                "kind": p.kind if p else self.session.state_name().lower(),
                "since_ms": int(self.connected_at * 1000),
                "idle_s": round(time.monotonic() - self.last_seen, 3),
                "subscriptions": len(self.subs)}


def encode_leases(sub_id: int, leases: list[Lease]) -> bytes:
    """MESSAGES body straight from cluster leases: the delivery hot path.

    The bytes are the protocol's (``lockmq.protocol._fast``); this only walks the
    leases. A message without headers (the common case) costs one cache lookup and
    one ``pack``; a retried one gets ``{"retries": n}`` added to its headers.
    Compiled, a batch without headers or retries is one C call (the same bytes)."""
    if _encode_leases_c is not None:
        body = _encode_leases_c(sub_id, leases)
        if body is not None:
            return body
    return _encode_leases_py(sub_id, leases)


def _encode_leases_py(sub_id: int, leases: list[Lease]) -> bytes:
    """:func:`encode_leases` in Python: every batch (the reference of the C one)."""
    parts = [messages_head(sub_id, len(leases))]
    append = parts.append
    shapes = SHAPES
    for lease in leases:
        r = lease.rec
        p = r.payload
        if r.headers or lease.retries:
            h = dict(r.headers or {})
            if lease.retries:
                h["retries"] = lease.retries
            append(encode_message(lease.wire, lease.deliveries, r.sn, r.seq, r.lock_ts_ms,
                                  r.broker_ts_us, r.topic, p, json_headers(h)))
            continue
        got = shapes.get((r.sn, r.topic, len(p)))
        if got is None:
            got = message_shape(r.sn, r.topic, len(p))
        append(got[0](lease.wire, lease.deliveries, r.seq, r.lock_ts_ms, r.broker_ts_us,
                      got[1], p))
    return b"".join(parts)


_HANDLERS = {
    Op.HEARTBEAT: Connection._on_heartbeat,
    Op.DISCONNECT: Connection._on_disconnect,
    Op.PUBLISH: Connection._on_publish,
    Op.SUBSCRIBE: Connection._on_subscribe,
    Op.UNSUBSCRIBE: Connection._on_unsubscribe,
    Op.PULL: Connection._on_pull,
    Op.ACK: Connection._on_ack,
    Op.NACK: Connection._on_nack,
    Op.COMMAND: Connection._on_command,
    Op.COMMAND_RESULT: Connection._on_command_result,
    Op.ADMIN_REQUEST: Connection._on_admin,
    # scheduled delivery (scheduler.py)
    Op.PUBLISH_AT: lambda c, f: c.services.scheduler.on_publish_at(c, f),
    Op.COMMAND_AT: lambda c, f: c.services.scheduler.on_command_at(c, f),
    Op.SCHEDULE_CANCEL: lambda c, f: c.services.scheduler.on_cancel(c, f),
    # over-the-air updates (firmware_bundles.py)
    Op.FW_FETCH: lambda c, f: (c.services.firmware.on_fetch(c, f) if c.services.firmware
                               else c.send_error(ErrorCode.UNKNOWN_OPCODE, "no firmware bundles here",
                                                 f.opaque)),
}
_HANDLERS.update(TXN_HANDLERS)   # transactional messages: TXN_PUBLISH, TXN_END, ...

__all__ = ["Connection", "Role"]
