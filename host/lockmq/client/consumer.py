"""The asyncio consumer: one member of a consumer cluster, with a scaling worker pool.

The paper's consumption model (§2.1.3): all messages of a topic form one topic
queue; a consumer cluster subscribes to it; members compete for messages and may
join or leave at any time. This client

1. joins ``cluster`` on ``topic`` (SUBSCRIBE), and again after every reconnect;
2. pulls a batch when it has idle workers, and otherwise waits for the broker's
   NOTIFY — no busy polling;
3. hands each message to a worker running ``handler(message)``: a normal return
   acks it, an exception nacks it (the broker retries with backoff, then
   dead-letters it);
4. grows its worker pool between ``min_workers`` and ``max_workers`` from the
   cluster's backlog (:class:`~lockmq.client.autoscale.Autoscaler`).

Acks and nacks are gathered and sent once per event-loop turn. A lease taken on a
connection that has since dropped is forgotten: the broker released it when the
connection closed and will deliver the message again — which is why handlers
should be idempotent (:mod:`lockmq.client.idempotency`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import time
from typing import Any, Awaitable, Callable, Union

from lockmq.protocol import (
    Ack,
    ConnectAck,
    Nack,
    Notify,
    Op,
    Pull,
    Role,
    Subscribe,
    SubscribeAck,
    Unsubscribe,
    decode_json,
    encode_json,
)

from ._base import SessionClient, default_client_id
from ._conn import FrameConnection
from .autoscale import Autoscaler
from .errors import ClientClosed, ConnectionLost, LockmqError
from .inbox import Inbox
from .message import Message, messages_from_body
from .session import Credentials, Endpoint, error_from_body

log = logging.getLogger("lockmq.client.consumer")

Handler = Callable[[Message], Union[Awaitable[Any], Any]]


class AsyncConsumer(SessionClient):
    """A consumer-cluster member for asyncio programs.

    Args:
        endpoint: ``"host:port"`` or an :class:`Endpoint`.
        topic: the topic queue to consume.
        cluster: the consumer cluster to join (members share the work; each
            cluster on a topic gets every message).
        handler: ``handler(msg)``, a coroutine function or a plain function (run in
            a thread pool). Return = ack; raise = nack.
        min_workers, max_workers: bounds of the worker pool.
        target_per_worker: backlog per worker above which the pool grows.
        idle_shrink_s: idle time after which the pool gives back one worker.
        batch: most messages asked for by one PULL.
        prefetch: leased messages held locally beyond one per worker, so workers
            do not wait for a round trip (default ``batch``). They count against
            the broker's in-flight caps and lease timeout.
        ordered: ask the broker for per-lock ordering (one message per lock in
            flight in the whole cluster).
        lease_ms: visibility timeout to ask for (0 = the broker's default).
        max_inflight: per-member in-flight cap to ask for (0 = broker default).
        nack_delay_ms: retry delay sent with a nack (0 = the broker's backoff level).
        token / credentials: authentication.
        consumer_id: the SN field of this member's frames (default: generated).
        reconnect: reconnect and re-join after the link drops (default True).
        long_poll_ms: how long an empty PULL waits at the broker for messages.
        backlog_poll_s: how often the cluster's backlog is read from the broker
            (the ``clusters`` admin op) to size the worker pool; 0 = only from
            NOTIFY and full batches.
    """

    def __init__(
        self,
        endpoint: Endpoint | str | list[Endpoint] = "127.0.0.1:6800",
        *,
        topic: str,
        cluster: str,
        handler: Handler,
        min_workers: int = 1,
        max_workers: int = 8,
        target_per_worker: int = 50,
        idle_shrink_s: float = 5.0,
        batch: int = 32,
        prefetch: int | None = None,
        ordered: bool = False,
        lease_ms: int = 0,
        max_inflight: int = 0,
        nack_delay_ms: int = 0,
        token: str | None = None,
        credentials: Credentials | None = None,
        consumer_id: str | None = None,
        reconnect: bool = True,
        long_poll_ms: int = 1000,
        backlog_poll_s: float = 1.0,
    ) -> None:
        from lockmq.store.records import validate_cluster, validate_topic

        validate_topic(topic)       # ValueError naming the topic or the cluster, here,
        validate_cluster(cluster)   # not a refusal of a client id nobody gave
        super().__init__(endpoint, client_id=consumer_id or default_client_id(cluster),
                         role=Role.SERVICE, credentials=credentials, token=token,
                         reconnect=reconnect)
        self.topic = topic
        self.cluster = cluster
        self.handler = handler
        self._is_coro = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None))
        self.autoscaler = Autoscaler(min_workers, max_workers, target_per_worker, idle_shrink_s)
        self.batch = max(1, min(batch, 0xFFFF))
        self.prefetch = self.batch if prefetch is None else max(0, prefetch)
        self.ordered = ordered
        self.lease_ms = lease_ms
        self.max_inflight = max_inflight
        self.nack_delay_ms = nack_delay_ms
        self.sub_id = 0
        self.backlog = 0
        self.cluster_info: dict[str, Any] = {}
        self.long_poll_ms = long_poll_ms
        self.backlog_poll_s = backlog_poll_s
        self._local_backlog = 0
        self._backlog_known = False
        self._backlog_forbidden = False
        self.generation = 0
        self._inbox: Inbox[Message] = Inbox()
        self._workers: set[asyncio.Task] = set()
        self._idle: set[asyncio.Task] = set()
        self._target_workers = min_workers
        self._busy = 0
        self._want_more = asyncio.Event()
        self._notified = asyncio.Event()
        self._subscribed = asyncio.Event()
        self._acks: list[tuple[int, int]] = []
        self._ack_sub = 0
        self._ack_flush_scheduled = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stopping = False
        self._start_task: asyncio.Task | None = None
        self.stats = {"received": 0, "acked": 0, "nacked": 0, "dropped_leases": 0,
                      "ack_errors": 0, "pulls": 0, "notifies": 0}

    # -- public -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, join the cluster and start the workers (returns at once after)."""
        if self._stopping:
            raise ClientClosed("consumer is stopped")
        if not self._is_coro and self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self.autoscaler.max_workers, thread_name_prefix=f"lockmq-{self.cluster}")
        self._start_task = asyncio.current_task()
        try:
            await self.connect()
        finally:
            self._start_task = None
        for _ in range(self._target_workers):
            self._start_worker()
        self._spawn(self._scale_loop())

    async def run(self, stop: asyncio.Event | None = None, duration_s: float | None = None) -> None:
        """Start, then consume until ``stop`` is set, ``duration_s`` passes, or cancelled."""
        await self.start()
        try:
            waiter = asyncio.Event() if stop is None else stop
            await asyncio.wait_for(waiter.wait(), duration_s)
        except asyncio.TimeoutError:
            pass
        finally:
            await self.stop()

    async def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Leave the cluster: finish messages being handled, ack them, disconnect.

        Messages fetched but not started are released by the broker when the
        connection closes, and go to other members.
        """
        if self.closing:
            return
        self._stopping = True
        start = self._start_task
        if start is not None and start is not asyncio.current_task():
            # still connecting (maybe retrying an absent broker): give that up first,
            # so no session opens after this stop
            start.cancel()
            await asyncio.gather(start, return_exceptions=True)
        self._want_more.set()
        self._inbox.clear()
        deadline = time.monotonic() + drain_timeout_s
        while self._busy and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._flush_acks()
        conn = self.conn
        if conn is not None and conn.is_open and self.sub_id:
            try:
                await asyncio.wait_for(conn.request(Op.UNSUBSCRIBE, Unsubscribe(self.sub_id).encode()), 2)
            except (LockmqError, asyncio.TimeoutError):
                pass
        for task in list(self._workers):
            task.cancel()
        await self.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def workers(self) -> int:
        """Worker tasks running now."""
        return len(self._workers)

    @property
    def busy(self) -> int:
        """Workers inside the handler right now."""
        return self._busy

    # -- session -------------------------------------------------------------------------------
    async def _on_connected(self, conn: FrameConnection, ack: ConnectAck) -> None:
        self.generation += 1
        self._subscribed.clear()
        flags = Subscribe.ORDERED if self.ordered else 0
        frame = await conn.request(Op.SUBSCRIBE, Subscribe(
            self.topic, self.cluster, flags, min(self.max_inflight, 0xFFFF), self.lease_ms).encode())
        if frame.opcode == Op.ERROR:
            raise error_from_body(frame.body)
        sack = SubscribeAck.decode(frame.body)
        self.sub_id = sack.sub_id
        self.backlog = sack.backlog
        self._local_backlog = max(self._local_backlog, sack.backlog)
        self._subscribed.set()
        self._spawn(self._fetch_loop(conn, self.generation))

    def _on_disconnected(self) -> None:
        self.stats["dropped_leases"] += self._inbox.clear()
        self._acks.clear()
        self._notified.set()

    def _on_frame(self, frame: Any) -> None:
        if frame.opcode == Op.NOTIFY:
            note = Notify.decode(frame.body)
            if note.sub_id == self.sub_id:
                self.backlog = note.available
                self.stats["notifies"] += 1
                self._notified.set()
        elif frame.opcode == Op.ERROR:
            log.warning("broker: %s", error_from_body(frame.body))

    # -- fetching ----------------------------------------------------------------------------
    def _local(self) -> int:
        return len(self._inbox) + self._busy

    async def _fetch_loop(self, conn: FrameConnection, generation: int) -> None:
        """Pull while workers are idle or about to be; when the queue is empty, the
        next PULL waits at the broker (long poll, ``long_poll_ms``) until messages
        arrive — no busy polling."""
        long_poll = False
        while conn.is_open and not self._stopping and generation == self.generation:
            workers = max(len(self._workers), self._target_workers)
            local = self._local()
            if local > workers + self.prefetch // 2:
                self._want_more.clear()
                await self._want_more.wait()
                continue
            self._notified.clear()
            want = max(1, min(self.batch, workers + self.prefetch - local))
            wait_ms = self.long_poll_ms if long_poll else 0
            try:
                frame = await conn.request(Op.PULL, Pull(self.sub_id, want, wait_ms).encode())
            except ConnectionLost:
                return
            self.stats["pulls"] += 1
            if frame.opcode == Op.ERROR:
                err = error_from_body(frame.body)
                log.warning("pull refused: %s", err)
                await asyncio.sleep(max(0.05, err.retry_after_ms / 1000))
                continue
            batch = messages_from_body(frame.body, self.sub_id, generation)
            self._inbox.put_many(batch)
            self.stats["received"] += len(batch)
            long_poll = not batch
            # Without the broker's figure, full batches in a row mean the queue is
            # not draining: count them as backlog; a short batch means it drained.
            if len(batch) >= want:
                self._local_backlog += len(batch)
            else:
                self._local_backlog = 0

    # -- workers -----------------------------------------------------------------------------
    def _start_worker(self) -> None:
        task = asyncio.get_running_loop().create_task(self._worker())
        self._workers.add(task)
        task.add_done_callback(self._workers.discard)
        self._want_more.set()

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        inbox = self._inbox
        waiting = inbox.items
        while not self._stopping:
            if len(self._workers) > self._target_workers:
                return  # retired by the autoscaler
            if waiting:   # a fetched message is usually waiting: take it without a coroutine
                msg = waiting.popleft()
            else:
                me = asyncio.current_task()
                self._idle.add(me)  # type: ignore[arg-type]
                try:
                    msg = await inbox.get()
                finally:
                    self._idle.discard(me)  # type: ignore[arg-type]
            self._busy += 1
            try:
                if msg._generation != self.generation:
                    self.stats["dropped_leases"] += 1
                    continue
                try:
                    if self._is_coro:
                        await self.handler(msg)
                    else:
                        await loop.run_in_executor(self._executor, self.handler, msg)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - any handler failure is a nack
                    log.info("handler failed on %s (delivery %d): %r", msg.id, msg.delivery, exc)
                    self._nack(msg, exc)
                else:
                    self._ack(msg)
            finally:
                self._busy -= 1
                self._want_more.set()

    def _ack(self, msg: Message) -> None:
        if msg._generation != self.generation or msg._sub_id != self.sub_id:
            self.stats["dropped_leases"] += 1
            return
        self._acks.append(msg.lease)
        self._ack_sub = msg._sub_id
        if not self._ack_flush_scheduled:
            self._ack_flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        self._ack_flush_scheduled = False
        acks, self._acks = self._acks, []
        conn = self.conn
        if not acks or conn is None or not conn.is_open:
            return
        n = len(acks)
        for i in range(0, n, 4096):
            chunk = acks[i:i + 4096]
            try:
                fut = conn.request(Op.ACK, Ack(self._ack_sub, chunk).encode())
            except LockmqError:
                return
            fut.add_done_callback(lambda f, k=len(chunk): self._on_ack_reply(f, k))

    def _on_ack_reply(self, fut: asyncio.Future, count: int) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # link lost: the broker redelivers these
        frame = fut.result()
        if frame.opcode == Op.ERROR:
            self.stats["ack_errors"] += count
            log.warning("ack refused: %s", error_from_body(frame.body))
        else:
            self.stats["acked"] += count

    def _nack(self, msg: Message, exc: BaseException) -> None:
        conn = self.conn
        if msg._generation != self.generation or conn is None or not conn.is_open:
            self.stats["dropped_leases"] += 1
            return
        reason = f"{type(exc).__name__}: {exc}"[:500]
        try:
            fut = conn.request(Op.NACK, Nack(msg._sub_id, [msg.lease], self.nack_delay_ms,
                                             reason).encode())
        except LockmqError:
            return
        self.stats["nacked"] += 1
        fut.add_done_callback(self._on_nack_reply)

    def _on_nack_reply(self, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        frame = fut.result()
        if frame.opcode == Op.ERROR:
            log.warning("nack refused: %s", error_from_body(frame.body))

    # -- scaling -------------------------------------------------------------------------------
    async def _scale_loop(self, every_s: float = 0.25) -> None:
        next_poll = 0.0
        while not self._stopping:
            await asyncio.sleep(every_s)
            now = time.monotonic()
            if now >= next_poll and self.backlog_poll_s > 0:
                next_poll = now + self.backlog_poll_s
                await self._poll_backlog()
            backlog = (self.backlog if self._backlog_known else self._local_backlog) \
                + len(self._inbox)
            target = self.autoscaler.decide(self._target_workers, backlog, self._busy, now)
            if target != self._target_workers:
                log.debug("workers %d -> %d (backlog %d)", self._target_workers, target, backlog)
            self._target_workers = target
            while len(self._workers) < target:
                self._start_worker()
            if len(self._workers) > target:
                # Idle workers blocked on the queue would never see the new target:
                # cancel the surplus that is waiting, busy ones retire after their message.
                surplus = len(self._workers) - target
                for task in list(self._idle)[:surplus]:
                    self._idle.discard(task)
                    task.cancel()

    async def _poll_backlog(self) -> None:
        """Ask the broker for the cluster's backlog (the ``clusters`` admin op)."""
        conn = self.conn
        if conn is None or not conn.is_open or self._backlog_forbidden:
            return
        try:
            frame = await asyncio.wait_for(conn.request(
                Op.ADMIN_REQUEST, encode_json({"op": "clusters",
                                               "args": {"cluster": self.cluster}})), 5)
        except (LockmqError, asyncio.TimeoutError):
            return
        if frame.opcode != Op.ADMIN_RESPONSE:
            self._backlog_forbidden = True
            return
        resp = decode_json(frame.body)
        if resp.get("ok") is False:
            self._backlog_forbidden = resp.get("error") == "FORBIDDEN"
            return
        for info in resp.get("clusters", []):
            if info.get("name") == self.cluster and info.get("topic") == self.topic:
                self.backlog = int(info.get("unread", 0)) + int(info.get("ready", 0))
                self.cluster_info = info
                self._backlog_known = True

    async def __aenter__(self) -> "AsyncConsumer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

