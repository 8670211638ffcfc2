"""The primary's side: answers a standby's fetches (``replica.fetch``) and, with
``sync = true``, holds each PUBLISH_ACK until the standby has the record durably.

A fetch is Kafka's follower fetch: the standby names the commit-log offset it has
durably (``from``); that is also its acknowledgement. The answer carries the raw
commit-log bytes from there (whole records, one segment at a time, only what is
readable: durable on the primary), the segment's queue-start sidecar when the
answer starts a segment, and now and then every consumer cluster's saved state.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import TYPE_CHECKING, Any

from lockmq.admin_error import AdminError

if TYPE_CHECKING:   # (types only)
    from lockmq.broker.core import Released

from .registry_source import RegistrySource
from .settings import ReplicationSettings

#: how often a fetch answer carries the consumer clusters' saved positions
POSITIONS_EVERY_S = 0.2
#: most clusters one answer carries (the rest follow in the next ones)
MAX_CLUSTERS = 1000
#: a standby silent this long beyond its long-poll wait counts as not connected
STANDBY_SILENT_S = 5.0


def whole_records(data: bytes) -> int:
    """Bytes of ``data`` that are whole commit-log records (FORMAT.md: a 4-byte
    little-endian length, then that many bytes)."""
    pos = 0
    n = len(data)
    while pos + 4 <= n:
        size = 4 + int.from_bytes(data[pos:pos + 4], "little")
        if pos + size > n:
            break
        pos += size
    return pos


class ReplicaSource:
    """The primary's replication state: the standby's acknowledged position, the
    fetches it has parked, and the publishes waiting for it (sync mode)."""

    def __init__(self, core: Any, settings: ReplicationSettings, stats: Any, log: Any) -> None:
        self.core = core
        self.settings = settings
        self.stats = stats
        self.log = log
        #: commit-log offset the standby has durably (-1: no standby seen yet)
        self.acked = -1
        self.last_fetch = 0.0
        #: True while acks wait for the standby (sync mode and the standby caught up)
        self.in_sync = False
        self._waiters: list[tuple[int, Released]] = []
        self._data = asyncio.Event()
        self._positions_sent = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self._listening = False
        #: the broker is stopping: nothing waits for the standby any more
        self._stopping = False
        #: serves ``replica.security`` (set by :func:`primary_source`)
        self.registry: RegistrySource | None = None
        #: ``replication_fenced`` logged for this outage (again after in sync)
        self._fence_logged = False

    def ops(self) -> dict[str, Any]:
        """The admin ops a standby uses: ``replica.fetch``, ``replica.status``,
        ``replica.security``."""
        ops: dict[str, Any] = {"replica.fetch": self.fetch, "replica.status": self.status}
        if self.registry is not None:
            ops["replica.security"] = self.registry.serve
        return ops

    @property
    def durable_gate(self) -> Any:
        """The core's gate in sync mode (:meth:`after_durable`); None in async mode."""
        return self.after_durable if self.settings.sync else None

    # -- the store side -------------------------------------------------------------

    def on_durable(self, _topic: str, _end: int) -> None:
        """New records are readable: wake parked fetches."""
        self._data.set()

    def fenced(self) -> bool:
        """With ``fence_after_s``: the primary may not ack (its standby is not in
        sync, or has been silent for ``fence_after_s``: it may be promoting itself)."""
        after = self.settings.fence_after_s
        if not after or self._stopping:
            return False
        return not self.in_sync or time.monotonic() - self.last_fetch >= after

    def _fence_error(self) -> BaseException:
        from lockmq.store import StoreClosed   # (the broker imports this module)

        if not self._fence_logged:
            self._fence_logged = True
            self.stats.inc("replication_fences")
            self.log("replication_fenced", level="error", acked=self.acked,
                     standby_seen_s_ago=round(time.monotonic() - self.last_fetch, 1)
                     if self.last_fetch else None,
                     hint="publishes are refused until the standby follows in sync again "
                          "(it may have been promoted: then this broker must not serve)")
        return StoreClosed("fenced: this primary's standby is not following in sync "
                           "(it may have been promoted); try the next broker")

    def after_durable(self, end: int, released: Released) -> None:
        """``core.after_durable`` in sync mode, for every write through the core (the
        publish path's and the broker's own): ``released(None)`` once the standby
        acknowledged ``end`` -- at once when it already has or replication is not in
        sync (async, degraded, not caught up yet). A fenced primary
        (``fence_after_s``) answers an error instead: nothing it holds is acked."""
        if self.fenced():
            released(self._fence_error())
            return
        if self.acked >= end or not self.in_sync or self._stopping:
            released(None)
            return
        self._waiters.append((end, released))
        if self._watchdog is None:
            self._arm_watchdog()

    def _arm_watchdog(self) -> None:
        every = self.settings.fence_after_s or self.settings.sync_timeout_s
        self._watchdog = asyncio.get_running_loop().call_later(every / 4, self._check_standby)

    def _check_standby(self) -> None:
        """Degrade to async if the standby has been silent for ``sync_timeout_s``."""
        self._watchdog = None
        if not self._waiters:
            return
        silent = time.monotonic() - self.last_fetch
        if self.settings.fence_after_s:   # fenced: never degrade, refuse what waits
            if self.fenced():
                self.in_sync = False
                error = self._fence_error()
                waiters, self._waiters = self._waiters, []
                loop = asyncio.get_running_loop()
                for _end, released in waiters:
                    loop.call_soon(released, error)
                return
            self._arm_watchdog()
            return
        if silent >= self.settings.sync_timeout_s:
            self._stop_holding("replication_degraded", 1,
                               "acks no longer wait for the standby: a primary crash now "
                               "loses what the standby did not fetch",
                               silent_s=round(silent, 1))
            return
        self._arm_watchdog()

    def _stop_holding(self, event: str, count: int, hint: str, **fields: Any) -> None:
        """Stop waiting for the standby (``in_sync`` off until it catches up again):
        count and log ``event`` (a warning: acks no longer wait for the standby) and
        release every ack held for it."""
        self.in_sync = False
        self.stats.inc(event, count)
        store = self.core.store
        self.log(event, level="warning", **fields, acked=self.acked,
                 log_end=store.log_end if store else None, hint=hint)
        self._release(1 << 62)

    def release_for_shutdown(self) -> None:
        """The broker is stopping: release every ack held for the standby at once,
        as the ``sync_timeout_s`` path does (the records are durable here; holding
        them would keep publishers, a transaction's end and the scheduler waiting
        until the standby answers or the timeout, past the shutdown grace), and hold
        none from now on. Logged with how many were held."""
        self._stopping = True
        self.in_sync = False
        self._data.set()   # a parked fetch answers now, before the broker closes its link
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._waiters:
            held = len(self._waiters)
            self._stop_holding("replication_released_on_shutdown", held,
                               "acked without the standby: a loss of this machine before "
                               "the standby fetches them loses them (as after "
                               "replication_degraded)", held=held)

    def _release(self, upto: int) -> None:
        """Release the waiters up to ``upto``, each in its own callback (one that
        raises does not cost the others)."""
        keep = []
        loop = asyncio.get_running_loop()
        for end, released in self._waiters:
            if end <= upto:
                loop.call_soon(released, None)
            else:
                keep.append((end, released))
        self._waiters = keep

    # -- the fetch op ---------------------------------------------------------------

    def _acknowledge(self, acked: int) -> None:
        self.last_fetch = time.monotonic()
        first = self.acked < 0
        self.acked = max(self.acked, acked)
        self.stats.c["replication_acked"] = self.acked
        self._release(self.acked)
        store = self.core.store
        if self.settings.sync and not self.in_sync and not self._stopping \
                and self.acked >= store.log_end:
            self.in_sync = True
            self._fence_logged = False
            self.log("replication_in_sync", acked=self.acked,
                     level="info" if first else "warning")

    async def fetch(self, args: dict[str, Any]) -> dict[str, Any]:
        """``replica.fetch`` {from, max_bytes?, wait_ms?}: log bytes from ``from``."""
        start = args.get("from")
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise AdminError("INVALID_ARGUMENT", "from must be a commit-log offset")
        store = self.core.store
        if start > store.log_end:
            raise AdminError("INVALID_ARGUMENT", f"from {start} is past the log end "
                             f"{store.log_end}: the standby holds records this primary "
                             "does not (a different log): rebuild the standby")
        if start < store.log_start:
            raise AdminError("INVALID_ARGUMENT", f"from {start} was deleted by retention "
                             f"(log starts at {store.log_start}): reseed the standby")
        if not self._listening:   # (the store opens after the broker is built)
            self._listening = True
            store.on_durable(self.on_durable)
        wait_ms = args.get("wait_ms", self.settings.fetch_wait_ms)
        max_bytes = args.get("max_bytes", self.settings.fetch_max_bytes)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (wait_ms, max_bytes)):
            raise AdminError("INVALID_ARGUMENT", "wait_ms and max_bytes must be integers")
        wait_ms = min(max(wait_ms, 0), 30_000)
        max_bytes = min(max(max_bytes, 4096), self.settings.fetch_max_bytes)
        self._acknowledge(start)
        if start == store.log_end and wait_ms > 0:
            self._data.clear()
            try:
                await asyncio.wait_for(self._data.wait(), wait_ms / 1000)
            except asyncio.TimeoutError:
                pass
        out: dict[str, Any] = {"ok": True, "log_end": store.log_end, "in_sync": self.in_sync,
                               # a self-promoting standby needs to know it is fenced
                               "fence_after_s": self.settings.fence_after_s}
        out.update(self._chunk(start, max_bytes))
        now = time.monotonic()
        if now - self._positions_sent >= POSITIONS_EVERY_S:
            self._positions_sent = now
            out["clusters"] = self._clusters()
        return out

    def _chunk(self, start: int, max_bytes: int) -> dict[str, Any]:
        """The whole records from ``start`` in its segment, up to ``max_bytes``."""
        store = self.core.store
        if start >= store.log_end:
            return {"base": -1, "data": ""}
        seg, seg_end = store.segment_at(start)
        stop = min(seg_end, start + max_bytes)
        data = seg.pread(stop - start, start - seg.base)
        n = whole_records(data)
        if n == 0 and data:   # one record larger than max_bytes: send it whole
            size = 4 + int.from_bytes(data[:4], "little")
            data = seg.pread(size, start - seg.base)
            n = len(data)
        out: dict[str, Any] = {"base": seg.base, "data": base64.b64encode(data[:n]).decode()}
        if start == seg.base and seg.base > 0:
            out["qstart"] = seg.read_qstart() or {}
        return out

    def _clusters(self) -> dict[str, Any]:
        store = self.core.store
        out = {}
        for name in sorted(store.clusters())[:MAX_CLUSTERS]:
            out[name] = {"positions": store.load_positions(name),
                         "meta": store.cluster_meta(name),
                         "counters": store.cluster_counters(name)}
        return out

    def status(self, _args: dict[str, Any]) -> dict[str, Any]:
        """``replica.status``: where the standby is."""
        store = self.core.store
        seen = self.last_fetch
        return {"ok": True, "role": "primary", "sync": self.settings.sync,
                "in_sync": self.in_sync, "waiting": len(self._waiters), "acked": self.acked, "log_end": store.log_end,
                "lag_bytes": store.log_end - self.acked if self.acked >= 0 else None,
                "standby_seen_s_ago": round(time.monotonic() - seen, 3) if seen else None}


    def gauges(self) -> dict[str, tuple[str, float]]:
        """The primary's replication state for ``/metrics`` (``lockmq_replication_*``)."""
        store = self.core.store
        log_end = store.log_end if store is not None else 0
        seen = time.monotonic() - self.last_fetch if self.last_fetch else -1.0
        live = 0 <= seen < self.settings.fetch_wait_ms / 1000 + STANDBY_SILENT_S
        out = {
            "replication_primary": ("1: this broker serves as the primary (a standby "
                                    "exports its own lockmq_replication_* gauges)", 1),
            "replication_sync": ("1 when acks wait for the standby ([replication] sync)",
                                 1 if self.settings.sync else 0),
            "replication_in_sync": ("1 while acks wait for the standby (sync, caught up, "
                                    "not degraded)", 1 if self.in_sync else 0),
            "replication_standby_connected": ("1 while a standby fetches (seen within "
                                              "fetch_wait_ms + 5 s)", 1 if live else 0),
            "replication_standby_last_fetch_seconds": (
                "Seconds since the standby's last fetch (-1: none since the start)", seen),
            "replication_log_end_bytes": ("Commit-log offset written here", log_end),
            "replication_fenced": ("1 while this primary refuses writes: fence_after_s is "
                                   "set and its standby is not following in sync",
                                   1 if self.fenced() else 0),
        }
        if self.acked >= 0:
            out["replication_lag_bytes"] = ("Commit-log bytes the standby does not have "
                                            "yet (what a crash here would lose without "
                                            "sync)", max(0, log_end - self.acked))
        return out


def primary_source(config: Any, core: Any, stats: Any, log: Any) -> ReplicaSource:
    """The primary's side of replication for a broker being built (one call from
    ``Broker.__init__``, which declares what it offers: :meth:`ReplicaSource.ops` to
    the admin ops, and in sync mode :attr:`ReplicaSource.durable_gate` as the core's
    one gate between durable and acknowledged -- clients' publishes and the broker's
    own records (a transaction's end, a scheduled delivery) wait for the standby
    alike). Nothing here reaches into the broker."""
    settings = ReplicationSettings.from_table(config.replication)
    src = ReplicaSource(core, settings, stats, log)
    sec = config.security_config()
    src.registry = RegistrySource(sec.registry_path, sec.master_key_path)
    return src
