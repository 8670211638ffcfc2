"""The writer thread: group commit, segment rolls and checkpoints.

Appends queue here (:meth:`GroupCommit.submit`); one thread takes everything queued
(up to ``max_batch_bytes``), drops duplicates, assigns offsets (:meth:`_plan`),
writes index entries and log bytes with one ``pwrite`` per segment, fdatasyncs once
(:meth:`_write`) and reports back to the event loop, which makes the batch visible.
While one batch is being synced the next one gathers. A failed batch is undone
(:meth:`_undo`); an error that cannot be proven harmless stops all writes
(``failed``). Between batches the thread snapshots a checkpoint and hands the slow
part (index fsyncs, the file) to a helper thread.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from lockmq import accel
from lockmq.clock import SYSTEM_CLOCK, Clock, steady_ms_of

from . import checkpoint as ckpt
from .config import StoreConfig
from .dedup import DedupTable, is_system_sn
from .errors import StoreBusy, StoreFailed, StoreFull
from .files import fsync_dir
from .index import ENTRY, ENTRY_SIZE, TopicIndex
from .records import Appended, NewRecord
from .segment import Segment, SegmentList
from .topic import Topic

log = logging.getLogger("lockmq.store")

#: the compiled per-record loop of :meth:`GroupCommit._plan` (lockmq._core), or None
_plan_run = accel.speedups.plan_run if accel.COMPILED else None
#: the same over whole append calls of a batch (lockmq._core), or None
_plan_calls = accel.speedups.plan_calls if accel.COMPILED else None
#: the compiled file work of a one-segment commit (lockmq._core), or None
_commit_write = accel.speedups.commit_write if accel.COMPILED else None

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

#: ``on_visible(new_segments, log_end, [(topic, new queue end)])``, called on the loop
Publish = Callable[[list[Segment], int, list[tuple[Topic, int]]], None]


#: ``then(results, error)``: exactly one of the two is None (see :class:`Answer`)
Then = Callable[["list[Appended] | None", "BaseException | None"], None]


class Answer:
    """Where the writer puts one append's outcome without a future: ``then`` is called
    on the loop at once when the batch is durable (or failed), not one ``call_soon``
    later as a future's callbacks would be; the publish path answers producers from
    it. Duck-types the three methods of :class:`asyncio.Future` the writer uses."""

    __slots__ = ("_then", "_fired")

    def __init__(self, then: Then) -> None:
        self._then = then
        self._fired = False

    def done(self) -> bool:
        return self._fired

    def set_result(self, results: list[Appended]) -> None:
        self._fire(results, None)

    def set_exception(self, exc: BaseException) -> None:
        self._fire(None, exc)

    def _fire(self, results: list[Appended] | None, exc: BaseException | None) -> None:
        self._fired = True
        try:
            self._then(results, exc)
        except Exception:  # noqa: BLE001 -- one caller's bug must not stop the others' answers
            log.exception("store: an append's answer callback failed")


class _Chunk:
    """Bytes of one batch that go to one segment (``new``: a segment this batch starts,
    with ``qstart`` its queue-start sidecar)."""

    __slots__ = ("base", "file_pos", "parts", "new", "qstart", "segment")

    def __init__(self, base: int, file_pos: int, new: bool, qstart: dict[str, int] | None):
        self.base = base
        self.file_pos = file_pos
        self.parts: list[bytes] = []
        self.new = new
        self.qstart = qstart
        self.segment: Segment | None = None


class _Plan:
    """One group commit: what to write where, and what to answer each caller."""

    __slots__ = ("entries", "results", "chunks", "index", "ids", "end", "nbytes", "now_ms")

    def __init__(self) -> None:
        self.entries: list = []
        self.results: list[list[Appended]] = []
        self.chunks: list[_Chunk] = []
        self.index: dict[str, tuple[Topic, int, bytearray]] = {}
        self.ids: list[tuple[str, int]] = []
        self.end = 0
        self.nbytes = 0
        self.now_ms = 0.0


def _no_wakeup_preemption() -> None:
    """Put the calling thread in ``SCHED_BATCH`` (Linux): its CPU share is unchanged,
    but its wake-ups no longer preempt the thread that runs (the scheduler lets it in
    at the next tick or when that thread sleeps). Elsewhere, or where the policy
    cannot be set (a seccomp filter), nothing changes."""
    setsched = getattr(os, "sched_setscheduler", None)
    if setsched is None or not hasattr(os, "SCHED_BATCH"):
        return
    try:
        setsched(threading.get_native_id(), os.SCHED_BATCH, os.sched_param(0))
    except OSError as exc:
        log.info("store: the writer thread keeps the default scheduling: %r", exc)


class GroupCommit:
    """The store's single writer: the queue of appends and the thread that writes it.

    ``topics`` and ``dedup`` are the store's (the thread reads and advances them
    between batches); ``stats`` is the store's counter dict. ``on_visible`` runs on
    the loop after each batch is durable (``sync``) or written (``async``).
    """

    def __init__(self, config: StoreConfig, data_dir: str, segments: SegmentList,
                 log_end: int, topics: dict[str, Topic], dedup: DedupTable,
                 stats: dict[str, int], on_visible: Publish, clock: Clock = SYSTEM_CLOCK,
                 active_first_ms: float | None = None) -> None:
        self.config = config
        self.clock = clock
        self._segment_ms = config.limit("segment_ms")
        #: clock time of the active segment's first record (None while it is empty)
        #: and of its last write: its age for ``segment_ms`` and, once closed, for
        #: retention (the closed file's mtime is set to it)
        self._active_first_ms = active_first_ms
        self._active_last_ms = steady_ms_of(clock) if active_first_ms is None \
            else segments.active.mtime_ms()
        self.data_dir = data_dir
        self._segments = segments
        self._topics = topics
        self._dedup = dedup
        self.stats = stats
        self._on_visible = on_visible
        self._sync = config.flush == "sync"
        self._max_pending = config.max_pending_bytes
        self._active = segments.active  # the writer's active segment (may run ahead)
        self._active.open_writer()
        self._w_end = log_end
        self._prealloc = config.preallocate_bytes
        #: how far the active segment's file is written, records or zeros (its size)
        self._zeroed_to = os.fstat(self._active.write_fd).st_size
        self._zeros = memoryview(bytes(self._prealloc))
        self._no_room_for_zeros = False   # (logged once per spell of a full disk)
        self._pending: list = []
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._w_idle = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._done: asyncio.Future | None = None
        #: set by close: the thread writes what is queued, checkpoints and ends
        self.closing = False
        #: the error that stopped all writes (None while healthy)
        self.failed: BaseException | None = None
        #: cleared by Store.writes_held (tests, drills): the thread takes no new
        #: batch, so appends queue up to max_pending_bytes as on a stalled disk
        self.may_write = threading.Event()
        self.may_write.set()
        self._last_ckpt_t = time.monotonic()
        self._last_ckpt_end = 0
        self._unsynced = False
        self._free_t = 0.0  # when the disk's free space was last looked at
        self._free_at = 0  # free bytes then
        self._free_used = 0  # bytes written since

    @property
    def waits_for_work(self) -> bool:
        """True while the thread waits for work (see :attr:`Store.writer_waits`)."""
        return self._w_idle

    @property
    def started(self) -> bool:
        """True once the thread runs (bound to the loop of the first append)."""
        return self._thread is not None

    def submit(self, records: list[NewRecord], enc: list[bytes], n: int,
               ts_s: int, answer: Answer | None = None) -> "asyncio.Future | Answer":
        """Queue encoded records (``n`` bytes, broker time ``ts_s``); the returned
        future (or ``answer``, when given) gets their :class:`Appended` results.
        Raises :class:`StoreBusy`."""
        if self._thread is None:
            self._start()
        fut = self._loop.create_future() if answer is None else answer  # type: ignore[union-attr]
        with self._lock:  # the condition's lock (a C-level context manager: cheaper)
            if self._pending and self._pending_bytes + n > self._max_pending:
                raise StoreBusy(f"{self._pending_bytes} bytes are waiting to be written")
            self._pending.append((records, enc, n, fut, ts_s))
            self._pending_bytes += n
            if self._w_idle:
                # one wake-up is enough: until the writer runs (it needs the GIL),
                # later appends would each pay for a pure-Python notify(). (Waking it
                # only after the loop iteration instead was measured and not kept: see
                # _no_wakeup_preemption, and docs/performance.md "Measured and not kept".)
                self._w_idle = False
                self._cond.notify()
        return fut

    def roll_due(self, now_ms: float | None = None) -> bool:
        """True if the active segment holds records and is older than ``segment_ms``."""
        first = self._active_first_ms
        if self._segment_ms is None or first is None:
            return False
        now = steady_ms_of(self.clock) if now_ms is None else now_ms
        return now - first >= self._segment_ms

    def _start(self) -> None:
        """Start the writer thread, bound to the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._done = self._loop.create_future()
        self._thread = threading.Thread(target=self._main, name="lockmq-store-writer",
                                        daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Write everything queued, checkpoint and end the thread (if it runs)."""
        if self._thread is None:
            self.stop_idle()
            return
        self.closing = True
        with self._cond:
            self._cond.notify()
        assert self._done is not None
        await self._done
        self._thread.join()

    def stop_idle(self) -> None:
        """Stop a writer whose thread never started (a store used without a loop):
        take no more appends and checkpoint here."""
        self.closing = True
        if self.failed is None:
            self.try_checkpoint()

    def close(self) -> None:
        """Close the writer's descriptor of the active segment."""
        self._active.close_writer()

    # ------------------------------------------------------------------ the thread

    def _main(self) -> None:
        if self.config.writer_sched == "batch":
            _no_wakeup_preemption()
        loop = self._loop
        assert loop is not None
        cond = self._cond
        flush_s = self.config.flush_interval_ms / 1000
        ckpt_s = self.config.checkpoint_interval_ms / 1000
        ckpt_bytes = self.config.checkpoint_bytes
        next_flush = time.monotonic() + flush_s
        ckpt_exec = ThreadPoolExecutor(1, thread_name_prefix="lockmq-checkpoint")
        ckpt_fut = None
        try:
            while True:
                self.may_write.wait()
                with cond:
                    while not self._pending and not self.closing:
                        # idle: wake up for the async flush and for a due checkpoint
                        now = time.monotonic()
                        due = []
                        if not self._sync and self._unsynced and self.failed is None:
                            due.append(next_flush)
                        if self._w_end != self._last_ckpt_end and self.failed is None:
                            if ckpt_fut is None or ckpt_fut.done():
                                due.append(self._last_ckpt_t + ckpt_s)
                            else:  # one is being written: look again shortly
                                due.append(now + 0.01)
                        timeout = None
                        if due:
                            timeout = min(due) - now
                            if timeout <= 0:
                                break
                        self._w_idle = True
                        cond.wait(timeout)
                        self._w_idle = False
                    batch = self._take_batch()
                if batch:
                    self._process(batch)
                elif self.closing:
                    break
                now = time.monotonic()
                if not self._sync and self._unsynced and now >= next_flush \
                        and self.failed is None:
                    try:
                        self._flush()
                    except OSError as exc:
                        log.error("store: fdatasync failed, refusing further writes: %r", exc)
                        self.failed = exc
                    next_flush = now + flush_s
                if (self.failed is None and (ckpt_fut is None or ckpt_fut.done())
                        and self._w_end != self._last_ckpt_end
                        and (now - self._last_ckpt_t > ckpt_s
                             or self._w_end - self._last_ckpt_end > ckpt_bytes)):
                    # the snapshot is taken here, between batches; the slow part
                    # (fsync of indexes, encoding, the file) runs beside the writer
                    self._last_ckpt_t = now
                    try:
                        cp = self._checkpoint_snapshot()
                        ckpt_fut = ckpt_exec.submit(self._checkpoint_write, cp)
                    except OSError as exc:
                        log.error("store: checkpoint failed: %r", exc)
            if ckpt_fut is not None:
                ckpt_fut.exception()  # wait for it; errors were logged
            if self.failed is None:
                self.try_checkpoint()
        except BaseException as exc:  # pragma: no cover - must never kill silently
            log.exception("store: writer thread died")
            self.failed = exc
            with cond:
                rest, self._pending = self._pending, []
            loop.call_soon_threadsafe(self._fail, rest, StoreFailed(f"writer died: {exc!r}"))
        finally:
            ckpt_exec.shutdown(wait=True)
            loop.call_soon_threadsafe(self._writer_done)

    def _writer_done(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _take_batch(self) -> list:
        """Take queued appends up to ``max_batch_bytes`` (caller holds the lock)."""
        pend = self._pending
        if not pend:
            return []
        limit = self.config.max_batch_bytes
        total = 0
        k = len(pend)
        for i, item in enumerate(pend):
            if total and total + item[2] > limit:
                k = i
                break
            total += item[2]
        if k == len(pend):
            batch, self._pending = pend, []
        else:
            batch = pend[:k]
            del pend[:k]
        self._pending_bytes -= total
        return batch

    def _process(self, batch: list) -> None:
        loop = self._loop
        assert loop is not None
        if self.failed is not None:
            loop.call_soon_threadsafe(self._fail, batch,
                                      StoreFailed(f"store failed earlier: {self.failed!r}"))
            return
        try:
            plan = self._plan(batch)
        except Exception as exc:
            # (a bug or MemoryError, in the Python loop or a compiled one): refuse
            # this batch. Nothing was written and only the plan's own objects were
            # changed (queue offsets are assigned at its end), so the store goes on;
            # not answering the calls would leave their appenders waiting forever.
            log.error("store: planning a batch failed, refusing it: %r", exc)
            loop.call_soon_threadsafe(self._fail, batch,
                                      StoreFailed(f"planning the batch failed: {exc!r}"))
            return
        if plan.chunks:
            try:
                self._write(plan)
            except StoreFull as exc:
                self.stats["store_full"] += 1
                self._rollback(plan)
                loop.call_soon_threadsafe(self._fail, batch, exc)
                return
            except BaseException as exc:
                log.error("store: write failed, refusing further writes: %r", exc)
                self.failed = exc
                self._rollback(plan)
                loop.call_soon_threadsafe(self._fail, batch,
                                          StoreFailed(f"write failed: {exc!r}"))
                return
        self._dedup.add_many(plan.ids)
        self._w_end = plan.end
        self.stats["records"] += len(plan.ids)
        self.stats["batches"] += 1
        self.stats["bytes"] += plan.nbytes
        loop.call_soon_threadsafe(self._complete, plan)

    @staticmethod
    def _rollback(plan: _Plan) -> None:
        for t, first, _blob in plan.index.values():
            t.next = first

    @staticmethod
    def _fail(batch: list, exc: BaseException) -> None:
        for item in batch:
            fut = item[3]
            if not fut.done():
                fut.set_exception(exc)

    def _plan(self, batch: list) -> _Plan:
        """Classify duplicates, assign offsets and queue offsets, cut segment rolls.

        The per-record loop is the store's hottest code: state of the current topic
        (queue offset, index blob) is kept in locals and written back on a switch.
        """
        plan = _Plan()
        seg_bytes = self.config.segment_bytes
        contains = self._dedup.contains
        hw = self._dedup.high_water()
        hw_of = hw.get
        seen: set[tuple[str, int]] = set()
        topics = self._topics
        pindex = plan.index
        ids = plan.ids
        pack = ENTRY.pack
        new_app = tuple.__new__
        results = plan.results
        pos = self._w_end
        active_base = self._active.base
        # the roll rules: size, and age (``segment_ms``: the limit drops to ``pos``)
        # steady time (lockmq.clock): segment ages must not jump with the wall clock
        plan.now_ms = steady_ms_of(self.clock)
        time_roll = self.roll_due(plan.now_ms) and pos > active_base
        seg_limit = pos if time_roll else active_base + seg_bytes
        # the first chunk goes to the active segment; dropped below if it stays empty
        first = chunk = _Chunk(active_base, pos - active_base, False, None)
        plan.chunks.append(chunk)
        parts = chunk.parts
        dup = 0
        counters: dict[str, list] = {}  # topic -> [index blob, next queue offset]
        topic = None
        c: list = []
        q = 0
        blob = bytearray()
        run = _plan_run   # the compiled loop for the common record (None: Python only)
        calls = _plan_calls  # the compiled loop over whole calls (None: Python only)
        k, nb = 0, len(batch)
        while k < nb:
            res: list[Appended] = []
            i = 0
            if calls is not None:   # whole calls in C, up to the first other record
                k, i, pos, q, res = calls(batch, k, pos, q, topic, seg_limit, active_base,
                                          seen, hw, ids, parts, blob, results, Appended)
                if k >= nb:
                    break
            records, enc, _n, _fut, ts_s = batch[k]
            n = min(len(records), len(enc))
            # (a one-record call is cheaper inline: plan_run's argument parsing costs
            # more than the Python loop's one turn -- the broker's sync-100 case)
            fast = run is not None and n > 1 and type(records) is list \
                and type(enc) is list and 0 <= ts_s <= 0xFFFFFFFF
            # plan_calls stopped at records[i] because the C loop refuses it (plan_run
            # would too, with the same state): Python takes it before asking C again
            refused = calls is not None
            while i < n:
                # new records of the current topic in C, up to the first other one
                if fast and not refused:
                    i, pos, q = run(records, enc, i, pos, q, topic, seg_limit, active_base,
                                    seen, hw, ids, parts, blob, res, ts_s, Appended)
                    if i >= n:
                        break
                refused = False
                rec = records[i]
                b = enc[i]
                i += 1
                sn = rec.sn
                seq = rec.seq
                key = (sn, seq)
                # most records are above their lock's high water: new, no full check
                e = hw_of(sn)
                # (contains() is False for the broker's own "$" ids: never dropped)
                # (a system id is never a duplicate, in this batch or another: the
                # broker numbers its own records; see dedup.py)
                if (key in seen and not is_system_sn(sn)) \
                        or (e is not None and seq <= e[0] and contains(sn, seq)):
                    res.append(new_app(Appended, (-1, rec.topic, -1, True)))
                    dup += 1
                    continue
                seen.add(key)
                size = len(b)
                if pos + size > seg_limit and pos > active_base:
                    if c:
                        c[1] = q  # the new segment records every topic's next offset
                    active_base = pos
                    seg_limit = pos + seg_bytes
                    chunk = self._roll_chunk(pos, counters)
                    plan.chunks.append(chunk)
                    parts = chunk.parts
                if rec.topic != topic:  # batches are mostly one topic (equal, not
                    # always the same object: the broker decodes each read's topic)
                    if c:
                        c[1] = q
                    topic = rec.topic
                    c = counters.get(topic)  # type: ignore[assignment]
                    if c is None:
                        t = topics[topic]
                        c = counters[topic] = [bytearray(), t.next]
                        pindex[topic] = (t, t.next, c[0])
                    blob, q = c
                blob += pack(pos, size, ts_s)
                parts.append(b)
                ids.append(key)
                res.append(new_app(Appended, (pos, topic, q, False)))
                q += 1
                pos += size
            results.append(res)
            k += 1
        if c:
            c[1] = q
        if time_roll:
            self.stats["time_rolls"] += 1
            if len(plan.chunks) == 1:   # no record came: close the old segment anyway
                plan.chunks.append(self._roll_chunk(pos, counters))
        if not first.parts:
            plan.chunks.remove(first)
        for t, first_q, blob in pindex.values():
            t.next = first_q + len(blob) // ENTRY_SIZE
        self.stats["duplicates"] += dup
        plan.entries = batch
        plan.end = pos
        plan.nbytes = pos - self._w_end
        return plan

    def _roll_chunk(self, pos: int, counters: dict[str, list]) -> _Chunk:
        """A chunk starting a new segment at ``pos``, with every topic's next queue
        offset there (``counters``: this batch's ``[index blob, next]`` per topic)."""
        qs = {}
        for name, t in list(self._topics.items()):
            c = counters.get(name)
            qs[name] = c[1] if c is not None else t.next
        return _Chunk(pos, 0, True, qs)

    def _check_free_space(self, nbytes: int) -> None:
        """Raise :class:`StoreFull` if writing ``nbytes`` would eat into the reserve.

        statvfs at most every 50 ms, unless the writes since the last look could
        have used up a quarter of the room above the reserve.
        """
        reserve = self.config.min_free_bytes
        now = time.monotonic()
        self._free_used += nbytes
        if now - self._free_t > 0.05 or self._free_used * 4 > self._free_at - reserve:
            st = os.statvfs(self._segments.seg_dir)
            self._free_at = st.f_bavail * st.f_frsize
            self._free_t = now
            self._free_used = nbytes
        free = self._free_at - self._free_used + nbytes
        if free - nbytes < reserve:
            self._free_t = 0.0  # look again next time
            self._free_used -= nbytes
            raise StoreFull(f"only {free} bytes free on the data disk, reserve is {reserve}")

    def _zeros_ahead(self, plan: _Plan) -> tuple[int, int]:
        """``(file position, bytes)`` of the zeros this commit writes ahead of the
        active segment's new end (``preallocate_bytes``), ``(0, 0)`` for none.

        They go out when the records come within half of ``preallocate_bytes`` of the
        zeros' end, up to ``preallocate_bytes`` past the records (never past
        ``segment_bytes``): the commit that writes them pays the file-size change.
        """
        last = plan.chunks[-1]
        end = plan.end - last.base
        zeroed = 0 if last.new else self._zeroed_to
        if not self._prealloc or zeroed - end >= self._prealloc // 2:
            return 0, 0
        start = max(zeroed, end)
        stop = min(end + self._prealloc, self.config.segment_bytes)
        return (start, stop - start) if stop > start else (0, 0)

    def _write(self, plan: _Plan) -> None:
        """Index entries, log bytes, zeros ahead, fdatasync; undo on error (StoreFull
        on ENOSPC). A disk without room for the zeros gets the records alone."""
        zpos, zlen = self._zeros_ahead(plan)
        if zlen:
            try:
                self._write_with(plan, zpos, zlen)
                self._no_room_for_zeros = False
                return
            except StoreFull:   # (undone: the same plan can be written again)
                if self.failed is not None:   # the undo itself failed: stop here
                    raise
                if not self._no_room_for_zeros:
                    log.warning("store: no room for %d bytes of zeros ahead of the log "
                                "end; writing records without them", zlen)
                self._no_room_for_zeros = True
        self._write_with(plan, 0, 0)

    def _write_with(self, plan: _Plan, zpos: int, zlen: int) -> None:
        """:meth:`_write` with ``zlen`` bytes of zeros at ``zpos`` (0: none)."""
        if self.config.min_free_bytes:
            self._check_free_space(plan.nbytes + zlen)
        idx_undo: list[tuple[TopicIndex, int]] = []
        created: list[Segment] = []
        written: list[Segment] = []
        old = self._active
        if _commit_write is not None and len(plan.chunks) == 1 and not plan.chunks[0].new:
            self._write_one(plan, idx_undo, zpos, zlen)
            return
        try:
            for t, first, blob in plan.index.values():
                idx_undo.append((t.index, t.index.count))
                t.index.write_entries(first, bytes(blob))
            for ch in plan.chunks:
                if ch.new:
                    seg = ch.segment = Segment.create(self._segments.seg_dir, ch.base)
                    created.append(seg)
                else:
                    seg = old
                if ch.parts:
                    seg.write_at(ch.parts[0] if len(ch.parts) == 1 else b"".join(ch.parts),
                                 ch.file_pos)
                    written.append(seg)
            synced = list(written)
            if zlen:
                last = created[-1] if created else old
                last.write_at(self._zeros[:zlen], zpos)
                if last not in synced:
                    synced.append(last)
            for ch in plan.chunks:
                if ch.new:
                    ch.segment.write_qstart(ch.qstart or {})  # type: ignore[union-attr]
            if created and self._zeroed_to > created[0].base - old.base:
                # a closed segment ends where its last record ends (its zeros go)
                old.truncate(created[0].base - old.base)
                if old not in synced:
                    synced.append(old)
            if self._sync:
                for seg in synced:
                    seg.sync()
                self.stats["fsyncs"] += len(synced)
            elif created:
                # a closed segment is always durable, also in async mode
                for seg in (old, *created[:-1]):
                    seg.sync()
            if created:
                fsync_dir(self._segments.seg_dir)
        except OSError as exc:
            raise self._undo_failed_write(plan, idx_undo, created, exc)
        now = plan.now_ms
        if created:
            # a closed segment's mtime is its last write on the store's clock: the
            # age retention reads, also after a restart
            old.set_mtime_ms(now if old in written else self._active_last_ms)
            old.close_writer()
            for seg in created[:-1]:
                seg.set_mtime_ms(now)
                seg.close_writer()
            self._active = created[-1]
            self._active_first_ms = None
            self._zeroed_to = 0
        self._zeroed_to = max(self._zeroed_to, plan.end - self._active.base, zpos + zlen)
        self._wrote(now, self._active in written)

    def _wrote(self, now: float, active_written: bool) -> None:
        """After a commit's writes: the active segment's age marks (``segment_ms``,
        retention) and, in ``async`` mode, that an fdatasync is owed."""
        if active_written:
            self._active_last_ms = now
            if self._active_first_ms is None:
                self._active_first_ms = now
        if not self._sync:
            self._unsynced = True

    def _write_one(self, plan: _Plan, idx_undo: list[tuple[TopicIndex, int]],
                   zpos: int, zlen: int) -> None:
        """:meth:`_write` of the common commit -- every record in the active segment,
        no roll -- in one C call: index pwrites (and the zeros ahead, if due), one log
        pwrite, fdatasync (``sync``), with the GIL released once rather than per
        system call."""
        seg = self._active
        ch = plan.chunks[0]
        writes = []
        for t, first, blob in plan.index.values():
            idx = t.index
            idx_undo.append((idx, idx.count))
            writes.append((idx.fd, blob, idx.entry_pos(first)))
        if zlen:
            writes.append((seg.write_fd, self._zeros[:zlen], zpos))
        try:
            _commit_write(writes, seg.write_fd, ch.parts, ch.file_pos,  # type: ignore[misc]
                          self._sync)
        except OSError as exc:
            raise self._undo_failed_write(plan, idx_undo, [], exc)
        self._zeroed_to = max(self._zeroed_to, plan.end - seg.base, zpos + zlen)
        for t, first, blob in plan.index.values():
            t.index.wrote(first, len(blob) // ENTRY_SIZE)
        if self._sync:
            self.stats["fsyncs"] += 1
        self._wrote(plan.now_ms, True)

    def _undo_failed_write(self, plan: _Plan, idx_undo: list[tuple[TopicIndex, int]],
                           created: list[Segment], exc: OSError) -> OSError | StoreFull:
        """Undo a batch whose write raised ``exc``; the error to raise for it:
        :class:`StoreFull` on a full disk (the store goes on), else ``exc`` itself."""
        self._undo(plan, idx_undo, created)
        if exc.errno in _NO_SPACE:
            full = StoreFull(f"disk full: {exc}")
            full.__cause__ = exc
            return full
        return exc

    def _undo(self, plan: _Plan, idx_undo: list[tuple[TopicIndex, int]],
              created: list[Segment]) -> None:
        try:
            for idx, count in idx_undo:
                idx.truncate(idx.base + count)
            first = plan.chunks[0] if plan.chunks else None
            if first is not None and not first.new:
                self._active.truncate(first.file_pos)
            for seg in created:
                seg.delete()
            # the zeros ahead may be gone with the cut, or never have been written
            self._zeroed_to = os.fstat(self._active.write_fd).st_size
        except OSError as exc:  # cannot even undo: stop writing
            self.failed = exc
            log.error("store: undoing a failed batch failed: %r", exc)

    def _complete(self, plan: _Plan) -> None:
        """On the loop: publish the batch (it is durable, or written in async mode)."""
        self._on_visible([ch.segment for ch in plan.chunks if ch.segment is not None],
                         plan.end,
                         [(t, first + len(blob) // ENTRY_SIZE)
                          for t, first, blob in plan.index.values()])
        for (_r, _enc, _n, fut, _ts), res in zip(plan.entries, plan.results):
            if not fut.done():
                fut.set_result(res)

    def _flush(self) -> None:
        self._unsynced = False
        self._active.sync()
        self.stats["fsyncs"] += 1

    # ------------------------------------------------------------------ checkpoint

    def _checkpoint_snapshot(self) -> ckpt.Checkpoint:
        """Between batches: capture the state at the written log end (in async mode
        after making the log durable up to there)."""
        if not self._sync:
            self._unsynced = False
            self._active.sync()
        return ckpt.Checkpoint(self._w_end, time.time_ns() // 1000,
                               {name: t.next for name, t in list(self._topics.items())},
                               self._dedup.items())  # type: ignore[arg-type]

    def _checkpoint_write(self, cp: ckpt.Checkpoint) -> None:
        """Make a snapshot the recovery start point: fsync the indexes (they hold
        every entry below the snapshot's queue ends), then replace the checkpoint."""
        try:
            for t in list(self._topics.values()):
                t.index.sync()
            fsync_dir(self.data_dir)
            cp.dedup = DedupTable.encode(cp.dedup)  # type: ignore[arg-type]
            ckpt.save(self.data_dir, cp)
        except OSError as exc:
            log.error("store: checkpoint failed: %r", exc)
            raise
        self._last_ckpt_end = cp.log_end
        self.stats["checkpoints"] += 1

    def checkpoint_now(self) -> None:
        """Checkpoint synchronously (at open, at close, without a writer thread)."""
        self._active.sync()
        cp = self._checkpoint_snapshot()
        self._checkpoint_write(cp)
        self._last_ckpt_t = time.monotonic()

    def try_checkpoint(self) -> None:
        """:meth:`checkpoint_now`, logging (not raising) a failure: used at close."""
        try:
            self.checkpoint_now()
        except OSError as exc:
            log.warning("store: checkpoint at close failed (%r); the next open re-reads "
                        "the log tail instead", exc)
