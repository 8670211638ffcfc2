"""The storage engine: :class:`Store`, the facade the broker uses.

It opens the data directory (lock, modes, crash recovery), owns the in-memory state
the event loop sees (topics, segments, visible log end) and delegates: appends to the
writer thread (:mod:`.writer`), reads to :mod:`.reads`, retention to
:mod:`.retention`, consume positions to :mod:`.positions`.

Threading model: every public method is called from one asyncio event loop (or,
for a store used without a loop, one thread). Writes, fsyncs and checkpoints run
in one writer thread, so the loop never blocks on the disk; reads are preads of
page-cache data on the loop and never wait for an fsync.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

from lockmq.clock import SYSTEM_CLOCK, Clock, steady_ms_of

from . import reads, retention
from .config import StoreConfig
from .damage import Damage, DamageMap
from .dedup import DedupTable
from .errors import (CorruptRecord, InvalidRecord, StoreClosed, StoreFailed, StoreFull,
                     StoreLocked)
from .files import DIR_MODE, FILE_MODE, create_file, secure_data_dir
from .index import TopicIndex
from .files import atomic_write
from .names import LOCK, REINDEX, SEGMENT_DIR, index_file_name, positions_files
from .positions import PositionsFile, load_copy, save_copy
from .recovery import RecoveryReport, recover, save_log_start
from .records import (Appended, NewRecord, StoredRecord, encode_record, encode_records,
                      validate_cluster, validate_topic)
from .retention import RetentionReport
from .segment import Segment, SegmentList
from .topic import Topic, first_live
from .writer import Answer, GroupCommit, Then

log = logging.getLogger("lockmq.store")

#: at open, an index with more dead entries (before the log start) than this is
#: rewritten without them
REBASE_DEAD_ENTRIES = 1_000_000
#: the second copy of the positions (positions.copy) is rewritten at most this often
#: by position saves (at once by claims, deletes and close): what a lost positions
#: file can cost in redeliveries
POSITIONS_COPY_S = 5.0


class Store:
    """A durable log store: commit log, topic indexes, consume positions, dedup.

    Open with :meth:`Store.open` (runs crash recovery), append with
    ``await store.append([...])``, read with :meth:`read`, finish with
    ``await store.close()``. See docs/storage.md and FORMAT.md.

    All methods are meant for one thread: the event loop that made the first
    :meth:`append` (the writer thread reports back to that loop). Reads, positions
    and retention work before any append too, e.g. from a tool without a loop;
    then finish with :meth:`close_sync`.
    """

    def __init__(self, config: StoreConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        config.validate()
        self.config = config
        #: the time of record timestamps (wall), segment ages and retention (steady:
        #: a step of the wall clock ages nothing; lockmq.clock)
        self.clock = clock
        self.data_dir = os.path.abspath(os.fspath(config.data_dir))
        self.seg_dir = os.path.join(self.data_dir, SEGMENT_DIR)
        self._dedup = DedupTable(config.dedup_window, config.dedup_max_sns)
        self._topics: dict[str, Topic] = {}
        self._segments = SegmentList(self.seg_dir, [])  # filled by open()
        self._writer: GroupCommit | None = None
        self._end = 0
        self._callbacks: list[Callable[[str, int], None]] = []
        self._positions: dict[str, PositionsFile] = {}
        self._pos_exec: ThreadPoolExecutor | None = None
        self._max_record = config.record_limit
        self._closed = False
        self._lock_fd = -1
        #: counters: records stored, duplicates dropped, batches (group commits), log
        #: bytes, fsyncs, checkpoints, batches refused with StoreFull, records that
        #: retention deleted before the slowest cluster read them, segments closed by
        #: age (``segment_ms``), damaged records quarantined (at open and since),
        #: quarantined ranges
        self.stats: dict[str, int] = dict.fromkeys(
            ("records", "duplicates", "batches", "bytes", "fsyncs", "checkpoints",
             "store_full", "skipped_records", "time_rolls", "damaged_records",
             "damaged_ranges"), 0)
        #: quarantined commit-log ranges (damage.py): never served
        self._damage = DamageMap(self.data_dir)
        #: the second copy of every cluster's positions, and when it was last written
        self._copy: dict[str, dict] = {}
        self._copy_lock = threading.Lock()
        self._copy_t = 0.0
        self._copy_dirty = False
        #: what opening found wrong with positions files (also logged)
        self.positions_report: list[str] = []
        #: topics whose index a read found wrong beyond repair: rebuilt at the next open
        self.reindex: set[str] = set()
        #: what crash recovery did when the store was opened
        self.recovery = RecoveryReport()

    # ------------------------------------------------------------------ open/close

    @classmethod
    def open(cls, config: StoreConfig, clock: Clock = SYSTEM_CLOCK) -> "Store":
        """Open (creating if needed) the store in ``config.data_dir``.

        Runs crash recovery synchronously; its outcome is in :attr:`recovery`
        (and logged). Raises :class:`StoreLocked` if another process has the
        directory open. ``clock`` (default: the system's) dates records and ages
        segments; tests and benches pass a :class:`lockmq.clock.ManualClock`.
        """
        self = cls(config, clock)
        # 0700 / 0600 whatever the umask; an older, looser data dir is tightened
        # (the commit log holds card ids) -- with a log line saying so
        changed = secure_data_dir(self.data_dir)
        if changed:
            shown = ", ".join(f"{os.path.relpath(p, self.data_dir)} {m:04o}"
                              for p, m in changed[:5])
            log.warning("store %s: tightened the modes of %d files/directories to "
                        "%04o/%04o (were: %s%s)", self.data_dir, len(changed), FILE_MODE,
                        DIR_MODE, shown, " ..." if len(changed) > 5 else "")
        self._lock_fd = create_file(os.path.join(self.data_dir, LOCK), os.O_RDWR)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreLocked(f"{self.data_dir} is in use by another process") from None
        try:
            segments, indexes, rep, damage = recover(self.data_dir, self._dedup)
            self.recovery = rep
            self._damage = damage
            self._count_damage()
            self._segments = segments
            self._end = rep.log_end
            first_qs = segments.first.read_qstart() if segments.start > 0 else None
            for name, idx in sorted(indexes.items()):
                t = Topic(name, idx)
                t.start = first_live(idx, name, segments.start, first_qs)
                if t.start - idx.base > REBASE_DEAD_ENTRIES:
                    idx.rebase(t.start)
                self._topics[name] = t
            self._writer = GroupCommit(config, self.data_dir, segments, rep.log_end,
                                       self._topics, self._dedup, self.stats,
                                       self._on_visible, clock,
                                       self._first_write_ms(segments.active, rep.log_end))
            try:
                self._writer.checkpoint_now()
            except OSError as exc:  # e.g. a full disk: the store can still serve reads
                log.warning("store: checkpoint after recovery failed: %r", exc)
            self._check_positions()
        except BaseException:
            self._release()
            raise
        if rep.bytes_cut or rep.full_scan or rep.scanned_records or rep.damage:
            log.info("store %s recovered: %s", self.data_dir, rep)
        if damage:
            log.error("store %s: %d damaged ranges are quarantined (%d records; "
                      "`lockmq store damage %s` lists them): %s", self.data_dir, len(damage),
                      self.stats["damaged_records"], self.data_dir,
                      " | ".join(d.describe() for d in damage.items[:5]))
        return self

    def _check_positions(self) -> None:
        """At open: every cluster's positions file against the second copy
        (``positions.copy``). A missing or damaged file is restored from the copy (a
        few acknowledged messages may come again: the copy lags by at most
        :data:`POSITIONS_COPY_S`); one with no copy to restore from is set aside as
        ``.damaged`` and its cluster restarts from nothing -- both loudly."""
        copy = load_copy(self.data_dir)
        have_copy = copy is not None
        copy = copy or {}
        found = dict(positions_files(self.data_dir))
        report = self.positions_report
        for cluster, name in found.items():
            try:
                validate_cluster(cluster)
            except ValueError:
                continue
            pf = self._positions_file(cluster)
            saved = copy.get(cluster)
            if pf.state in ("ok", "torn"):
                if saved is None or saved["gen"] <= pf.gen:
                    copy[cluster] = pf.snapshot()
                else:   # the file lost saves the copy has (a file rolled back)
                    pf.restore(saved)
                    report.append(f"cluster {cluster!r}: its positions file is behind the "
                                  f"copy (save {pf.gen} < {saved['gen']}): restored from "
                                  "the copy")
                continue
            if pf.state == "damaged":
                report.append(f"cluster {cluster!r}: {pf.damaged_bytes} bytes of its "
                              f"positions file are damaged; its latest intact save "
                              f"({pf.gen}) is used")
                if saved is not None and saved["gen"] > pf.gen:
                    pf.restore(saved)
                else:
                    pf.save({})
                copy[cluster] = pf.snapshot()
                continue
            # unreadable: nothing intact in it
            path = os.path.join(self.data_dir, name)
            os.replace(path, path + ".damaged")
            pf.close()
            self._positions.pop(cluster, None)
            if saved is not None:
                pf = self._positions_file(cluster)
                pf.restore(saved)
                report.append(f"cluster {cluster!r}: its positions file is unreadable (kept "
                              f"as {name}.damaged): restored from the copy (save "
                              f"{saved['gen']}); messages acknowledged after that save "
                              "are delivered again")
            else:
                copy.pop(cluster, None)
                report.append(f"cluster {cluster!r}: its positions file is unreadable (kept "
                              f"as {name}.damaged) and there is no copy: the cluster "
                              "RESTARTS FROM NOTHING (from the earliest record, or the "
                              "latest if the broker starts clusters there) and its owner "
                              "is forgotten")
        for cluster, saved in list(copy.items()):
            if cluster in found:
                continue
            try:
                validate_cluster(cluster)
            except ValueError:
                copy.pop(cluster)
                continue
            pf = self._positions_file(cluster)
            pf.restore(saved)
            report.append(f"cluster {cluster!r}: its positions file was missing: restored "
                          f"from the copy (save {saved['gen']}); messages acknowledged "
                          "after that save are delivered again")
        if found and not have_copy:
            report.append("positions.copy was missing or damaged: written again")
        with self._copy_lock:
            self._copy = copy
        if report or (found and not have_copy):
            try:
                self._write_copy()
            except OSError as exc:
                log.warning("store: writing positions.copy failed: %r", exc)
        for line in report:
            (log.error if "RESTARTS" in line else log.warning)("store %s: %s",
                                                              self.data_dir, line)

    def _write_copy(self) -> None:
        with self._copy_lock:
            snap = {k: dict(v) for k, v in self._copy.items()}
            self._copy_t = time.monotonic()
            self._copy_dirty = False
        save_copy(self.data_dir, snap)

    def _copy_after_save(self, cluster: str, pf: PositionsFile, force: bool) -> None:
        """Record a save in the second copy; write the copy if it is due (or now)."""
        with self._copy_lock:
            self._copy[cluster] = pf.snapshot()
            self._copy_dirty = True
            due = force or time.monotonic() - self._copy_t >= POSITIONS_COPY_S
        if due:
            self._write_copy()

    def _count_damage(self) -> None:
        self.stats["damaged_ranges"] = len(self._damage)
        self.stats["damaged_records"] = sum(max(d.records, d.queue_offsets())
                                            for d in self._damage.items)

    @property
    def damage(self) -> list[Damage]:
        """Every quarantined range (found by recovery or by a read), oldest first."""
        return list(self._damage.items)

    def damage_at(self, topic: str, queue_offset: int) -> Damage | None:
        """The quarantined range holding ``topic``'s record at ``queue_offset`` (None:
        not known to be damaged)."""
        t = self._topics.get(topic)
        if t is None or not self._damage or not t.index.base <= queue_offset < t.index.end:
            return None
        return self._damage.at(t.index.entry(queue_offset)[0])

    @contextmanager
    def writes_held(self) -> Iterator[None]:
        """Stall the writer thread inside the block, as a slow disk would: it takes
        no new batch, so appends queue until ``max_pending_bytes`` and then raise
        :class:`StoreBusy`. For tests and fault drills; one batch already taken
        may still complete."""
        assert self._writer is not None
        self._writer.may_write.clear()
        try:
            yield
        finally:
            self._writer.may_write.set()

    @property
    def writer_waits(self) -> bool:
        """True while the writer thread waits for work: every commit it took has been
        written and handed back to the loop. For tests and drills that must act
        between two commits."""
        return self._writer is not None and self._writer.waits_for_work

    async def close(self) -> None:
        """Write everything queued, fsync, checkpoint and close all files.

        Appends made after ``close`` starts raise :class:`StoreClosed`.
        """
        if self._closed:
            return
        assert self._writer is not None
        await self._writer.stop()
        self._closed = True
        self._release()

    def close_sync(self) -> None:
        """Close a store that never appended from an event loop (tools, tests)."""
        if self._closed:
            return
        assert self._writer is not None
        if self._writer.started:
            raise RuntimeError("store is used from an event loop; await close() there")
        self._writer.stop_idle()
        self._closed = True
        self._release()

    def _release(self) -> None:
        if self._copy_dirty and self._lock_fd >= 0:
            try:
                self._write_copy()
            except OSError as exc:
                log.warning("store: writing positions.copy at close failed: %r", exc)
        for t in self._topics.values():
            t.index.close()
        for p in self._positions.values():
            p.close()
        if self._writer is not None:
            self._writer.close()
        self._segments.close()
        if self._pos_exec is not None:
            self._pos_exec.shutdown(wait=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # ------------------------------------------------------------------ append

    async def append(self, records: list[NewRecord]) -> list[Appended]:
        """Append records; resolve when they are durable (``sync``) or written (``async``).

        Records of all concurrent callers are gathered into one ``write()`` and one
        fdatasync in the writer thread (group commit): while one batch is being
        fsynced, the next one gathers. A record whose ``(sn, seq)`` is already
        stored is not stored again: its result has ``duplicate=True`` (offsets -1);
        the earlier copy is durable when the call resolves. Results are in the
        order of ``records``.

        Raises:
            InvalidRecord: a record breaks a rule; nothing of this call is stored.
            StoreBusy: too much is queued; nothing of this call is stored.
            StoreFull: the disk reserve is reached or the disk is full; nothing of
                this call is stored.
            StoreClosed, StoreFailed: the store takes no more writes.
        """
        fut = self._submit(records, None)
        return [] if fut is None else await fut  # type: ignore[misc]

    def append_then(self, records: list[NewRecord], then: Then) -> None:
        """:meth:`append` without a coroutine: ``then(results, error)`` is called on
        the loop as soon as the writer has answered (durable in ``sync``), with the
        results or the error (StoreFull, StoreClosed, StoreFailed). Errors found
        before queuing (StoreBusy, StoreClosed) are raised here and ``then`` is not
        called. The broker's publish path: a task and a future's ``call_soon`` hop
        less per group commit.

        Answered per record: a record that breaks a rule costs the others nothing --
        its result is its :class:`InvalidRecord` (then called at once if no record
        is valid), every other record is stored in the same group commit."""
        try:
            answer = self._submit(records, Answer(then))
        except InvalidRecord:
            self._append_valid_then(records, then)
            return
        if answer is None:
            then([], None)

    def _append_valid_then(self, records: list[NewRecord], then: Then) -> None:
        """:meth:`append_then` of a call with an invalid record: the valid ones in one
        submit, each invalid one answered with its own error, in the call's order."""
        errors: dict[int, InvalidRecord] = {}
        valid = []
        for i, r in enumerate(records):
            try:
                encode_record(r, 0, self._max_record)   # (the rules _submit applies)
            except InvalidRecord as exc:
                errors[i] = exc
            else:
                valid.append(r)

        def merged(res: list[Appended] | None, exc: BaseException | None) -> None:
            if res is None:   # the valid part failed whole (full, closed, failed)
                then(None, exc)
                return
            stored = iter(res)
            then([errors[i] if i in errors else next(stored)  # type: ignore[misc]
                  for i in range(len(records))], None)

        if self._submit(valid, Answer(merged)) is None:
            merged([], None)

    def _submit(self, records: list[NewRecord],
                answer: Answer | None) -> "asyncio.Future | Answer | None":
        """Check, encode and queue ``records`` (None: there were none)."""
        w = self._writer
        assert w is not None
        if w.closing:
            raise StoreClosed("store is closed")
        if w.failed is not None:
            raise StoreFailed(f"store failed earlier: {w.failed!r}") from w.failed
        if not records:
            return None
        ts = int(self.clock.wall_ms() * 1000)
        enc, n, new_topics = encode_records(records, ts, self._max_record, self._topics)
        for topic in new_topics:
            self._new_topic(topic)
        return w.submit(records, enc, n, ts // 1_000_000, answer)

    def _first_write_ms(self, seg: Segment, log_end: int) -> float | None:
        """When the first record of ``seg`` was stored (None if it is empty): the age
        ``segment_ms`` counts from, read back from the record's broker timestamp (a
        wall time: never later than steady time now, so a wall clock that was ahead
        cannot hold the roll back)."""
        if log_end <= seg.base:
            return None
        try:
            ms = reads.read_at(self._segments, log_end, seg.base).broker_ts_us / 1000
        except Exception:  # noqa: BLE001 -- unreadable: age it from the file instead
            ms = seg.mtime_ms()
        return min(ms, steady_ms_of(self.clock))

    async def roll_if_old(self) -> bool:
        """Close the active segment if it is older than ``segment_ms`` and holds
        records, also when no new write comes (the broker's retention timer calls
        this), so a quiet gateway's records reach retention and export. True if a
        segment was closed."""
        w = self._writer
        assert w is not None
        if not w.roll_due():
            return False
        before = len(self._segments)
        await w.submit([], [], 0, 0)
        return len(self._segments) > before

    def _new_topic(self, topic: str) -> Topic:
        validate_topic(topic)
        idx = TopicIndex.open(os.path.join(self.data_dir, index_file_name(topic)))
        t = Topic(topic, idx)
        self._topics[topic] = t
        return t

    def _on_visible(self, new_segments: list[Segment], log_end: int,
                    touched: list[tuple[Topic, int]]) -> None:
        """On the loop, after a batch: make it readable and tell the listeners."""
        for seg in new_segments:
            self._segments.roll(seg)
        self._end = log_end
        for t, end in touched:
            t.end = end
        for cb in self._callbacks:
            for t, end in touched:
                try:
                    cb(t.name, end)
                except Exception:  # a callback bug must not stop the store
                    log.exception("store: on_durable callback failed")

    # ------------------------------------------------------------------ reads

    def topics(self) -> list[str]:
        """Names of all topics that have (or had) records, sorted."""
        return sorted(self._topics)

    def queue_end(self, topic: str) -> int:
        """Queue offset after the last durable (``sync``) / written (``async``) record."""
        t = self._topics.get(topic)
        return 0 if t is None else t.end

    def queue_start(self, topic: str) -> int:
        """First queue offset still retained (equal to :meth:`queue_end` if none is)."""
        t = self._topics.get(topic)
        return 0 if t is None else min(t.start, t.end)

    def read(self, topic: str, queue_offset: int, max_count: int) -> list[StoredRecord]:
        """Return up to ``max_count`` records of ``topic`` from ``queue_offset`` on.

        Only durable records (``sync``; written ones in ``async``) are returned.
        An offset before :meth:`queue_start` (deleted by retention) reads from the
        first retained record; check ``queue_offset`` of the results. A damaged
        record is never returned: it is passed over (its queue offset is missing from
        the results, as retention's are) and quarantined if it was not yet
        (:attr:`damage`, :meth:`damage_at`); so an empty result before
        :meth:`queue_end` means that everything up to there is damaged.
        """
        t = self._topics.get(topic)
        if t is None or max_count <= 0:
            return []
        if queue_offset < t.start:
            queue_offset = t.start
        n = min(max_count, t.end - queue_offset)
        if n <= 0:
            return []
        segs, end = self._segments, self._end
        if self._damage:
            lo = t.index.entry(queue_offset)[0]
            off, size, _s = t.index.entry(queue_offset + n - 1)
            if self._damage.overlaps(lo, off + size):
                return reads.read_topic_checked(t, segs, end, queue_offset, n, self._damage,
                                                self._read_damage)
        try:
            return reads.read_topic(t, segs, end, queue_offset, n)
        except (CorruptRecord, OSError, ValueError):   # (a wrong index entry: ValueError)
            return reads.read_topic_checked(t, segs, end, queue_offset, n, self._damage,
                                            self._read_damage)

    def _read_damage(self, topic: str, queue_offset: int, lo: int, hi: int, why: str,
                     in_log: bool) -> None:
        """A read passed a damaged record: quarantine ``[lo, hi)`` if it is new (saved,
        logged, counted). A wrong index entry (``in_log`` False) is logged only."""
        if not in_log:
            log.error("store: index of %r, queue offset %d: %s", topic, queue_offset, why)
            if "unusable" in why and topic not in self.reindex:
                self.reindex.add(topic)   # the next open rebuilds it from the log
                try:
                    atomic_write(os.path.join(self.data_dir, REINDEX),
                                 json.dumps(sorted(self.reindex)).encode())
                except OSError as exc:
                    log.error("store: saving the reindex list failed: %r", exc)
            return
        if not why or self._damage.at(lo) is not None:
            return
        seg = self._segments[self._segments.index_of(lo)]
        d = Damage(lo, max(hi, lo + 1), seg.base, why or "unreadable", 1,
                   {topic: [queue_offset]}, acked="yes", found="read",
                   found_ms=int(self.clock.wall_ms()))
        self._damage.add(d)
        self._count_damage()
        try:
            self._damage.save()
        except OSError as exc:
            log.error("store: saving the damage list failed: %r", exc)
        log.error("store: a read found a damaged record, quarantined (the records around it "
                  "are served): %s", d.describe())

    def scan(self, topic: str, queue_offset: int = 0,
             chunk: int = 1000) -> Iterator[StoredRecord]:
        """Every record of ``topic`` from ``queue_offset`` (or the first retained) up to
        the queue end when called, oldest first, read ``chunk`` at a time (the broker's
        rebuilds at start: transactions, scheduled items)."""
        end = self.queue_end(topic)
        while queue_offset < end:
            recs = self.read(topic, queue_offset, min(chunk, end - queue_offset))
            if not recs:
                return
            yield from recs
            queue_offset = recs[-1].queue_offset + 1

    def read_at(self, offset: int) -> StoredRecord:
        """Read the record at commit-log ``offset`` (queue_offset is -1)."""
        return reads.read_at(self._segments, self._end, offset)

    def queue_offset_at_time(self, topic: str, broker_ts_ms: int) -> int:
        """First retained queue offset whose record arrived at or after ``broker_ts_ms``
        (one-second resolution), or :meth:`queue_end` if none."""
        t = self._topics.get(topic)
        if t is None:
            return 0
        q = t.index.first_at_or_after_time(broker_ts_ms // 1000, lo=t.start)
        return min(q, t.end)

    def last_seq(self, sn: str) -> int | None:
        """Highest durably stored sequence number of lock ``sn`` (None if unknown)."""
        return self._dedup.last_seq(sn)

    def on_durable(self, callback: Callable[[str, int], None]) -> None:
        """Call ``callback(topic, new_queue_end)`` on the loop whenever records of
        ``topic`` become readable (durable in ``sync``, written in ``async``)."""
        self._callbacks.append(callback)

    @property
    def log_start(self) -> int:
        """Commit-log offset of the oldest retained byte."""
        return self._segments.start

    @property
    def log_end(self) -> int:
        """Commit-log offset after the last written record."""
        return self._end

    def segment_at(self, offset: int) -> tuple[Segment, int]:
        """The segment holding commit-log ``offset`` (``log_start <= offset <= log_end``;
        the active one at ``log_end``) and the offset just past it (``log_end`` for the
        active one): how a copier of raw log bytes (lockmq.replication) reads them,
        with ``Segment.pread`` below that end. Segments are never rewritten.
        ValueError outside that range (index_of would name the active segment for
        an offset retention deleted)."""
        segs = self._segments
        if not segs.start <= offset <= self._end:
            raise ValueError(f"commit-log offset {offset} is outside the log "
                             f"[{segs.start}, {self._end}]")
        k = segs.index_of(offset)
        return segs[k], segs.end_of(k, self._end)

    # ------------------------------------------------------------------ positions

    def _positions_file(self, cluster: str) -> PositionsFile:
        p = self._positions.get(cluster)
        if p is None:
            validate_cluster(cluster)
            p = self._positions[cluster] = PositionsFile(self.data_dir, cluster)
        return p

    def load_positions(self, cluster: str) -> dict[str, int]:
        """Last saved ``{topic: queue offset}`` of consumer cluster ``cluster``."""
        return self._positions_file(cluster).load()

    async def save_positions(self, cluster: str, positions: dict[str, int],
                             counters: dict[str, int] | None = None) -> None:
        """Merge ``positions`` (and ``counters``: ``last_active_ms``, ``skipped``)
        into the cluster's saved state and make it durable (fsync in a thread). A
        crash during the save leaves the previous state. Calls for the same store
        are applied in call order."""
        pf = self._positions_file(cluster)
        if self._pos_exec is None:
            self._pos_exec = ThreadPoolExecutor(1, thread_name_prefix="lockmq-positions")
        await asyncio.get_running_loop().run_in_executor(self._pos_exec, self._save_pf,
                                                         cluster, pf, dict(positions),
                                                         dict(counters or {}))

    def _save_pf(self, cluster: str, pf: PositionsFile, positions: dict[str, int],
                 counters: dict[str, int]) -> None:
        pf.save(positions, None, counters)
        try:
            self._copy_after_save(cluster, pf, False)
        except OSError as exc:   # the file itself is saved; the copy catches up later
            log.warning("store: writing positions.copy failed: %r", exc)

    def cluster_counters(self, cluster: str) -> dict[str, int]:
        """The cluster's saved counters: ``last_active_ms`` (when a member was last
        connected or a position last moved) and ``skipped`` (messages retention
        deleted before the cluster read them); ``{}`` for a file without them."""
        self.cluster_meta(cluster)   # opens (and caches) the file only if it exists
        p = self._positions.get(cluster)
        return {} if p is None else dict(p.counters)

    def cluster_meta(self, cluster: str) -> dict[str, str]:
        """What the cluster's positions file says besides positions: ``owner`` (who
        created it) and ``topic`` (the topic it is bound to), when saved; ``{}`` if the
        cluster has no file (nothing is cached for it then: probing names costs no
        memory)."""
        p = self._positions.get(cluster)
        if p is None:
            p = PositionsFile(self.data_dir, validate_cluster(cluster))
            if not p.exists:
                p.close()
                return {}
            self._positions[cluster] = p
        return dict(p.meta)

    def claim_cluster(self, cluster: str, owner: str, topic: str,
                      positions: dict[str, int] | None = None) -> None:
        """Record (durably, before returning: blocking, one fsync) that ``cluster``
        belongs to ``owner`` and reads ``topic``, with its starting ``positions``.
        Called when a cluster is created, so ownership survives a crash."""
        pf = self._positions_file(cluster)
        try:
            pf.save(dict(positions or {}), {"owner": owner, "topic": topic})
        except StoreFull:
            if not pf.exists:   # nothing of the cluster is left behind
                pf.close()
                self._positions.pop(cluster, None)
            raise
        try:
            self._copy_after_save(cluster, pf, True)
        except OSError as exc:
            log.warning("store: writing positions.copy failed: %r", exc)

    def delete_cluster(self, cluster: str) -> bool:
        """Forget ``cluster``: remove its positions file (owner, topic, positions,
        counters).
        False if it had none."""
        pf = self._positions_file(cluster)
        existed = pf.exists
        with self._copy_lock:   # the copy first: a crash between must not bring it back
            had = self._copy.pop(cluster, None) is not None
        if had:
            self._write_copy()
        pf.delete()
        pf.close()
        self._positions.pop(cluster, None)
        return existed

    def clusters(self) -> list[str]:
        """Clusters that have a positions file."""
        return list(positions_files(self.data_dir))

    # ------------------------------------------------------------------ retention

    def enforce_retention(self, needed: dict[str, int] | None = None,
                          now_ms: float | None = None) -> RetentionReport:
        """Delete closed segments that are past the age or size limit.

        Both limits win over consumer clusters: a segment goes even if a cluster has
        not read it (the caller moves such clusters to :meth:`queue_start`).
        ``needed`` maps topics to the lowest queue offset a cluster still needs;
        the deleted records at or above it are counted in the report's
        ``skipped_records`` and in ``stats["skipped_records"]``. The active segment
        is never deleted. Runs on the caller's thread (unlink is cheap); call it
        every minute or so. ``now_ms`` defaults to the store clock's steady time
        (the scale segment ages are kept in: a wall-clock step deletes nothing).
        """
        now = steady_ms_of(self.clock) if now_ms is None else now_ms
        rep = retention.enforce(self.config, self._segments, self._topics, self._end,
                                needed or {}, now)
        self.stats["skipped_records"] += sum(rep.skipped_records.values())
        if rep.deleted_segments:
            save_log_start(self.data_dir, self._segments.start)
        if rep.deleted_segments and self._damage:
            before = len(self._damage)
            self._damage.forget_before(self._segments.start)
            if len(self._damage) != before:
                self._count_damage()
                self._damage.save()
        return rep


def open_store(data_dir: str, **settings) -> Store:
    """Shorthand: ``Store.open(StoreConfig(data_dir=data_dir, **settings))``."""
    return Store.open(StoreConfig(data_dir=data_dir, **settings))


__all__: Iterable[str] = ["Store", "open_store"]
