"""The broker core: the store, the consumer clusters, system records and timers.

Connections (``connection.py``) hand decoded requests to :class:`BrokerCore`; the
core stores them (``lockmq.store``), and the store's ``on_durable`` callback drives
the dispatcher (``clusters.py``): socket -> decoder -> core -> store -> clusters ->
consumer connections. Nothing here touches a socket.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable

from lockmq.config import Config
from lockmq.store import Appended, NewRecord, Store, StoredRecord
from lockmq.store.records import validate_cluster, validate_topic

from .clusters import DLQ_PREFIX, RETRY_PREFIX, Cluster, ClusterError, ClusterSettings
from .logs import EventLog, Stats
from .readcache import ReadCache

#: The SN under which the broker writes its own records ($devices, retries, dead letters).
BROKER_SN = "$broker"
MAX_SEQ = 0xFFFFFFFF


class BrokerCore:
    """Owns the store and the clusters; see the module docstring."""

    def __init__(self, config: Config, log: EventLog, stats: Stats) -> None:
        self.config = config
        self.log = log
        self.stats = stats
        self.store: Store | None = None
        self.clusters: dict[str, Cluster] = {}
        self.by_topic: dict[str, list[Cluster]] = {}
        c = config.consumers
        self.settings = ClusterSettings(
            visibility_timeout_ms=c.visibility_timeout_ms,
            max_inflight_per_member=c.max_inflight_per_member,
            max_inflight_per_cluster=c.max_inflight_per_cluster,
            max_pull=c.max_pull, max_retries=c.max_retries,
            retry_levels_s=list(c.retry_levels_s), time_scale=c.time_scale,
            max_retry_held=c.max_retry_held, max_window=c.max_window)
        self.read_cache = ReadCache()
        self._seq = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: list[asyncio.Task[Any]] = []
        self._closing = False

    # -- life cycle -----------------------------------------------------------------

    def open(self) -> None:
        """Open the store (runs crash recovery) and start the timers."""
        store = Store.open(self.config.store_config())
        self.store = store
        rep = store.recovery
        self.log("store_open", data_dir=store.data_dir, log_end=store.log_end,
                 topics=len(store.topics()), recovered_bytes_cut=rep.bytes_cut,
                 recovered_records_cut=rep.records_cut,
                 recovery_s=round(rep.seconds, 3))
        last = store.last_seq(BROKER_SN)
        self._seq = 0 if last is None else last + 1
        store.on_durable(self._on_durable)
        loop = asyncio.get_running_loop()
        self._timers = [
            loop.create_task(self._tick_loop(), name="lockmq-leases"),
            loop.create_task(self._positions_loop(), name="lockmq-positions"),
            loop.create_task(self._retention_loop(), name="lockmq-retention"),
        ]

    async def close(self) -> None:
        """Save positions, wait for background writes and close the store."""
        self._closing = True
        for t in self._timers:
            t.cancel()
        for t in self._timers:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.config.broker.shutdown_grace_s)
        await self.save_positions(force=True)
        if self.store is not None:
            await self.store.close()
            self.log("store_closed")

    # -- the ClusterHost interface --------------------------------------------------

    def read(self, topic: str, queue_offset: int, max_count: int) -> list[StoredRecord]:
        """Durable records of ``topic`` from ``queue_offset`` on.

        A topic read by several clusters goes through :attr:`read_cache`, so each
        record is decoded once for all of them (see ``readcache.py``); what is read
        is kept only if another cluster has not read past it yet."""
        store = self.store
        assert store is not None
        clusters = self.by_topic.get(topic, ())
        if len(clusters) > 1:
            upto = queue_offset + max_count
            keep = sum(1 for c in clusters if c.main.next < upto) > 1   # the reader + another
            return self.read_cache.read(store.read, topic, queue_offset, max_count,
                                        store.queue_start(topic), keep)
        return store.read(topic, queue_offset, max_count)

    def queue_end(self, topic: str) -> int:
        """One past the last durable queue offset of ``topic``."""
        assert self.store is not None
        return self.store.queue_end(topic)

    def topics(self) -> list[str]:
        """Every topic in the store."""
        assert self.store is not None
        return self.store.topics()

    async def append_system(self, records: list[NewRecord]) -> list[Appended]:
        """Store broker-generated records under ``$broker`` with fresh sequence numbers."""
        assert self.store is not None
        for r in records:
            r.sn = BROKER_SN
            r.seq = self._seq
            self._seq = (self._seq + 1) & MAX_SEQ
        self.stats.inc("system_records", len(records))
        return await self.store.append(records)

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background; it is awaited (bounded) at shutdown."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log("task_failed", error=repr(task.exception()), level="error")

    def publish_system(self, topic: str, payload: bytes, headers: dict[str, Any] | None = None,
                       lock_ts_ms: int = 0) -> None:
        """Fire-and-forget a system record (``$devices`` events ...); failures are logged."""
        ts = lock_ts_ms if 0 < lock_ts_ms < 1 << 62 else int(time.time() * 1000)

        async def run() -> None:
            try:
                await self.append_system([NewRecord(topic, BROKER_SN, 0, ts, payload,
                                                    headers)])
            except Exception as exc:  # noqa: BLE001
                self.log("system_publish_failed", topic=topic, error=repr(exc), level="warning")

        if not self._closing:
            self.spawn(run())

    # -- consumer clusters ----------------------------------------------------------

    def cluster(self, name: str, topic: str, ordered: bool) -> Cluster:
        """The cluster ``name`` on ``topic``, created (with its saved position) if new.

        Raises :class:`ClusterError` if the name is bad or the cluster already reads
        another topic.
        """
        try:
            validate_cluster(name)
            validate_topic(topic)
        except ValueError as exc:
            raise ClusterError("INVALID_ARGUMENT", str(exc)) from None
        if len(name) > 100:
            raise ClusterError("INVALID_ARGUMENT", "cluster name longer than 100 characters")
        c = self.clusters.get(name)
        if c is not None:
            if c.topic != topic:
                raise ClusterError("INVALID_ARGUMENT",
                                   f"cluster {name!r} consumes topic {c.topic!r}, not {topic!r}")
            return c
        assert self.store is not None
        positions = self.store.load_positions(name)
        c = Cluster(name, topic, ordered, self.settings, self, positions,
                    start_latest=self.config.consumers.start == "latest")
        self.clusters[name] = c
        self.by_topic.setdefault(topic, []).append(c)
        self.log("cluster_open", cluster=name, topic=topic, ordered=ordered,
                 committed=c.main.committed, retry_levels=len(c.retry_sources),
                 backlog=c.backlog())
        return c

    def _on_durable(self, topic: str, end: int) -> None:
        for c in self.by_topic.get(topic, ()):
            try:
                c.wake()
            except Exception as exc:  # noqa: BLE001 -- never break the store's callback
                self.log("cluster_wake_failed", cluster=c.name, error=repr(exc),
                         level="error")

    async def _tick_loop(self) -> None:
        period = self.config.consumers.lease_sweep_ms / 1000.0
        while True:
            await asyncio.sleep(period)
            for c in list(self.clusters.values()):
                try:
                    c.tick()
                except Exception as exc:  # noqa: BLE001 -- keep the timer alive
                    self.log("cluster_tick_failed", cluster=c.name, error=repr(exc),
                             level="error")

    async def save_positions(self, force: bool = False) -> None:
        """Persist the committed position of every cluster whose position moved."""
        if self.store is None:
            return
        for c in list(self.clusters.values()):
            if c.take_dirty() or force:
                try:
                    await self.store.save_positions(c.name, c.positions())
                except Exception as exc:  # noqa: BLE001
                    c.main.dirty = True
                    self.log("positions_save_failed", cluster=c.name, error=repr(exc),
                             level="error")

    async def _positions_loop(self) -> None:
        period = self.config.broker.position_flush_ms / 1000.0
        while True:
            await asyncio.sleep(period)
            await self.save_positions()

    def needed_positions(self) -> dict[str, int]:
        """Lowest position any cluster (live or only on disk) still needs, per topic."""
        assert self.store is not None
        needed: dict[str, int] = {}
        for name in self.store.clusters():
            if name not in self.clusters:
                for topic, pos in self.store.load_positions(name).items():
                    needed[topic] = min(needed.get(topic, pos), pos)
        for c in self.clusters.values():
            for topic, pos in c.positions().items():
                needed[topic] = min(needed.get(topic, pos), pos)
        return needed

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.broker.retention_interval_s)
            assert self.store is not None
            needed = self.needed_positions()
            try:
                rep = self.store.enforce_retention(needed)
                if rep.deleted_segments:
                    self.log("retention", deleted_segments=len(rep.deleted_segments),
                             deleted_bytes=rep.deleted_bytes)
            except Exception as exc:  # noqa: BLE001
                self.log("retention_failed", error=repr(exc), level="error")

    # -- admin views ----------------------------------------------------------------

    def topics_info(self) -> list[dict[str, Any]]:
        """Every topic with its queue range and the clusters reading it."""
        assert self.store is not None
        out = []
        for t in self.store.topics():
            out.append({"topic": t, "queue_start": self.store.queue_start(t),
                        "queue_end": self.store.queue_end(t), "system": t.startswith("$"),
                        "clusters": [c.name for c in self.by_topic.get(t, ())]})
        return out

    def clusters_info(self) -> list[dict[str, Any]]:
        """Every cluster: live ones in full, ones only known from disk by position."""
        assert self.store is not None
        out = [c.info() for c in self.clusters.values()]
        for name in self.store.clusters():
            if name in self.clusters or name.startswith(("$",)):
                continue
            pos = self.store.load_positions(name)
            main = {t: p for t, p in pos.items() if not t.startswith(RETRY_PREFIX)}
            for topic, p in main.items():
                end = self.store.queue_end(topic)
                out.append({"name": name, "topic": topic, "members": [], "inflight": 0,
                            "committed": p, "queue_end": end, "backlog": max(0, end - p),
                            "dlq_size": self.store.queue_end(DLQ_PREFIX + name),
                            "live": False})
        return out
