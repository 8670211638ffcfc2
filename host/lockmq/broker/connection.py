"""One client connection: an asyncio Protocol -- the transport, the read loop, flow
control, and the dispatch of every frame (the hot path; no streams).

Every read feeds the decoder and handles *all* whole frames in it; every answer
produced in one loop iteration goes out in one socket write. A malformed frame gets
an ERROR frame and the connection is closed; other connections are not affected.
Memory per connection is bounded by ``max_frame`` (decoder) and
``max_conn_buffer_bytes`` (unsent answers and publishes waiting for the store:
above it the broker stops reading from this peer).

After the handshake (``login.py``) each frame goes to the handler of its opcode in
the one table the features registered when the broker was built
(``Services.handlers``): PUBLISH to ``intake.py`` (a base of this class: the hot
path), SUBSCRIBE..NACK to ``consumers.py``, COMMAND to ``commands.py``, and so on;
a handler sees the connection as a ``peer.Peer``. Before authentication every
violation is fatal and the socket is aborted rather than drained.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from lockmq import accel
from lockmq.protocol import (ESTABLISHED, ErrorCode, ErrorReply, Flag, FrameDecoder, Op,
                             ProtocolError, Role, ServerSession, UnknownOpcode, op_name)
from lockmq.protocol.compiled import session_pads
from lockmq.protocol.batch import feed_publishes, take_frame, take_publishes, \
    take_sealed_publishes
from lockmq.security import ConnectionRefused, Principal, SecurityError

from .intake import PublishIntake
from .login import Handshake
from .services import Services

_RESP = Flag.RESPONSE
# The compiled hot path (lockmq.accel): a read's PUBLISH frames scanned in one call;
# None otherwise
_scan_publishes = accel.speedups.scan_publishes if accel.COMPILED else None
# ... and any other whole, valid frame (the handshake's CONNECT and AUTH) read in one
_scan_frame = accel.speedups.scan_frame if accel.COMPILED else None
# ... and a sealed session's PUBLISH frames, their tags checked there (None: the
# session's Python path opens them)
_scan_sealed = accel.speedups.scan_sealed_publishes if accel.COMPILED else None
#: at most this many publishes scanned per call (bounds the tuples made at once)
SCAN_LIMIT = 1024
_conn_ids = iter(range(1, 1 << 62))
_DEBUG = 10   # logging.DEBUG: the level of the per-connection disconnect line
#: Seconds a closing connection may take to drain its last answers before it is
#: aborted (a peer that never reads must not pin its buffers).
CLOSE_LINGER_S = 2.0


class Connection(PublishIntake, Handshake, asyncio.Protocol):
    """A peer's connection: lock, service (producer/consumer/commander) or admin.

    The handshake state is the session's (:attr:`session`); the connection keeps
    only what is its own: the socket and whether it is :attr:`closed`. What other
    modules may use of it is :class:`~.peer.Peer`.

    A storm holds 10,000 of these: the attributes are slots (no instance dict, smaller,
    faster to read; the publish state's are :class:`~.intake.PublishIntake`'s) and
    nothing else can be added to one: a feature keeps its own per-connection state."""

    __slots__ = ("services", "id", "transport", "peer", "peer_ip", "closed", "session",
                 "claimed_sn", "nonce", "principal", "decoder", "out", "out_scheduled",
                 "last_seen", "connected_at", "_paused_for_write", "_admitted", "is_device",
                 "heartbeat", "heartbeat_answered_at", "close_reason", "tls",
                 "peer_max_frame", "__weakref__")

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
        self._paused_for_write = False
        self._admitted = False
        self.is_device = False       # registered in the online list
        self.heartbeat: Any = None   # its last HEARTBEAT (protocol.Heartbeat)
        self.heartbeat_answered_at: float | None = None   # monotonic (Devices' rate rule)
        self.close_reason = ""
        self.tls = tls
        self.peer_max_frame = 0      # largest frame the peer can receive (CONNECT); 0 = unstated
        self._start_intake()

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
        b.consumers.connection_closed(self)
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
                        dec, session, SCAN_LIMIT, _scan_sealed, session_pads(session))
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

    # -- dispatch ---------------------------------------------------------------------

    def _handle(self, frame: Any) -> None:
        """Let the session check ``frame`` (it raises SessionError), then act on it."""
        session = self.session
        was = session.state
        session.receive(frame)
        op = frame.opcode
        if was == ESTABLISHED:
            handler = self.services.handlers.get(op)
            if handler is not None:
                handler(self, frame)
            else:   # (allowed by the session, not served by this broker: FW_FETCH)
                self.send_error(ErrorCode.UNKNOWN_OPCODE,
                                f"{op_name(op)} is not served by this broker", frame.opaque)
        elif op == Op.DISCONNECT:
            self.close("client disconnect")
        elif op == Op.CONNECT:
            self._on_connect(frame)
        else:
            self._on_auth(frame)

    def _on_disconnect(self, frame: Any) -> None:
        self.close("client disconnect")

    def info(self) -> dict[str, Any]:
        """Admin view of the connection."""
        p = self.principal
        return {"conn": self.id, "peer": self.peer, "name": p.name if p else self.claimed_sn,
                "kind": p.kind if p else self.session.state_name().lower(),
                "since_ms": int(self.connected_at * 1000),
                "idle_s": round(time.monotonic() - self.last_seen, 3),
                "subscriptions": self.services.consumers.count(self)}


#: the connection's own part of the dispatch table (PUBLISH is ``intake.py``'s)
CONNECTION_HANDLERS = {Op.DISCONNECT: Connection._on_disconnect}

__all__ = ["CONNECTION_HANDLERS", "Connection", "Role"]
