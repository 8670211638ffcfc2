"""The broker core: the store, the consumer clusters, system records and timers.

Connections (``connection.py``) hand decoded requests to :class:`BrokerCore`; the
core stores them (``lockmq.store``), and the store's ``on_durable`` callback drives
the dispatcher (``clusters.py``): socket -> decoder -> session -> core -> store ->
clusters -> consumer connections. Nothing here touches a socket or knows a
connection; the timers run through ``periodic.py``.
"""

from __future__ import annotations

import asyncio
import os
from functools import partial
from typing import Any, Awaitable, Callable

from lockmq.clock import SYSTEM_CLOCK, Clock, SystemClock, steady_ms_of
from lockmq.config import Config
from lockmq.security.identity import owner_of
from lockmq.store import Appended, NewRecord, Store, StoreClosed, StoredRecord, StoreFull
from lockmq.store.names import CLOCK
from lockmq.store.records import validate_cluster, validate_topic
from lockmq.store.writer import Then

from .clusters import DLQ_PREFIX, RETRY_PREFIX, Cluster, ClusterError
from .logs import EventLog, Stats
from .periodic import start_periodic, stop_task
from .readcache import ReadCache

#: The SN under which the broker writes its own records ($devices, retries, dead letters).
#: ``$`` ids are reserved to the broker (lockmq.security.identity) and never go through
#: the store's producer dedup (lockmq.store.dedup), so no client can make the broker's
#: own writes look like duplicates.
BROKER_SN = "$broker"
MAX_SEQ = 0xFFFFFFFF
#: System records wait at most this long for a client append to ride along with
#: (then a timer stores them): their consumers see them this much later at most.
SYSTEM_FLUSH_S = 0.005
#: how often the clock timer looks for a wall-clock step, and every how many looks it
#: saves steady time (data_dir/clock)
CLOCK_CHECK_S = 1.0
CLOCK_SAVE_EVERY = 10

#: ``released(None)`` once records may be acknowledged, ``released(error)`` if never
Released = Callable[[BaseException | None], None]
#: ``after_durable(end, released)``: called once records ending at commit-log offset
#: ``end`` are durable here; calls ``released`` when they may be acknowledged (sync
#: replication: when the standby has them too), at once or later, on the loop
AfterDurable = Callable[[int, Released], None]


class SystemSeq:
    """Sequence numbers of one broker-internal producer id (``$broker``, ``$txn``,
    ``$scheduled``): resumed after the last one stored, wrapping at 32 bits."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = value   # the next one to hand out

    @classmethod
    def after_last(cls, store: Store, sn: str) -> "SystemSeq":
        """The counter that goes on after ``sn``'s last stored sequence number."""
        last = store.last_seq(sn)
        return cls(0 if last is None else (last + 1) & MAX_SEQ)

    def take(self) -> int:
        """The next sequence number."""
        s = self.value
        self.value = (s + 1) & MAX_SEQ
        return s


def _settle(fut: "asyncio.Future[None]", err: BaseException | None) -> None:
    """Resolve ``fut`` with ``err`` (an :data:`AfterDurable` release), unless cancelled."""
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)


def _gated(store: Store, gate: AfterDurable, then: Then) -> Then:
    """``then`` called once ``gate`` releases what the store made durable."""
    def durable(res: list[Appended] | None, err: BaseException | None) -> None:
        if err is not None:
            then(res, err)
            return
        gate(store.log_end, lambda gate_err: then(None if gate_err else res, gate_err))
    return durable


class BrokerCore:
    """Owns the store and the clusters; see the module docstring."""

    def __init__(self, config: Config, log: EventLog, stats: Stats,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        #: the time of the store, cluster activity and expiry (lockmq.clock); a broker
        #: on the system clock gets its own, whose steady time it saves and restores
        self.clock = SystemClock() if clock is SYSTEM_CLOCK else clock
        self.log = log
        self.stats = stats
        self.store: Store | None = None
        self.clusters: dict[str, Cluster] = {}
        self.by_topic: dict[str, list[Cluster]] = {}
        #: the clusters' settings: the [consumers] section itself (a reload changes it
        #: in place, and every cluster sees the change)
        self.settings = config.consumers
        self.read_cache = ReadCache()
        self._seq = SystemSeq()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: list[asyncio.Task[Any]] = []
        self._closing = False
        self._sys_batch: list[NewRecord] = []   # system records not handed to the store yet
        #: the timer that stores them when no client append takes them along first
        self._sys_timer: asyncio.TimerHandle | None = None
        #: loop time by which the waiting system records are stored (their first's
        #: time + SYSTEM_FLUSH_S)
        self._sys_due = 0.0
        #: system-record appends handed to the store and not answered yet
        self.system_pending = 0
        #: the one gate of both :meth:`append` and :meth:`append_then` between durable
        #: and answered (sync replication declares "until the standby has it":
        #: :meth:`gate_acks`); None: answer once durable
        self.after_durable: AfterDurable | None = None
        self._clock_path = ""
        self._clock_ticks = 0
        #: every cluster with a positions file (live or not) -> its owner ("" for
        #: files from before owners were saved: the next subscriber claims it)
        self.cluster_owners: dict[str, str] = {}

    def gate_acks(self, gate: AfterDurable) -> None:
        """Declare the gate between durable and acknowledged (sync replication's
        ``ReplicaSource.after_durable``) while the broker is built: one gate, set
        before the store opens -- never swapped under a running broker."""
        if self.after_durable is not None or self.store is not None:
            raise RuntimeError("the durability gate is declared once, before the core opens")
        self.after_durable = gate

    # -- life cycle -----------------------------------------------------------------

    def open(self) -> None:
        """Open the store (runs crash recovery) and start the timers."""
        scfg = self.config.store_config()
        self._clock_path = os.path.join(os.path.abspath(os.fspath(scfg.data_dir)), CLOCK)
        if os.path.isdir(os.path.dirname(self._clock_path)):
            how = self.clock.restore(self._clock_path)   # type: ignore[attr-defined]
            self.log("clock_restored", how=how,
                     steady_minus_wall_ms=int(self.steady_ms() - self.clock.wall_ms()))
        store = Store.open(scfg, self.clock)
        self.store = store
        rep = store.recovery
        for what in store.positions_report:
            self.log("positions_restored" if "restored" in what else "positions_damaged",
                     detail=what, level="error" if "RESTARTS" in what else "warning")
        for d in store.damage:
            self.log("store_damage", detail=d.describe(), found=d.found, level="error")
        self.log("store_open", data_dir=store.data_dir, log_end=store.log_end,
                 topics=len(store.topics()), recovered_bytes_cut=rep.bytes_cut,
                 recovered_records_cut=rep.records_cut,
                 damaged_ranges=store.stats["damaged_ranges"],
                 damaged_records=store.stats["damaged_records"],
                 recovery_s=round(rep.seconds, 3))
        self._seq = SystemSeq.after_last(store, BROKER_SN)
        for name in self._disk_clusters():
            self.cluster_owners[name] = store.cluster_meta(name).get("owner", "")
        store.on_durable(self._on_durable)
        cfg = self.config
        self._timers = [
            start_periodic("lockmq-leases", cfg.consumers.lease_sweep_ms / 1000.0,
                           self.tick_clusters, self.log),
            start_periodic("lockmq-positions", cfg.broker.position_flush_ms / 1000.0,
                           self.save_positions, self.log),
            start_periodic("lockmq-retention", cfg.broker.retention_interval_s,
                           self.enforce_retention, self.log),
            start_periodic("lockmq-clock", CLOCK_CHECK_S, self.check_clock, self.log),
        ]
        self._save_clock()

    def check_clock(self) -> None:
        """The clock timer: log and count a step of the wall clock (it changes no
        decision: every judged duration is on steady time), and save steady time now
        and then so that a restart continues it."""
        check = getattr(self.clock, "check_step", None)
        delta = check() if check is not None else None
        if delta is not None:
            self.stats.inc("clock_steps")
            self.log("clock_step", step_ms=int(delta),
                     direction="forward" if delta > 0 else "back",
                     wall_ms=int(self.clock.wall_ms()), steady_ms=int(self.steady_ms()),
                     note="durations (retention, expiry, retries) are judged on steady "
                          "time: nothing is deleted or held because of it",
                     level="warning")
        self._clock_ticks += 1
        if delta is not None or self._clock_ticks % CLOCK_SAVE_EVERY == 0:
            self._save_clock()

    def _save_clock(self) -> None:
        save = getattr(self.clock, "save", None)
        if save is None or not self._clock_path:
            return
        try:
            save(self._clock_path)
        except OSError as exc:
            self.log("clock_save_failed", error=repr(exc), level="warning")

    async def close(self) -> None:
        """Save positions, wait for background writes and close the store."""
        self._closing = True
        if self._sys_timer is not None:
            self._sys_timer.cancel()
            self._sys_timer = None
        self._flush_system()   # system records not handed to the store yet
        for t in self._timers:
            await stop_task(t)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.config.broker.shutdown_grace_s)
        await self.save_positions(force=True)
        self._save_clock()
        if self.store is not None:
            await self.store.close()
            self.log("store_closed")

    # -- what connections and the publish path call -----------------------------------

    async def append(self, records: list[NewRecord]) -> list[Appended]:
        """Store records (one group commit) -- clients' and the broker's own (transaction
        ends, scheduled deliveries) -- then pass :attr:`after_durable`; raises the
        store's errors."""
        store = self.store
        if store is None:
            raise StoreClosed("the store is not open")
        self._flush_system()   # (waiting system records keep their place in the log)
        res = await store.append(records)
        gate = self.after_durable
        if gate is not None:
            released = asyncio.get_running_loop().create_future()
            gate(store.log_end, partial(_settle, released))
            await released
        return res

    def append_then(self, records: list[NewRecord], then: Then) -> None:
        """:meth:`append` answered through ``then(results, error)`` (``Store.append_then``:
        the publish path's fast way, no task per group commit), through the same
        :attr:`after_durable` gate."""
        store, then = self._gate(then)
        if self._sys_batch:   # (storm: the $devices records ride this append)
            self._append_with_system(store, records, then)
            return
        store.append_then(records, then)

    def _gate(self, then: Then) -> tuple[Store, Then]:
        """The open store, and ``then`` behind the :attr:`after_durable` gate if
        there is one (sync replication: answered once the standby has it too)."""
        store = self.store
        if store is None:
            raise StoreClosed("the store is not open")
        gate = self.after_durable
        if gate is not None:
            then = _gated(store, gate, then)
        return store, then

    def last_seq(self, sn: str) -> int | None:
        """The last sequence number stored for producer ``sn`` (None: never)."""
        return self.store.last_seq(sn) if self.store is not None else None

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

    def damage_at(self, topic: str, queue_offset: int) -> Any:
        """The store's quarantined damage holding ``topic``'s record at
        ``queue_offset`` (None: not damaged)."""
        assert self.store is not None
        return self.store.damage_at(topic, queue_offset)

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
        self._as_broker(records)
        res = await self.store.append(records)
        self._check_system_results(res)
        return res

    def _as_broker(self, records: list[NewRecord]) -> None:
        """Give ``records`` the broker's producer id and its next sequence numbers."""
        take = self._seq.take
        for r in records:
            r.sn = BROKER_SN
            r.seq = take()
        self.stats.inc("system_records", len(records))

    def _check_system_results(self, res: list[Appended]) -> bool:
        """False (and an error line) if the store took a system record as a duplicate."""
        dups = sum(1 for a in res if a.duplicate)
        if dups:   # cannot happen ($ ids skip dedup); never silently: callers check
            self.stats.inc("system_records_duplicate", dups)
            self.log("system_records_duplicate", count=dups, level="error")
        return not dups

    def wall_ms(self) -> float:
        """Wall time on the broker's clock."""
        return self.clock.wall_ms()

    def steady_ms(self) -> float:
        """Steady time on the broker's clock (never jumps: lockmq.clock): the scale of
        cluster activity, expiry and retry due times."""
        return steady_ms_of(self.clock)

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
        """Fire-and-forget a system record (``$devices`` events ...); failures are logged.

        Nobody waits for these records, so they are gathered: handed to the store
        with the next client append (:meth:`append_then`, the publish path: one group
        commit for both), or by a timer :data:`SYSTEM_FLUSH_S` after the first of
        them, whichever comes first -- one append answered through a callback, not a
        task, store submit and group commit per event. A storm of lock handshakes
        writes an ``online`` and an ``offline`` event per lock; each lock's first
        PUBLISH, one round trip after its ``online``, takes that event along."""
        if self._closing:
            return
        ts = lock_ts_ms if 0 < lock_ts_ms < 1 << 62 else int(self.clock.wall_ms())
        batch = self._sys_batch
        if not batch:   # the first of a new batch: its wait starts now
            self._sys_due = asyncio.get_running_loop().time() + SYSTEM_FLUSH_S
        batch.append(NewRecord(topic, BROKER_SN, 0, ts, payload, headers))
        if self._sys_timer is None:
            self._arm_system_timer()

    @property
    def system_idle(self) -> bool:
        """Every system record handed to the store and answered (tests wait on it)."""
        return not self._sys_batch and self.system_pending == 0

    def _arm_system_timer(self) -> None:
        """The timer for the waiting batch (it is handed the batch it was set for)."""
        self._sys_timer = asyncio.get_running_loop().call_at(
            self._sys_due, self._system_timer, self._sys_batch)

    def _system_timer(self, armed_for: list[NewRecord]) -> None:
        self._sys_timer = None
        if armed_for is self._sys_batch:
            self._flush_system()
        elif self._sys_batch:
            # an append took the records this timer was set for: the ones gathered
            # since wait their own time for a ride, not what is left of the others'
            self._arm_system_timer()

    def _flush_system(self) -> None:
        """Store the system records gathered so far: one append answered through a
        callback (``Store.append_then``), no task or coroutine per batch."""
        batch = self._sys_batch
        if not batch:
            return
        self._sys_batch = []
        self._as_broker(batch)   # once: a record stored alone below keeps its number
        self._store_numbered(batch)

    def _append_with_system(self, store: Store, records: list[NewRecord], then: Then) -> None:
        """The waiting system records handed to the store ahead of a client append, in
        the same call (one submit, one group commit, one answer split in two; the store
        answers per record, so a bad record is its part's alone); if the store refuses
        the call before queuing it (busy, closed), each part goes on its own as
        without this."""
        batch = self._sys_batch
        self._sys_batch = []
        self._as_broker(batch)
        k = len(batch)

        def answer(res: list[Appended] | None, exc: BaseException | None) -> None:
            self._system_stored(batch, None if res is None else res[:k], exc)
            then(None if res is None else res[k:], exc)

        self.system_pending += 1
        try:
            store.append_then(batch + records, answer)
            return
        except Exception:  # noqa: BLE001 -- busy, closed
            self.system_pending -= 1
        self._store_numbered(batch)
        store.append_then(records, then)   # (raises to the caller as it would have)

    def _store_numbered(self, batch: list[NewRecord]) -> None:
        """Hand numbered system records to the store (which answers per record: a bad
        one alone is refused, and logged by :meth:`_system_stored`)."""
        try:
            self._append_system_then(batch)
        except Exception as exc:  # noqa: BLE001 -- the store is busy, closed or failed
            self._system_failed(batch, repr(exc))

    def _append_system_then(self, records: list[NewRecord]) -> None:
        store = self.store
        if store is None:
            raise StoreClosed("the store is not open")
        self.system_pending += 1
        try:
            store.append_then(records, partial(self._system_stored, records))
        except BaseException:
            self.system_pending -= 1   # refused before queuing: ``stored`` is not called
            raise

    def _system_stored(self, records: list[NewRecord], res: list[Appended] | None,
                       exc: BaseException | None) -> None:
        """The store's answer for system records: failures are logged (a record the
        store refused alone, with its own error)."""
        self.system_pending -= 1
        if exc is not None:
            self._system_failed(records, repr(exc))
            return
        if res is None:
            return
        bad = [(r, a) for r, a in zip(records, res) if isinstance(a, Exception)]
        if bad:
            for r, a in bad:
                self._system_failed([r], repr(a))
            res = [a for a in res if not isinstance(a, Exception)]
        if not self._check_system_results(res):
            self._system_failed(records, "system record taken as a duplicate: not stored")

    def _system_failed(self, records: list[NewRecord], error: str) -> None:
        self.log("system_publish_failed", topic=records[0].topic, records=len(records),
                 error=error, level="warning")

    # -- consumer clusters ----------------------------------------------------------

    def cluster(self, name: str, topic: str, ordered: bool, principal: Any = None) -> Cluster:
        """The cluster ``name`` on ``topic``, created (with its saved position) if new.

        A cluster belongs to the principal that created it (``identity.owner_of``:
        its token name), saved in its positions file before the cluster is used, with
        the topic it is bound to. ``principal`` None or an admin may join any cluster;
        another principal gets FORBIDDEN. A new cluster beyond
        ``[consumers] max_clusters_per_owner`` (non-admins) gets LIMIT_EXCEEDED.
        Nothing is created or written when the request is refused.

        Raises :class:`ClusterError` (bad name, another owner, bound to another
        topic, the cap).
        """
        try:
            validate_cluster(name)
            validate_topic(topic)
        except ValueError as exc:
            raise ClusterError("INVALID_ARGUMENT", str(exc)) from None
        if len(name) > 100:
            raise ClusterError("INVALID_ARGUMENT", "cluster name longer than 100 characters")
        admin = principal is None or bool(getattr(principal, "is_admin", False))
        owner = "broker" if principal is None else owner_of(principal)
        c = self.clusters.get(name)
        if c is not None:
            self._check_cluster_owner(name, owner, admin, principal)
            if c.topic != topic:
                self._cluster_refused("topic", name, principal,
                                      f"cluster {name!r} consumes topic {c.topic!r}, not "
                                      f"{topic!r}: subscribe with that topic or use another "
                                      "cluster name")
            return c
        store = self.store
        assert store is not None
        known = name in self.cluster_owners
        if known:
            self._check_cluster_owner(name, owner, admin, principal)
            bound = self._bound_topic(name)
            if bound and bound != topic:
                self._cluster_refused("topic", name, principal,
                                      f"cluster {name!r} consumes topic {bound!r}, not "
                                      f"{topic!r}: subscribe with that topic or use another "
                                      "cluster name")
        elif not admin:
            cap = self.config.consumers.max_clusters_per_owner
            if sum(1 for o in self.cluster_owners.values() if o == owner) >= cap:
                self._cluster_refused("cap", name, principal,
                                      f"this principal already owns {cap} consumer clusters "
                                      "(consumers.max_clusters_per_owner): reuse one, or "
                                      "ask an admin to delete one (clusters.delete)",
                                      code="LIMIT_EXCEEDED")
        positions = store.load_positions(name)
        meta = store.cluster_meta(name) if known else {}
        if not known or not meta.get("owner") or not meta.get("topic"):
            # claim it durably before anyone is served from it
            start: dict[str, int] = {}
            if topic not in positions:
                start[topic] = store.queue_end(topic) \
                    if self.config.consumers.start == "latest" else 0
            if not known:   # retries left by a deleted cluster of that name are not ours
                prefix = f"{RETRY_PREFIX}{name}."
                for t in store.topics():
                    if t.startswith(prefix) and t not in positions:
                        start[t] = store.queue_end(t)
            claim_owner = meta.get("owner") or owner
            try:
                store.claim_cluster(name, claim_owner, topic, start)
            except StoreFull as exc:   # nothing was created: the consumer may retry
                raise ClusterError("STORAGE_FULL", f"cannot create cluster {name!r}: the "
                                   f"broker's disk is full ({exc})") from None
            self.cluster_owners[name] = claim_owner
            positions = store.load_positions(name)
            self.log("cluster_claimed", cluster=name, topic=topic, owner=claim_owner,
                     legacy=known or None)
        c = Cluster(name, topic, ordered, self.settings, self, positions,
                    start_latest=self.config.consumers.start == "latest")
        c.stats["skipped"] = store.cluster_counters(name).get("skipped", 0)
        self.clusters[name] = c
        self.by_topic.setdefault(topic, []).append(c)
        self.log("cluster_open", cluster=name, topic=topic, ordered=ordered,
                 committed=c.main.committed, retry_levels=len(c.retry_sources),
                 backlog=c.backlog(), owner=self.cluster_owners.get(name, ""))
        return c

    def _bound_topic(self, name: str) -> str:
        """The topic an on-disk cluster reads (saved, or its one non-retry position)."""
        assert self.store is not None
        bound = self.store.cluster_meta(name).get("topic", "")
        if not bound:
            main = [t for t in self.store.load_positions(name) if not t.startswith(RETRY_PREFIX)]
            bound = main[0] if len(main) == 1 else ""
        return bound

    def _check_cluster_owner(self, name: str, owner: str, admin: bool, principal: Any) -> None:
        cur = self.cluster_owners.get(name, "")
        if cur and cur != owner and not admin:
            self._cluster_refused("owner", name, principal,
                                  f"cluster {name!r} belongs to another principal: choose "
                                  "another cluster name (an admin can delete it)",
                                  code="FORBIDDEN")

    def _cluster_refused(self, why: str, name: str, principal: Any, message: str,
                         code: str = "INVALID_ARGUMENT") -> None:
        """Count, log (at most once a second per kind) and raise a refused SUBSCRIBE."""
        self.stats.inc(f"clusters_refused_{why}")
        self.log.limited(f"cluster_refused_{why}", cluster=name,
                         principal=getattr(principal, "name", None),
                         owner=owner_of(principal) if principal is not None else None,
                         level="warning")
        raise ClusterError(code, message)

    def forget_cluster(self, name: str) -> bool:
        """Delete a cluster (no members may be connected): its live state, its
        positions file and its owner. Its ``$retry``/``$dlq`` records stay until
        retention; a new cluster of that name starts after them. False if unknown."""
        assert self.store is not None
        c = self.clusters.pop(name, None)
        if c is not None:
            assert not c.members
            lst = self.by_topic.get(c.topic, [])
            if c in lst:
                lst.remove(c)
            if not lst:
                self.by_topic.pop(c.topic, None)
        known = self.cluster_owners.pop(name, None) is not None
        existed = self.store.delete_cluster(name)
        return c is not None or known or existed

    def _on_durable(self, topic: str, end: int) -> None:
        for c in self.by_topic.get(topic, ()):
            try:
                c.wake()
            except Exception as exc:  # noqa: BLE001 -- never break the store's callback
                self.log("cluster_wake_failed", cluster=c.name, error=repr(exc),
                         level="error")

    def tick_clusters(self) -> None:
        """Expire leases and release due retries in every cluster (the lease timer)."""
        for c in list(self.clusters.values()):
            try:
                c.tick()
            except Exception as exc:  # noqa: BLE001 -- one cluster must not stop the others
                self.log("cluster_tick_failed", cluster=c.name, error=repr(exc),
                         level="error")

    async def save_positions(self, force: bool = False) -> None:
        """Persist the committed position of every cluster whose position moved."""
        if self.store is None:
            return
        for c in list(self.clusters.values()):
            if self.clusters.get(c.name) is not c:
                continue   # deleted meanwhile (clusters.delete): do not write its file again
            if c.take_dirty() or c.activity_dirty or force:
                c.activity_dirty = False
                try:
                    await self.store.save_positions(c.name, c.positions(), c.counters())
                except Exception as exc:  # noqa: BLE001
                    c.main.dirty = True
                    self.log("positions_save_failed", cluster=c.name, error=repr(exc),
                             level="error")

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

    async def enforce_retention(self) -> None:
        """The retention timer: close an old quiet segment (``segment_ms``), expire
        unused clusters, delete what the age and size limits say -- also records a
        cluster has not read -- and move such clusters to the new start (counted
        and logged: ``cluster_skipped``)."""
        store = self.store
        assert store is not None
        try:
            if await store.roll_if_old():
                self.log("segment_rolled", reason="segment_ms", log_end=store.log_end)
            await self.expire_clusters()
            rep = store.enforce_retention(self.needed_positions())
            if rep.deleted_segments:
                self.log("retention", deleted_segments=len(rep.deleted_segments),
                         deleted_bytes=rep.deleted_bytes,
                         skipped_records=sum(rep.skipped_records.values()))
                await self._skip_behind_retention()
        except Exception as exc:  # noqa: BLE001
            self.log("retention_failed", error=repr(exc), level="error")

    def _disk_clusters(self) -> list[str]:
        """Names of the clusters with a positions file (valid names only)."""
        assert self.store is not None
        out = []
        for name in self.store.clusters():
            try:
                validate_cluster(name)
            except ValueError:   # a file name that is no cluster name: not ours
                continue
            out.append(name)
        return out

    async def _skip_behind_retention(self) -> None:
        """Move every cluster (live or only on disk) whose position retention deleted
        to its topic's new start; count and log what each skipped."""
        store = self.store
        assert store is not None
        for name in self._disk_clusters():
            c = self.clusters.get(name)
            if c is not None:
                n = c.skip_to_start(store.queue_start)
                if n and not c.members:   # no member will commit it: save it now (not as
                    c.take_dirty()        # activity, or it would never expire)
                    await store.save_positions(name, c.positions(), c.counters())
            else:
                saved = store.load_positions(name)
                moved = {t: store.queue_start(t) for t, p in saved.items()
                         if p < store.queue_start(t)}
                n = sum(q - saved[t] for t, q in moved.items())
                if n:
                    total = store.cluster_counters(name).get("skipped", 0) + n
                    await store.save_positions(name, moved, {"skipped": total})
            if n:
                self.stats.inc("retention_skipped", n)
                self.log("cluster_skipped", cluster=name, skipped=n,
                         reason="retention deleted records the cluster had not read",
                         level="warning")

    async def expire_clusters(self) -> list[str]:
        """Expire clusters unused for ``[clusters] offsets_retention_ms`` (no member
        connected, no position moved): position, owner, topic binding and retry
        state are deleted, logged and counted. Returns their names."""
        store = self.store
        assert store is not None
        limit = self.config.clusters.offsets_retention()
        now = self.steady_ms()   # a wall-clock step expires nothing
        expired = []
        for name in self._disk_clusters():
            c = self.clusters.get(name)
            if c is not None:
                if c.members:
                    c.touch()   # in use; saved by the positions timer
                    continue
                last: float | None = c.last_active_ms
            else:
                last = store.cluster_counters(name).get("last_active_ms")
                if last is None:   # a file from before activity was saved: start now
                    await store.save_positions(name, {}, {"last_active_ms": int(now)})
                    continue
            if limit is None or now - last < limit:
                continue
            owner = self.cluster_owners.get(name, "")
            self.forget_cluster(name)
            expired.append(name)
            self.stats.inc("clusters_expired")
            self.log("cluster_expired", cluster=name, owner=owner,
                     idle_ms=int(now - last), offsets_retention_ms=limit, level="warning")
        return expired

    # -- admin views ----------------------------------------------------------------

    def topics_info(self) -> list[dict[str, Any]]:
        """Every topic with its queue range and the clusters reading it: open ones and
        those only known from disk (no member since the start), as ``clusters`` lists
        them."""
        assert self.store is not None
        readers: dict[str, list[str]] = {t: [c.name for c in cs] for t, cs in self.by_topic.items()}
        for name in self.store.clusters():
            if name in self.clusters or name.startswith("$"):
                continue
            bound = self._bound_topic(name)
            if bound:
                readers.setdefault(bound, []).append(name)
        out = []
        for t in self.store.topics():
            out.append({"topic": t, "queue_start": self.store.queue_start(t),
                        "queue_end": self.store.queue_end(t), "system": t.startswith("$"),
                        "clusters": sorted(readers.get(t, ()))})
        return out

    def clusters_info(self) -> list[dict[str, Any]]:
        """Every cluster: live ones in full, ones only known from disk by position."""
        assert self.store is not None
        owners = self.cluster_owners
        out = [dict(c.info(), owner=owners.get(c.name, "")) for c in self.clusters.values()]
        for name in self.store.clusters():
            if name in self.clusters or name.startswith(("$",)):
                continue
            pos = self.store.load_positions(name)
            counters = self.store.cluster_counters(name)
            main = {t: p for t, p in pos.items() if not t.startswith(RETRY_PREFIX)}
            for topic, p in main.items():
                end = self.store.queue_end(topic)
                skipped = counters.get("skipped", 0)
                out.append({"name": name, "topic": topic, "owner": owners.get(name, ""),
                            "members": [], "inflight": 0,
                            "committed": p, "queue_end": end, "backlog": max(0, end - p),
                            "dlq_size": self.store.queue_end(DLQ_PREFIX + name),
                            "last_active_ms": counters.get("last_active_ms"),
                            "skipped": skipped, "stats": {"skipped": skipped},
                            "live": False})
        return out
