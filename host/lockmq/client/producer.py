"""The asyncio producer: RocketMQ's three send modes over one connection.

* :meth:`AsyncProducer.send` — **sync**: returns once the broker acknowledged (the
  message is stored per the broker's durability policy).
* :meth:`AsyncProducer.send_async` — **async**: returns a future at once; many
  messages are in flight, and each PUBLISH_ACK is matched to its future by the
  frame's ``opaque``. An optional callback runs when the future resolves.
* :meth:`AsyncProducer.send_oneway` — **oneway**: no ack is asked for; the message
  is lost if the link drops before the broker reads it.

Every message gets the id ``(producer_id, seq)``. Until it is acknowledged the
producer keeps it; after a reconnect it retransmits every unacknowledged message
with the *same* id, and the broker stores a retransmission once. When the broker
answers BUSY, the message is sent again after the broker's ``retry_after_ms``.
A message that cannot be acknowledged within ``send_timeout_s`` fails with
:class:`asyncio.TimeoutError`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

from lockmq.protocol import (
    Command,
    CommandResult,
    CommandStatus,
    ConnectAck,
    Flag,
    Op,
    Publish,
    PublishAck,
    Role,
)

from ._base import SessionClient, default_client_id
from ._conn import FrameConnection
from .scheduled import cancel_body, command_at_body, due_ms, publish_at_body, scheduled_id_of
from .events import CommandStatus as Status
from .errors import BrokerError, BusyError, ClientClosed, CommandError, LockmqError
from .session import Credentials, Endpoint, error_from_body


@dataclass(frozen=True)
class SendResult:
    """The broker's acknowledgement of one message.

    Attributes:
        message_id: ``producer_id:seq``.
        seq: the producer's sequence number.
        offset: where the broker stored it (commit-log offset).
        duplicate: the broker had it already (a retransmission).
    """

    message_id: str
    seq: int
    offset: int
    duplicate: bool


class _Pending:
    __slots__ = ("seq", "body", "future", "deadline", "callback", "retry_handle", "opcode")

    def __init__(self, seq: int, body: bytes, future: asyncio.Future, deadline: float,
                 callback: Callable[[asyncio.Future], None] | None) -> None:
        self.seq = seq
        self.body = body
        self.future = future
        self.deadline = deadline
        self.callback = callback
        self.retry_handle: asyncio.TimerHandle | None = None
        self.opcode = Op.PUBLISH      # PUBLISH_AT for a scheduled message (scheduled.py)


@dataclass(frozen=True)
class CommandOutcome:
    """What a lock answered to a downlink command."""

    target: str
    cmd_id: int
    #: by its one name as text (``str(outcome.status)`` is ``"ok"``, ``"refused"`` ...)
    status: Status
    detail: str

    @property
    def ok(self) -> bool:
        """The lock carried the command out."""
        return self.status == CommandStatus.OK


_STATUS_REASON = {
    CommandStatus.FAILED: "failed",
    CommandStatus.REFUSED: "refused",
    CommandStatus.EXPIRED: "expired",
    CommandStatus.OFFLINE: "offline",
    CommandStatus.UNSUPPORTED: "unsupported",
}


class AsyncProducer(SessionClient):
    """Publish messages to a broker from asyncio code.

    Args:
        endpoint: ``"host:port"`` or an :class:`Endpoint` (default 127.0.0.1:6800).
        producer_id: the SN field of this producer's messages; by default
            ``name`` plus host, pid and a random suffix.
        name: prefix of the default ``producer_id``.
        token / credentials: authentication (see :class:`SessionClient`).
        send_timeout_s: give up on a message not acknowledged by then.
        max_in_flight: unacknowledged messages this producer holds at most;
            beyond it :meth:`send_async` raises :class:`BusyError`.
        start_seq: first sequence number (default 0).
        role: the CONNECT role (SERVICE; the simulator connects as LOCK).
    """

    def __init__(
        self,
        endpoint: Endpoint | str | list[Endpoint] = "127.0.0.1:6800",
        *,
        producer_id: str | None = None,
        name: str = "producer",
        token: str | None = None,
        credentials: Credentials | None = None,
        send_timeout_s: float = 30.0,
        max_in_flight: int = 10_000,
        start_seq: int = 0,
        role: int = Role.SERVICE,
        reconnect: bool = True,
    ) -> None:
        super().__init__(endpoint, client_id=producer_id or default_client_id(name), role=role,
                         credentials=credentials, token=token, reconnect=reconnect)
        self.producer_id = self.client_id
        self.send_timeout_s = send_timeout_s
        self.max_in_flight = max_in_flight
        self._seq = start_seq
        self._pending: dict[int, _Pending] = {}
        self._sweeper: asyncio.Task | None = None
        self.stats = {"sent": 0, "acked": 0, "duplicates": 0, "busy_retries": 0,
                      "retransmits": 0, "failed": 0, "oneway": 0}

    # -- the three send modes --------------------------------------------------------
    async def send(self, topic: str, payload: bytes, lock_ts_ms: int = 0,
                   **when: Any) -> SendResult:
        """Sync send: publish and wait for the broker's acknowledgement.
        ``deliver_at=`` / ``delay=`` / ``level=``: a scheduled message (see
        :meth:`send_async`)."""
        return await self.send_async(topic, payload, lock_ts_ms, **when)

    def send_async(
        self,
        topic: str,
        payload: bytes,
        lock_ts_ms: int = 0,
        callback: Callable[[asyncio.Future], None] | None = None,
        *,
        deliver_at: float | datetime | None = None,
        delay: float | None = None,
        level: int | None = None,
    ) -> asyncio.Future:
        """Async send: publish now, return a future of :class:`SendResult`.

        ``callback(future)`` runs when the future resolves (ack or failure).
        ``deliver_at`` (datetime or epoch seconds), ``delay`` (seconds) or ``level``
        (RocketMQ delay level 1..18): the broker stores the message now and writes it
        to ``topic`` when due; the result's ``offset`` is then its schedule id (for
        :meth:`cancel_scheduled`; also for a retransmission while the message waits, 0
        once it was delivered or cancelled).
        """
        at_ms = due_ms(deliver_at, delay, level)
        if self.closing:
            raise ClientClosed("producer is closed")
        if len(self._pending) >= self.max_in_flight:
            raise BusyError(0, 0, f"{len(self._pending)} messages in flight in this producer "
                                  "(max_in_flight); await send() or flush() first", "LOCAL_BUSY")
        seq = self._next_seq()
        loop = asyncio.get_running_loop()
        body = Publish(topic, seq, lock_ts_ms, bytes(payload)).encode() if at_ms is None \
            else publish_at_body(topic, seq, lock_ts_ms, at_ms, payload)
        fut = loop.create_future()
        p = _Pending(seq, body, fut, loop.time() + self.send_timeout_s, callback)
        if at_ms is not None:
            p.opcode = Op.PUBLISH_AT
        if callback is not None:
            fut.add_done_callback(callback)
        self._pending[seq] = p
        self.stats["sent"] += 1
        self._transmit(p)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = self._spawn(self._sweep())
        return fut

    def send_oneway(self, topic: str, payload: bytes, lock_ts_ms: int = 0) -> None:
        """Oneway send: no ack is requested (fire and forget).

        Raises :class:`ConnectionLost` when there is no connection right now.
        """
        conn = self._require_conn()
        seq = self._next_seq()
        conn.send(Op.PUBLISH, Publish(topic, seq, lock_ts_ms, bytes(payload)).encode(),
                  0, Flag.ONEWAY)
        self.stats["oneway"] += 1

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every message sent so far is acknowledged or failed."""
        futs = [p.future for p in self._pending.values()]
        if futs:
            await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), timeout)

    @property
    def in_flight(self) -> int:
        """Messages sent and not yet acknowledged."""
        return len(self._pending)

    # -- downlink commands ----------------------------------------------------------------
    async def command(
        self,
        target: str,
        kind: int,
        args: bytes = b"",
        expires_in_s: float = 60.0,
        timeout_s: float | None = None,
    ) -> CommandOutcome:
        """Send a command to lock ``target`` and wait for the lock's answer.

        The broker holds the command while the lock is offline, up to the expiry.
        Raises :class:`CommandError` when the lock refused it or the broker gave up
        (``offline`` past the expiry, ``forbidden``, ``expired``).
        """
        conn = self._require_conn()
        expires_ms = int((time.time() + expires_in_s) * 1000)
        fut = conn.request(Op.COMMAND, Command(target, 0, expires_ms, kind, bytes(args)).encode())
        wait = timeout_s if timeout_s is not None else expires_in_s + 10.0
        try:
            frame = await asyncio.wait_for(fut, wait)
        except asyncio.TimeoutError:
            raise CommandError("timeout", f"no answer from {target} within {wait:.0f} s") from None
        if frame.opcode == Op.ERROR:
            err = error_from_body(frame.body)
            raise CommandError(err.name.lower(), err.detail)
        res = CommandResult.decode(frame.body)
        outcome = CommandOutcome(res.target, res.cmd_id, Status(res.status), res.detail)
        if res.status != CommandStatus.OK:
            raise CommandError(_STATUS_REASON.get(res.status, str(res.status)), res.detail)
        return outcome

    async def schedule_command(self, target: str, kind: int, args: bytes = b"", *,
                               not_before: float | datetime | None = None,
                               delay: float | None = None, level: int | None = None,
                               expires_in_s: float = 0.0) -> int:
        """Schedule a command for lock ``target``: durable at the broker, it enters the
        command path at ``not_before`` (or after ``delay`` s / delay ``level``).
        Returns the schedule id. ``expires_in_s`` counts from ``not_before`` (0: the
        broker's default expiry). Rights are checked now (CommandError ``forbidden``);
        the lock's answer is in the broker's ``scheduled.list`` and log."""
        at_ms = due_ms(not_before, delay, level)
        if at_ms is None:
            raise ValueError("give not_before, delay or level (or use command())")
        expires_ms = at_ms + int(expires_in_s * 1000) if expires_in_s else 0
        frame = await self._require_conn().request(
            Op.COMMAND_AT, command_at_body(target, kind, args, at_ms, expires_ms))
        if frame.opcode == Op.ERROR:
            err = error_from_body(frame.body)
            raise CommandError(err.name.lower(), err.detail)
        return scheduled_id_of(frame.opcode, frame.body)

    async def cancel_scheduled(self, schedule_id: int) -> None:
        """Cancel a waiting scheduled message or command of this producer's principal;
        raises :class:`BrokerError` when it is unknown, delivered or not yours."""
        frame = await self._require_conn().request(Op.SCHEDULE_CANCEL, cancel_body(schedule_id))
        if frame.opcode == Op.ERROR:
            raise error_from_body(frame.body)

    # -- internals ----------------------------------------------------------------------
    def _next_seq(self) -> int:
        seq = self._seq
        self._seq = (seq + 1) & 0xFFFFFFFF
        return seq

    def _transmit(self, p: _Pending) -> None:
        p.retry_handle = None
        conn = self.conn
        if conn is None or not conn.is_open or p.future.done():
            return  # retransmitted by _on_connected after the reconnect
        try:
            reply = conn.request(p.opcode, p.body)
        except LockmqError:
            return
        reply.add_done_callback(lambda f, p=p: self._on_reply(p, f))

    def _on_reply(self, p: _Pending, reply: asyncio.Future) -> None:
        if p.future.done() or reply.cancelled():
            return
        exc = reply.exception()
        if exc is not None:
            return  # link lost: kept in _pending, retransmitted after reconnect
        frame = reply.result()
        if frame.opcode == Op.PUBLISH_ACK:
            ack = PublishAck.decode(frame.body)
            self._pending.pop(p.seq, None)
            dup = ack.status == PublishAck.DUPLICATE
            self.stats["acked"] += 1
            self.stats["duplicates"] += dup
            p.future.set_result(SendResult(f"{self.producer_id}:{p.seq}", p.seq, ack.offset, dup))
            return
        if frame.opcode == Op.ERROR:
            err = error_from_body(frame.body)
        else:
            err = BrokerError(0, 0, f"unexpected answer {frame!r} to PUBLISH")
        loop = asyncio.get_running_loop()
        if isinstance(err, BusyError) and err.retry_after_ms > 0:
            delay = err.retry_after_ms / 1000
            if loop.time() + delay < p.deadline:
                self.stats["busy_retries"] += 1
                p.retry_handle = loop.call_later(delay, self._transmit, p)
                return
        self._fail(p, err)

    def _fail(self, p: _Pending, exc: BaseException) -> None:
        self._pending.pop(p.seq, None)
        if p.retry_handle is not None:
            p.retry_handle.cancel()
        if not p.future.done():
            self.stats["failed"] += 1
            p.future.set_exception(exc)

    async def _on_connected(self, conn: FrameConnection, ack: ConnectAck) -> None:
        if self._pending:
            self.stats["retransmits"] += len(self._pending)
            for p in sorted(self._pending.values(), key=lambda x: x.seq):
                if p.retry_handle is None:
                    self._transmit(p)

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await asyncio.sleep(0.25)
            now = loop.time()
            for p in [p for p in self._pending.values() if p.deadline <= now]:
                self._fail(p, asyncio.TimeoutError(
                    f"message {self.producer_id}:{p.seq} not acknowledged within "
                    f"{self.send_timeout_s:.0f} s"))

    async def close(self, flush_timeout_s: float | None = 10.0) -> None:
        """Wait up to ``flush_timeout_s`` for unacknowledged messages (0/None: do not
        wait), then disconnect; messages still unacknowledged fail with
        :class:`ClientClosed` (they may or may not have been stored)."""
        if flush_timeout_s and self._pending and not self.closing:
            try:
                await self.flush(flush_timeout_s)
            except asyncio.TimeoutError:
                pass
        await super().close()

    def _on_closed(self) -> None:
        for p in list(self._pending.values()):
            self._fail(p, ClientClosed("producer closed before the broker acknowledged"))

    async def __aenter__(self) -> "AsyncProducer":
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
