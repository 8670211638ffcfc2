"""The publish path: every PUBLISH read in one loop iteration, from every connection,
goes to the store in one ``append`` (one group commit), and each producer gets its
answers in one socket write.

A connection hands over the records of one read with :meth:`PublishPath.submit`
and a callback; the first submit of a loop iteration schedules
:meth:`PublishPath._flush` with ``call_soon``, so it runs after every connection
readable in this iteration was read. The callback gets one result per record: the
store's :class:`~lockmq.store.Appended`, an :class:`~lockmq.store.InvalidRecord`
(refused alone: the store answers per record, and the others of the batch are
stored in the same group commit), or a :class:`PublishRefused` when nothing of the
batch was stored (BUSY, STORAGE_FULL, SHUTTING_DOWN, a store failure). This module
never sees a frame.

The store answers through a callback (``append_then``), run on the loop in the same
iteration the writer thread reports the group commit durable: no task and no
future between the fsync and the producers' acks (docs/performance.md, "Group commit and
the store's answer").
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Callable, Protocol

from lockmq.protocol import ErrorCode
from lockmq.store import Appended, NewRecord, StoreBusy, StoreClosed, StoreFull

from .logs import EventLog, Stats

#: what the store did with each record of one submit, in order
Results = list["Appended | Exception"]
#: a submitter's callback
Done = Callable[[Results], None]


class RecordSink(Protocol):
    """Where the publish path stores records (``BrokerCore.append``)."""

    def append_then(self, records: list[NewRecord],
                    then: Callable[[list[Appended] | None, BaseException | None], None]) -> None:
        """Queue ``records`` for one group commit; ``then(results, error)`` on the loop
        once durable, a result per record (an invalid one's is its InvalidRecord).
        Raises what is refused before queuing (busy, closed)."""


class PublishRefused(Exception):
    """Nothing of the batch was stored: the wire code, message and retry hint."""

    def __init__(self, code: int, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms


#: retry-after hints of the answers to a batch the store could not take
BUSY_RETRY_MS = 50
FULL_RETRY_MS = 5000


class PublishPath:
    """Gathers publishes across connections and stores them together."""

    def __init__(self, sink: RecordSink, stats: Stats, log: EventLog, max_batch: int) -> None:
        self.sink = sink
        self.stats = stats
        self.log = log
        self.max_batch = max_batch
        self._groups: list[tuple[list[NewRecord], Done]] = []
        self._count = 0
        self._scheduled = False
        self._busy_logged = -1.0
        #: the broker's loop, fetched once (get_running_loop costs a getpid each on 3.11)
        self._loop: asyncio.AbstractEventLoop | None = None

    def submit(self, records: list[NewRecord], done: Done) -> None:
        """Queue ``records`` for storing; ``done(results)`` is called once with one
        result per record (see the module docstring)."""
        self._groups.append((records, done))
        self._count += len(records)
        if self._count >= self.max_batch:
            self._flush()
        elif not self._scheduled:
            loop = self._loop
            if loop is None or loop.is_closed():   # (a broker started again: its new loop)
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._flush)
            self._scheduled = True

    def submit_now(self, records: list[NewRecord], done: Done) -> None:
        """:meth:`submit`, handed to the store before this returns (with whatever
        was queued before it, in order)."""
        self._groups.append((records, done))
        self._count += len(records)
        self._flush()

    def _flush(self) -> None:
        self._scheduled = False
        if not self._groups:
            return
        groups = self._groups
        self._groups = []
        self._count = 0
        # (one connection's read, the usual flush at one record per read: its list)
        records = groups[0][0] if len(groups) == 1 else \
            [r for recs, _ in groups for r in recs]
        self.stats.c["publish_batches"] += 1
        # the store calls back on the loop as soon as the group commit is durable:
        # no task, no future hop (one loop iteration from fsync to the acks' write)
        try:
            self.sink.append_then(records, partial(self._durable, time.monotonic(), groups,
                                                   records))
        except Exception as exc:  # noqa: BLE001 -- refused before queuing (busy, closed)
            self._answer(groups, records, None, exc)

    def _durable(self, t0: float, groups: list[tuple[list[NewRecord], Done]],
                 records: list[NewRecord], res: Results | None,
                 exc: BaseException | None) -> None:
        """The store's answer to a flush handed over at ``t0``: timed, then answered."""
        if res is not None:
            self.stats.latency.publish_ack.observe(time.monotonic() - t0, len(records))
        self._answer(groups, records, res, exc)

    def _answer(self, groups: list[tuple[list[NewRecord], Done]], records: list[NewRecord],
                res: Results | None, exc: BaseException | None) -> None:
        """The store's answer for one flush: each submitter gets its slice."""
        if res is None:
            res = self.refusals(exc, len(records))
        if len(groups) == 1:   # (no slice to make)
            groups[0][1](res)
            return
        i = 0
        for recs, done in groups:
            n = len(recs)
            done(res[i:i + n])
            i += n

    def refusals(self, exc: BaseException | None, n: int) -> Results:
        """One :class:`PublishRefused` per record of a batch the store did not take."""
        if isinstance(exc, StoreBusy):
            self.stats.c["publish_busy"] += n
            full = isinstance(exc, StoreFull)
            self._log_busy(full, exc)
            refusal = PublishRefused(
                int(ErrorCode.STORAGE_FULL if full else ErrorCode.BUSY),
                "storage full (disk reserve reached), retry later" if full
                else "busy: the store is behind, retry later",
                FULL_RETRY_MS if full else BUSY_RETRY_MS)
        elif isinstance(exc, StoreClosed):
            refusal = PublishRefused(int(ErrorCode.SHUTTING_DOWN),
                                     "the broker is shutting down", 1000)
        else:   # StoreFailed etc.: never ack
            self.log("publish_failed", error=repr(exc), records=n, level="error")
            refusal = PublishRefused(int(ErrorCode.INTERNAL), "storage error", 1000)
        return [refusal] * n

    def _log_busy(self, full: bool, exc: Exception) -> None:
        """Log store back-pressure at most once a second."""
        now = time.monotonic()
        if self._busy_logged < 0 or now - self._busy_logged >= 1.0:
            self._busy_logged = now
            self.log("publish_busy", reason="storage full" if full else "store queue full",
                     detail=str(exc), total=self.stats.c["publish_busy"], level="warning")
