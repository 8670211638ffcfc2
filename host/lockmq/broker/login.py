"""The handshake of a connection: CONNECT -> CHALLENGE, AUTH -> CONNECT_ACK (or the
refusal), the deadline that ends one not finished in time, and what a break of the
session's rules or a broken frame costs the peer.

The rules themselves -- which frame each state and role may send -- are the
protocol session's (``lockmq.protocol.ServerSession``); who a peer is, the guard's.
:class:`Handshake` is a part of :class:`~.connection.Connection` (a base class with
no state of its own): it acts on what those two answer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lockmq.protocol import (NO_SEQ, ConnectAck, ErrorCode, ProtocolError, Role, SessionError,
                             op_name)
from lockmq.security import SecurityError

if TYPE_CHECKING:   # (types only: the connection is built from this class)
    from .services import Services

_ROLE_OF_KIND = {"lock": Role.LOCK, "service": Role.SERVICE, "admin": Role.ADMIN}
_DEBUG = 10   # logging.DEBUG: the level of the per-connection connect line


class Handshake:
    """A connection's handshake (see the module docstring)."""

    __slots__ = ()

    if TYPE_CHECKING:   # (the connection's: declared there)
        services: Services
        principal: Any
        session: Any
        closed: bool
        id: int
        peer: str
        peer_ip: str
        claimed_sn: str
        nonce: bytes
        tls: bool
        peer_max_frame: int
        decoder: Any
        out: list[bytes]
        transport: Any

        def fatal(self, code: int, message: str, retry_after_ms: int = 0,
                  opaque: int = 0) -> None: ...

        def send_error(self, code: int, message: str, opaque: int, retry_after_ms: int = 0,
                       response: bool = True) -> None: ...

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
            self.send_error(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}",
                            frame.opaque)
        return True

    def _bad_input(self, exc: ProtocolError) -> None:
        self.services.stats.inc("bad_frames")
        self.services.guard.record_protocol_error(self.peer_ip, type(exc).__name__)
        self.services.log("bad_frame", conn=self.id, peer=self.peer, sn=self.claimed_sn,
                        code=exc.code, error=exc.message, level="warning")
        self.fatal(exc.code, exc.message)
