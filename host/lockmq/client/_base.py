"""What every long-lived client connection shares: connect, heartbeat, reconnect.

:class:`SessionClient` owns one authenticated connection at a time. When it drops
(broker restart, network cut) the client reconnects with jittered exponential
backoff and calls :meth:`SessionClient._on_connected` again, where the producer
retransmits unacknowledged messages and the consumer re-subscribes. Every link
failure funnels into one place (:meth:`_on_lost`), as mqtt_as does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket

from lockmq.protocol import ConnectAck, Disconnect, Flag, Op

from ._conn import FrameConnection
from .backoff import Backoff
from .errors import AuthError, BusyError, ClientClosed, ConnectionLost, LockmqError
from .session import Credentials, Endpoint, open_session, parse_endpoints

log = logging.getLogger("lockmq.client")


def default_client_id(name: str) -> str:
    """``name-host-pid-random``: unique per process, so sequence numbers starting at
    0 again after a restart never collide with an earlier run's message ids. Characters
    an id may not hold (a cluster name's ``$``, ``%``) become ``-``: an id the caller
    never chose must never be the reason a connect is refused."""
    host = socket.gethostname().split(".")[0][:16]
    base = re.sub(r"[^A-Za-z0-9._-]", "-", name[:20]).lstrip("._-") or "client"
    host = re.sub(r"[^A-Za-z0-9._-]", "-", host) or "host"
    return f"{base}-{host}-{os.getpid()}-{os.urandom(3).hex()}"


class SessionClient:
    """Base of the producer, consumer and admin clients (asyncio).

    Args:
        endpoint: the broker (``"host:port"`` or an :class:`Endpoint`), or a broker
            list ``"host1:port,host2:port"`` (a primary and its standby).
        client_id: the SN field of this client's frames.
        role: :class:`lockmq.protocol.Role` value.
        credentials: how to authenticate (default: token from ``token``).
        token: a service token (ignored when ``credentials`` is given).
        reconnect: reconnect after the link drops (default True).
        backoff: reconnect delays (default 50 ms doubling to 5 s, jittered).
    """

    def __init__(
        self,
        endpoint: Endpoint | str | list[Endpoint] = "127.0.0.1:6800",
        *,
        client_id: str,
        role: int,
        credentials: Credentials | None = None,
        token: str | None = None,
        reconnect: bool = True,
        backoff: Backoff | None = None,
    ) -> None:
        #: the brokers to try in turn ("host1:port,host2:port"): the next one after
        #: a failed connect (e.g. a dead primary, a standby that is not promoted yet)
        self.endpoints = parse_endpoints(endpoint)
        self._endpoint_i = 0   # the list position of ``endpoint`` (a list may repeat one)
        self.endpoint = self.endpoints[0]
        self.client_id = client_id
        self.role = role
        self.credentials = credentials or Credentials.token(token or os.environ.get("LOCKMQ_TOKEN"))
        self.reconnect = reconnect
        self.backoff = backoff or Backoff()
        self.conn: FrameConnection | None = None
        self.connect_ack: ConnectAck | None = None
        self.connected = asyncio.Event()
        self.closing = False
        self.reconnects = 0
        #: attempts the first connect made (1 when the broker was there at once)
        self.connect_attempts = 0
        self._tasks: set[asyncio.Task] = set()
        self._reconnect_task: asyncio.Task | None = None
        self._heartbeat_task: asyncio.Task | None = None

    # -- lifecycle ---------------------------------------------------------------------
    async def connect(self) -> None:
        """Open the first session.

        A broker that is not there yet (refused, reset, handshake timeout, BUSY) is
        retried with the client's backoff for up to ``endpoint.connect_retry_s``, so
        a service may start before its broker. Raises the last error after that, and
        at once when the broker refuses the credentials or TLS fails.
        """
        if self.closing:
            raise ClientClosed("client is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.endpoint.connect_retry_s
        while True:
            self.connect_attempts += 1
            try:
                if not await self._open():
                    raise ConnectionLost("connection dropped right after the handshake")
                return
            except (ConnectionLost, BusyError, asyncio.TimeoutError) as exc:
                if self.conn is not None or self.closing:   # dropped after it was up
                    raise
                delay = max(self.backoff.next_delay(),
                            getattr(exc, "retry_after_ms", 0) / 1000)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise
                # the last wait is cut to the deadline, and one more try made there:
                # connect_retry_s=4 keeps trying for 4 s, not until the backoff says
                delay = min(delay, remaining)
                # the first one on stderr (logging's last resort), the rest at INFO
                log.log(logging.WARNING if self.connect_attempts == 1 else logging.INFO,
                        "broker %s:%d not reachable yet (%s); retrying for up to %g s",
                        self.endpoint.host, self.endpoint.port,
                        exc or "handshake timed out", self.endpoint.connect_retry_s)
                await asyncio.sleep(delay)

    async def _open(self) -> bool:
        """Open a session and resume; True when it is up at the end."""
        try:
            conn, ack = await open_session(
                self.endpoint, self.client_id, self.role, self.credentials,
                on_frame=self._dispatch, on_lost=self._on_lost,
            )
        except (ConnectionLost, BusyError, asyncio.TimeoutError):
            self._next_endpoint()
            raise
        self.conn = conn
        self.connect_ack = ack
        self.backoff.reset()
        conn.dispatch_early()
        self._heartbeat_task = self._spawn(self._heartbeat(conn, max(1, ack.heartbeat_s or 30)))
        try:
            await self._on_connected(conn, ack)
        except (ConnectionLost, OSError):
            return False
        except BaseException:
            # Refused while resuming (e.g. FORBIDDEN on SUBSCRIBE): do not leave a
            # half-open session behind.
            self.conn = None
            if self._heartbeat_task is not None:
                self._heartbeat_task.cancel()
            conn.on_lost = None
            conn.close()
            raise
        if not conn.is_open:
            return False
        self.connected.set()
        return True

    def _next_endpoint(self) -> None:
        """Move on to the next broker of the list (after a failed connect)."""
        self._endpoint_i = (self._endpoint_i + 1) % len(self.endpoints)
        self.endpoint = self.endpoints[self._endpoint_i]

    async def close(self) -> None:
        """Say goodbye to the broker and stop every background task."""
        if self.closing:
            return
        self.closing = True
        self.connected.clear()
        conn = self.conn
        if conn is not None and conn.is_open:
            try:
                conn.send(Op.DISCONNECT, Disconnect(0, "client closing").encode())
            except LockmqError:
                pass
            conn.close()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in self._tasks if t is not current), return_exceptions=True)
        self._on_closed()

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until a session is open (after a reconnect, for instance)."""
        await asyncio.wait_for(self.connected.wait(), timeout)

    # -- hooks for subclasses ----------------------------------------------------------------
    async def _on_connected(self, conn: FrameConnection, ack: ConnectAck) -> None:
        """A session opened (first time or after a reconnect)."""

    def _on_disconnected(self) -> None:
        """The session dropped; a reconnect may follow."""

    def _on_closed(self) -> None:
        """The client was closed for good: fail whatever still waits."""

    def _on_frame(self, frame: object) -> None:
        """A frame that answers no pending request (NOTIFY, COMMAND ...)."""

    # -- internals ------------------------------------------------------------------------
    def _spawn(self, coro) -> asyncio.Task:  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _dispatch(self, frame: object) -> None:
        if getattr(frame, "opcode", None) == Op.DISCONNECT:
            try:
                info = Disconnect.decode(frame.body)  # type: ignore[attr-defined]
                log.info("broker disconnects us: %s (%d)", info.message, info.code)
            except Exception:  # noqa: BLE001
                pass
            return
        self._on_frame(frame)

    def _on_lost(self, exc: BaseException | None) -> None:
        self.connected.clear()
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        self._on_disconnected()
        if self.closing or not self.reconnect:
            return
        if self._reconnect_task is None or self._reconnect_task.done():
            self._reconnect_task = self._spawn(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        while not self.closing:
            delay = self.backoff.next_delay()
            await asyncio.sleep(delay)
            try:
                if not await self._open():
                    continue
            except AuthError as exc:
                log.error("reconnect refused: %s", exc)
                await asyncio.sleep(self.backoff.cap_s)
                continue
            except (LockmqError, OSError, asyncio.TimeoutError) as exc:
                log.info("reconnect to %s:%d failed: %s", self.endpoint.host, self.endpoint.port, exc)
                continue
            self.reconnects += 1
            log.info("reconnected to %s:%d", self.endpoint.host, self.endpoint.port)
            return

    async def _heartbeat(self, conn: FrameConnection, every_s: float) -> None:
        interval = max(0.5, every_s / 2)
        while conn.is_open:
            await asyncio.sleep(interval)
            if conn.is_open:
                try:
                    conn.send(Op.HEARTBEAT, b"", 0, Flag.ONEWAY)
                except LockmqError:
                    return

    def _require_conn(self) -> FrameConnection:
        conn = self.conn
        if self.closing:
            raise ClientClosed("client is closed")
        if conn is None or not conn.is_open:
            raise ConnectionLost("not connected to the broker")
        return conn
