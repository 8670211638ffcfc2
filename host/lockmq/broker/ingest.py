"""The ingest: a plain-TCP listener whose new sockets are the compiled core's until
the lock's AUTH (issue #38).

In a reconnect storm every lock is a new socket, a CONNECT and an AUTH. Here the
compiled ingest (``lockmq._core.Ingest``, ``host/rust/src/ingest.rs``) owns the
listener: it accepts, reads a lock's CONNECT and sends the CHALLENGE (byte for byte the
Python session's: ``handshake.rs``), all in one call per loop wake-up for every socket
ready, with no transport, connection object or Python frame per socket.

Who owns a socket when (the one path back: :meth:`IngestServer._hand_back`):

1. accepted: the ingest's, not read until Python admits it -- the broker's connection
   cap and the guard's per-source limits (``connection.admission_refusal``, the
   one check). Refu Python's at once, and its :class:`~.connection.Connection`
   answers the refusal as any refused connection's;
2. admitted: the ingest's, with the guard's nonce (the one nonce book) and the
   handshake deadline (``broker.handshake_timeout_s``) running from the accept;
3. Python's, through :meth:`IngestServer._hand_back` -- a ``Connection`` on
   ``loop.connect_accepted_socket`` with the bytes the ingest read and the session so
   far (the CONNECT, the nonce, the CHALLENGE body) -- when the AUTH arrives (the guard
   decides it, in the session's one AUTH path, ``login.py``), when the CONNECT is one it
   does not serve (another role, a flag, a bad frame: the session refuses it as ever),
   at EOF or a socket error, and at the deadline (the connection's own
   ``_handshake_timeout``: same answer, same counters).

TLS listeners stay uvloop's. Without the compiled core there is no ingest and the
plain listener is uvloop's too.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING, Any, Callable

from lockmq import accel
from lockmq.security import SecurityError

if TYPE_CHECKING:   # (types only)
    from .services import Services

#: a connection.Connection (the server makes them: nothing else imports that module)
Connection = Any
#: the server's: a new Connection, and the one admission check (connection.py)
NewConnection = Callable[[], Connection]
Admission = Callable[["Services", str, int], "SecurityError | None"]

#: the compiled ingest (lockmq._core.Ingest), or None (pure Python)
INGEST_TYPE: Any = getattr(accel.speedups, "Ingest", None) if accel.COMPILED else None
#: sockets accepted at most per wake-up (the rest wait in the kernel's queue)
ACCEPT_MAX = 512


def _factory(conn: Connection) -> Callable[[], Connection]:
    """The protocol factory of one handed-back socket: ``conn`` itself."""
    return lambda: conn


class IngestServer:
    """A plain listener served by the compiled ingest; the part of ``asyncio.Server``
    the broker uses (``sockets``, ``close``, ``wait_closed``)."""

    def __init__(self, services: Services, sock: socket.socket, new_connection: NewConnection,
                 admission: Admission) -> None:
        self.services = services
        self.sockets = [sock]
        self._new = new_connection
        self._admission = admission
        guard = services.guard
        cfg = services.config.broker   # (max_frame and the broker id need a restart)
        self._core = INGEST_TYPE(sock.fileno(), min(guard.preauth_max_frame, cfg.max_frame),
                                 guard.broker_id or "", ACCEPT_MAX)
        #: fd -> (peer ip, port, accepted at (monotonic), nonce) of each socket the ingest holds
        self._held: dict[int, tuple[str, int, float, bytes]] = {}
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._attaching: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._loop.add_reader(self._core.fileno(), self._ready)

    @staticmethod
    def available() -> bool:
        """Is the compiled ingest built (and not switched off by LOCKMQ_PURE_PYTHON)?"""
        return INGEST_TYPE is not None

    @classmethod
    def listen(cls, services: Services, new_connection: NewConnection, admission: Admission,
               host: str, port: int, backlog: int) -> "IngestServer":
        """Listen on ``host``:``port`` (its first address) and serve it: plain
        connections made by ``new_connection``, admitted by ``admission``."""
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # (accepted inherit it)
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return cls(services, sock, new_connection, admission)

    @property
    def held(self) -> int:
        """Sockets the ingest holds now (in a handshake, not Python's yet)."""
        return len(self._held)

    # -- the loop's callback ------------------------------------------------------------

    def _ready(self) -> None:
        """Every ready socket served; the new ones admitted; the due ones handed back."""
        b = self.services
        core = self._core
        now = time.monotonic()
        accepted, back = core.poll(now)
        if accepted:
            conns = b.connections
            stats = b.stats
            for fd, ip, port in accepted:
                stats.inc("connections_accepted")
                # (counted with it: the connections, those the ingest holds, and those
                # handed back whose transport is not made yet)
                refusal = self._admission(b, ip, len(conns) + len(self._held)
                                          + len(self._attaching) + 1)
                if refusal is not None:
                    core.take(fd)
                    self._attach(fd, self._refused(ip, port, refusal))
                    continue
                nonce = b.guard.challenge()
                try:
                    core.admit(fd, nonce, now + b.config.broker.handshake_timeout_s)
                except OSError:   # (epoll refused it: the socket is dropped, as at a reset)
                    socket.socket(fileno=core.take(fd)).close()
                    b.guard.forget_challenge(nonce)
                    b.guard.release(ip)
                    stats.inc("connections_closed")
                    continue
                self._held[fd] = (ip, port, now, nonce)
        for fd, data, session, unsent, expired in back:
            self._hand_back(fd, data, session, unsent, expired, now)
        self._arm()

    def _arm(self) -> None:
        """A wake-up at the next handshake deadline (none while nothing is held)."""
        if self._timer is not None or self._closed:
            return
        due = self._core.next_deadline()
        if due is not None:
            self._timer = self._loop.call_at(
                self._loop.time() + max(0.0, due - time.monotonic()) + 0.01, self._timed)

    def _timed(self) -> None:
        self._timer = None
        self._ready()

    # -- the one path back ----------------------------------------------------------------

    def _refused(self, ip: str, port: int, refusal: SecurityError) -> Connection:
        conn = self._new()
        conn.from_ingest(ip, port, admitted=False, refusal=refusal)
        return conn

    def _hand_back(self, fd: int, data: bytes, session: tuple[bytes, bytes, bytes] | None,
                   unsent: bytes, expired: bool, now: float) -> None:
        """Socket ``fd`` is Python's: a :class:`Connection` with what the ingest read and
        sent (see the module docstring)."""
        ip, port, accepted_at, nonce = self._held.pop(fd)
        b = self.services
        c = b.stats.c
        c["ingest_handbacks"] += 1
        if session is not None:
            c["ingest_challenges"] += 1
        else:
            b.guard.forget_challenge(nonce)   # (not sent: the connection issues its own)
        conn = self._new()
        conn.from_ingest(ip, port, admitted=True, session=session, data=data, unsent=unsent,
                         expired=expired,
                         deadline_s=b.config.broker.handshake_timeout_s - (now - accepted_at))
        self._attach(fd, conn)

    def _attach(self, fd: int, conn: Connection) -> None:
        """``conn`` takes socket ``fd`` on a uvloop transport."""
        sock = socket.socket(fileno=fd)
        task = self._loop.create_task(self._connect(sock, conn))
        self._attaching.add(task)
        task.add_done_callback(self._attaching.discard)

    async def _connect(self, sock: socket.socket, conn: Connection) -> None:
        try:
            await self._loop.connect_accepted_socket(_factory(conn), sock)
        except (OSError, RuntimeError) as exc:   # (the peer reset it; the loop closing)
            sock.close()
            conn.connection_lost(exc)

    # -- asyncio.Server's part --------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting; drop the sockets still in a handshake (no answers)."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._loop.is_closed():
            self._loop.remove_reader(self._core.fileno())
        self._core.close()
        guard = self.services.guard
        for ip, _port, _at, nonce in self._held.values():
            guard.forget_challenge(nonce)
            guard.release(ip)
        self._held.clear()
        for sock in self.sockets:
            sock.close()

    async def wait_closed(self) -> None:
        """Closed at once (the hand-backs under way finish first)."""
        if self._attaching:
            await asyncio.gather(*self._attaching, return_exceptions=True)
