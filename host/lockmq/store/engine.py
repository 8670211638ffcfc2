"""The storage engine: :class:`Store`.

Threading model: every public method is called from one asyncio event loop (or,
for a store used without a loop, one thread). Writes, fsyncs and checkpoints run
in one writer thread, so the loop never blocks on the disk; reads are preads of
page-cache data on the loop and never wait for an fsync.
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import fcntl
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable

from . import checkpoint as ckpt
from .config import StoreConfig
from .dedup import DedupTable
from .errors import (CorruptRecord, StoreBusy, StoreClosed, StoreFailed, StoreFull,
                     StoreLocked)
from .files import (DIR_MODE, FILE_MODE, SEGMENT_DIR, create_file, fsync_dir, qstart_name,
                    secure_data_dir, segment_name)
from .index import ENTRY, TopicIndex, index_file_name
from .positions import PositionsFile
from .recovery import RecoveryReport, recover, write_qstart
from .records import (HEADER, Appended, NewRecord, StoredRecord, decode_record,
                      encode_record, validate_cluster, validate_topic)

log = logging.getLogger("lockmq.store")

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

#: most bytes one pread may span when reading a run of records of a topic
_READ_SPAN = 256 * 1024

#: at open, an index with more dead entries (before the log start) than this is
#: rewritten without them
REBASE_DEAD_ENTRIES = 1_000_000


@dataclass
class RetentionReport:
    """What :meth:`Store.enforce_retention` deleted.

    ``forced_segments`` were deleted by the size limit although a cluster still
    needed records in them; ``forced_records`` counts, per topic, the needed
    records that were lost that way.
    """

    deleted_segments: list[int] = field(default_factory=list)
    deleted_bytes: int = 0
    forced_segments: list[int] = field(default_factory=list)
    forced_records: dict[str, int] = field(default_factory=dict)
    log_start: int = 0
    log_bytes: int = 0


class _Topic:
    """State of one topic. ``next`` belongs to the writer thread (next queue offset
    to assign); ``end`` and ``start`` to the event loop (visible end, first retained)."""

    __slots__ = ("name", "index", "end", "start", "next")

    def __init__(self, name: str, index: TopicIndex) -> None:
        self.name = name
        self.index = index
        self.end = index.end
        self.next = index.end
        self.start = index.base


class _Chunk:
    """Bytes of one batch that go to one segment."""

    __slots__ = ("base", "file_pos", "parts", "new", "qstart")

    def __init__(self, base: int, file_pos: int, new: bool, qstart: dict[str, int] | None):
        self.base = base
        self.file_pos = file_pos
        self.parts: list[bytes] = []
        self.new = new
        self.qstart = qstart


class _Plan:
    """One group commit: what to write where, and what to answer each caller."""

    __slots__ = ("entries", "results", "chunks", "index", "ids", "end", "nbytes")

    def __init__(self) -> None:
        self.entries: list = []
        self.results: list[list[Appended]] = []
        self.chunks: list[_Chunk] = []
        self.index: dict[str, tuple[_Topic, int, bytearray]] = {}
        self.ids: list[tuple[str, int]] = []
        self.end = 0
        self.nbytes = 0


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

    def __init__(self, config: StoreConfig) -> None:
        config.validate()
        self.config = config
        self.data_dir = os.path.abspath(os.fspath(config.data_dir))
        self.seg_dir = os.path.join(self.data_dir, SEGMENT_DIR)
        self._sync = config.flush == "sync"
        self._dedup = DedupTable(config.dedup_window, config.dedup_max_sns)
        self._topics: dict[str, _Topic] = {}
        self._bases: list[int] = []
        self._end = 0
        self._active_fd = -1
        self._read_fds: dict[int, int] = {}
        self._pending: list = []
        self._pending_bytes = 0
        self._callbacks: list[Callable[[str, int], None]] = []
        self._positions: dict[str, PositionsFile] = {}
        self._pos_exec: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._done: asyncio.Future | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._w_idle = False
        self._w_end = 0
        self._w_active_base = 0
        self._max_record = config.record_limit
        self._max_pending = config.max_pending_bytes
        self._closing = False
        self._closed = False
        self._failed: BaseException | None = None
        self._lock_fd = -1
        self._last_ckpt_t = time.monotonic()
        self._last_ckpt_end = 0
        self._unsynced = False
        self._free_t = 0.0  # when the disk's free space was last looked at
        self._free_at = 0  # free bytes then
        self._free_used = 0  # bytes written since
        #: counters: records stored, duplicates dropped, batches (group commits), log
        #: bytes, fsyncs, checkpoints, batches refused with StoreFull, records a
        #: cluster still needed that the size limit deleted
        self.stats: dict[str, int] = dict.fromkeys(
            ("records", "duplicates", "batches", "bytes", "fsyncs", "checkpoints",
             "store_full", "forced_deleted_records"), 0)
        #: what crash recovery did when the store was opened
        self.recovery = RecoveryReport()

    # ------------------------------------------------------------------ open/close

    @classmethod
    def open(cls, config: StoreConfig) -> "Store":
        """Open (creating if needed) the store in ``config.data_dir``.

        Runs crash recovery synchronously; its outcome is in :attr:`recovery`
        (and logged). Raises :class:`StoreLocked` if another process has the
        directory open.
        """
        self = cls(config)
        # 0700 / 0600 whatever the umask; an older, looser data dir is tightened
        # (the commit log holds card ids) -- with a log line saying so
        changed = secure_data_dir(self.data_dir)
        if changed:
            shown = ", ".join(f"{os.path.relpath(p, self.data_dir)} {m:04o}"
                              for p, m in changed[:5])
            log.warning("store %s: tightened the modes of %d files/directories to "
                        "%04o/%04o (were: %s%s)", self.data_dir, len(changed), FILE_MODE,
                        DIR_MODE, shown, " ..." if len(changed) > 5 else "")
        self._lock_fd = create_file(os.path.join(self.data_dir, "LOCK"), os.O_RDWR)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreLocked(f"{self.data_dir} is in use by another process") from None
        try:
            bases, indexes, rep = recover(self.data_dir, self._dedup)
            self.recovery = rep
            self._bases = bases
            self._end = self._w_end = rep.log_end
            self._w_active_base = bases[-1]
            for name, idx in sorted(indexes.items()):
                t = _Topic(name, idx)
                t.start = idx.first_at_or_after(bases[0]) if idx.count else idx.end
                if t.start - idx.base > REBASE_DEAD_ENTRIES:
                    idx.rebase(t.start)
                self._topics[name] = t
            self._active_fd = os.open(os.path.join(self.seg_dir, segment_name(bases[-1])),
                                      os.O_WRONLY)
            try:
                self._checkpoint_now()
            except OSError as exc:  # e.g. a full disk: the store can still serve reads
                log.warning("store: checkpoint after recovery failed: %r", exc)
        except BaseException:
            self._release()
            raise
        if rep.bytes_cut or rep.full_scan or rep.scanned_records:
            log.info("store %s recovered: %s", self.data_dir, rep)
        return self

    async def close(self) -> None:
        """Write everything queued, fsync, checkpoint and close all files.

        Appends made after ``close`` starts raise :class:`StoreClosed`.
        """
        if self._closed:
            return
        self._closing = True
        if self._thread is not None:
            with self._cond:
                self._cond.notify()
            assert self._done is not None
            await self._done
            self._thread.join()
        elif self._failed is None:
            self._try_checkpoint()
        self._closed = True
        self._release()

    def _try_checkpoint(self) -> None:
        try:
            self._checkpoint_now()
        except OSError as exc:
            log.warning("store: checkpoint at close failed (%r); the next open re-reads "
                        "the log tail instead", exc)

    def close_sync(self) -> None:
        """Close a store that never appended from an event loop (tools, tests)."""
        if self._closed:
            return
        if self._thread is not None:
            raise RuntimeError("store is used from an event loop; await close() there")
        self._closing = True
        if self._failed is None:
            self._try_checkpoint()
        self._closed = True
        self._release()

    def _release(self) -> None:
        for t in self._topics.values():
            t.index.close()
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        for p in self._positions.values():
            p.close()
        if self._active_fd >= 0:
            os.close(self._active_fd)
            self._active_fd = -1
        if self._pos_exec is not None:
            self._pos_exec.shutdown(wait=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _start(self) -> None:
        """Start the writer thread, bound to the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._done = self._loop.create_future()
        self._thread = threading.Thread(target=self._writer_main, name="lockmq-store-writer",
                                        daemon=True)
        self._thread.start()

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
        if self._closing:
            raise StoreClosed("store is closed")
        if self._failed is not None:
            raise StoreFailed(f"store failed earlier: {self._failed!r}") from self._failed
        if not records:
            return []
        ts = time.time_ns() // 1000
        maxrec = self._max_record
        topics = self._topics
        enc = []
        n = 0
        for r in records:
            b = encode_record(r, ts, maxrec)
            n += len(b)
            enc.append(b)
            if r.topic not in topics:
                self._new_topic(r.topic)
        if self._thread is None:
            self._start()
        fut = self._loop.create_future()  # type: ignore[union-attr]
        with self._lock:  # the condition's lock (a C-level context manager: cheaper)
            if self._pending and self._pending_bytes + n > self._max_pending:
                raise StoreBusy(f"{self._pending_bytes} bytes are waiting to be written")
            self._pending.append((records, enc, n, fut, ts // 1_000_000))
            self._pending_bytes += n
            if self._w_idle:
                # one wake-up is enough: until the writer runs (it needs the GIL),
                # later appends would each pay for a pure-Python notify()
                self._w_idle = False
                self._cond.notify()
        return await fut

    def _new_topic(self, topic: str) -> _Topic:
        validate_topic(topic)
        idx = TopicIndex.open(os.path.join(self.data_dir, index_file_name(topic)))
        t = _Topic(topic, idx)
        self._topics[topic] = t
        return t

    # ------------------------------------------------------------------ writer thread

    def _writer_main(self) -> None:
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
                with cond:
                    while not self._pending and not self._closing:
                        # idle: wake up for the async flush and for a due checkpoint
                        now = time.monotonic()
                        due = []
                        if not self._sync and self._unsynced and self._failed is None:
                            due.append(next_flush)
                        if self._w_end != self._last_ckpt_end and self._failed is None:
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
                elif self._closing:
                    break
                now = time.monotonic()
                if not self._sync and self._unsynced and now >= next_flush \
                        and self._failed is None:
                    try:
                        self._flush()
                    except OSError as exc:
                        log.error("store: fdatasync failed, refusing further writes: %r", exc)
                        self._failed = exc
                    next_flush = now + flush_s
                if (self._failed is None and (ckpt_fut is None or ckpt_fut.done())
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
            if self._failed is None:
                try:
                    self._checkpoint_now()
                except OSError as exc:
                    log.warning("store: checkpoint at close failed (%r); the next open "
                                "re-reads the log tail instead", exc)
        except BaseException as exc:  # pragma: no cover - must never kill silently
            log.exception("store: writer thread died")
            self._failed = exc
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
        if self._failed is not None:
            loop.call_soon_threadsafe(self._fail, batch,
                                      StoreFailed(f"store failed earlier: {self._failed!r}"))
            return
        plan = self._plan(batch)
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
                self._failed = exc
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
        hw_of = self._dedup.high_water().get
        seen: set[tuple[str, int]] = set()
        topics = self._topics
        pindex = plan.index
        ids = plan.ids
        pack = ENTRY.pack
        new_app = tuple.__new__
        results = plan.results
        pos = self._w_end
        active_base = self._w_active_base
        seg_limit = active_base + seg_bytes
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
        for records, enc, _n, _fut, ts_s in batch:
            res: list[Appended] = []
            for rec, b in zip(records, enc):
                sn = rec.sn
                seq = rec.seq
                key = (sn, seq)
                # most records are above their lock's high water: new, no full check
                e = hw_of(sn)
                # (contains() is False for the broker's own "$" ids: never dropped)
                if key in seen or (e is not None and seq <= e[0] and contains(sn, seq)):
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
                if rec.topic is not topic:  # batches are mostly one topic
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
        if c:
            c[1] = q
        if not first.parts:
            plan.chunks.remove(first)
        for t, first_q, blob in pindex.values():
            t.next = first_q + len(blob) // 16
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

    def _write(self, plan: _Plan) -> None:
        """Writer thread: index entries, log bytes, fdatasync; undo on ENOSPC."""
        cfg = self.config
        if cfg.min_free_bytes:
            # statvfs at most every 50 ms, unless the writes since the last look
            # could have used up a quarter of the room above the reserve
            now = time.monotonic()
            self._free_used += plan.nbytes
            if (now - self._free_t > 0.05
                    or self._free_used * 4 > self._free_at - cfg.min_free_bytes):
                st = os.statvfs(self.seg_dir)
                self._free_at = st.f_bavail * st.f_frsize
                self._free_t = now
                self._free_used = plan.nbytes
            free = self._free_at - self._free_used + plan.nbytes
            if free - plan.nbytes < cfg.min_free_bytes:
                self._free_t = 0.0  # look again next time
                self._free_used -= plan.nbytes
                raise StoreFull(f"only {free} bytes free on the data disk, reserve is "
                                f"{cfg.min_free_bytes}")
        idx_undo: list[tuple[TopicIndex, int]] = []
        created: list[tuple[int, int]] = []
        fds: list[int] = []
        old_fd = self._active_fd
        try:
            for t, first, blob in plan.index.values():
                idx_undo.append((t.index, t.index.count))
                t.index.write_entries(first, bytes(blob))
            for ch in plan.chunks:
                if ch.new:
                    fd = create_file(os.path.join(self.seg_dir, segment_name(ch.base)),
                                     os.O_WRONLY | os.O_TRUNC)
                    created.append((ch.base, fd))
                else:
                    fd = self._active_fd
                data = ch.parts[0] if len(ch.parts) == 1 else b"".join(ch.parts)
                p = ch.file_pos
                w = os.pwrite(fd, data, p)
                if w != len(data):
                    view = memoryview(data)[w:]
                    p += w
                    while view:
                        w = os.pwrite(fd, view, p)
                        p += w
                        view = view[w:]
                fds.append(fd)
            for ch in plan.chunks:
                if ch.new:
                    write_qstart(self.seg_dir, ch.base, ch.qstart or {})
            if self._sync:
                for fd in fds:
                    os.fdatasync(fd)
                self.stats["fsyncs"] += len(fds)
            elif created:
                # a closed segment is always durable, also in async mode
                os.fdatasync(old_fd)
                for fd in fds[:-1]:
                    if fd != old_fd:
                        os.fdatasync(fd)
            if created:
                fsync_dir(self.seg_dir)
        except OSError as exc:
            self._undo(plan, idx_undo, created)
            if exc.errno in _NO_SPACE:
                raise StoreFull(f"disk full: {exc}") from exc
            raise
        if created:
            self._active_fd = created[-1][1]
            self._w_active_base = created[-1][0]
            for _b, fd in created[:-1]:
                os.close(fd)
            os.close(old_fd)
        if not self._sync:
            self._unsynced = True

    def _undo(self, plan: _Plan, idx_undo: list[tuple[TopicIndex, int]],
              created: list[tuple[int, int]]) -> None:
        try:
            for idx, count in idx_undo:
                idx.truncate(idx.base + count)
            first = plan.chunks[0] if plan.chunks else None
            if first is not None and not first.new:
                os.ftruncate(self._active_fd, first.file_pos)
            for base, fd in created:
                os.close(fd)
                os.unlink(os.path.join(self.seg_dir, segment_name(base)))
                try:
                    os.unlink(os.path.join(self.seg_dir, qstart_name(base)))
                except FileNotFoundError:
                    pass
        except OSError as exc:  # cannot even undo: stop writing
            self._failed = exc
            log.error("store: undoing a failed batch failed: %r", exc)

    def _complete(self, plan: _Plan) -> None:
        """On the loop: publish the batch (it is durable, or written in async mode)."""
        for ch in plan.chunks:
            if ch.new:
                self._bases.append(ch.base)
        self._end = plan.end
        touched = []
        for t, first, blob in plan.index.values():
            t.end = first + len(blob) // 16
            touched.append(t)
        for (_r, _enc, _n, fut, _ts), res in zip(plan.entries, plan.results):
            if not fut.done():
                fut.set_result(res)
        for cb in self._callbacks:
            for t in touched:
                try:
                    cb(t.name, t.end)
                except Exception:  # a callback bug must not stop the store
                    log.exception("store: on_durable callback failed")

    def _flush(self) -> None:
        self._unsynced = False
        os.fdatasync(self._active_fd)
        self.stats["fsyncs"] += 1

    # ------------------------------------------------------------------ checkpoint

    def _checkpoint_snapshot(self) -> ckpt.Checkpoint:
        """Writer thread, between batches: capture the state at the written log end
        (in async mode after making the log durable up to there)."""
        if not self._sync and self._active_fd >= 0:
            self._unsynced = False
            os.fdatasync(self._active_fd)
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

    def _checkpoint_now(self) -> None:
        """Checkpoint synchronously (at open, at close, without a writer thread)."""
        if self._active_fd >= 0:
            os.fdatasync(self._active_fd)
        cp = self._checkpoint_snapshot()
        self._checkpoint_write(cp)
        self._last_ckpt_t = time.monotonic()

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
        first retained record; check ``queue_offset`` of the results. Raises
        :class:`CorruptRecord` if a record fails its checksum.
        """
        t = self._topics.get(topic)
        if t is None or max_count <= 0:
            return []
        if queue_offset < t.start:
            queue_offset = t.start
        n = min(max_count, t.end - queue_offset)
        if n <= 0:
            return []
        entries = t.index.read(queue_offset, n)
        out: list[StoredRecord] = []
        i = 0
        bases = self._bases
        while i < len(entries):
            off, size, _s = entries[i]
            k = bisect.bisect_right(bases, off) - 1
            seg_base = bases[k]
            seg_end = bases[k + 1] if k + 1 < len(bases) else self._end
            # one pread for a run of nearby records (other topics' records between
            # them are read and skipped: cheaper than a syscall each)
            j = i + 1
            run_end = off + size
            limit = min(seg_end, off + _READ_SPAN)
            while j < len(entries) and entries[j][0] + entries[j][1] <= limit:
                run_end = entries[j][0] + entries[j][1]
                j += 1
            data = os.pread(self._read_fd(seg_base), run_end - off, off - seg_base)
            if len(data) != run_end - off:
                raise CorruptRecord(f"record at offset {off} of topic {topic!r} is missing")
            for m in range(i, j):
                rec = decode_record(data, entries[m][0] - off, entries[m][0], queue_offset + m)
                if rec.topic != topic:
                    raise CorruptRecord(f"index of {topic!r} points at a {rec.topic!r} record")
                out.append(rec)
            i = j
        return out

    def _read_fd(self, base: int) -> int:
        fd = self._read_fds.get(base)
        if fd is None:
            fd = os.open(os.path.join(self.seg_dir, segment_name(base)), os.O_RDONLY)
            self._read_fds[base] = fd
        return fd

    def read_at(self, offset: int) -> StoredRecord:
        """Read the record at commit-log ``offset`` (queue_offset is -1)."""
        if not self._bases or not self._bases[0] <= offset < self._end:
            raise ValueError(f"offset {offset} is outside the log")
        k = bisect.bisect_right(self._bases, offset) - 1
        fd = self._read_fd(self._bases[k])
        head = os.pread(fd, 4, offset - self._bases[k])
        length = HEADER.unpack_from(head + bytes(HEADER.size))[0]
        data = os.pread(fd, 4 + length, offset - self._bases[k])
        return decode_record(data, 0, offset)

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
        return self._bases[0]

    @property
    def log_end(self) -> int:
        """Commit-log offset after the last written record."""
        return self._end

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

    async def save_positions(self, cluster: str, positions: dict[str, int]) -> None:
        """Merge ``positions`` into the cluster's saved positions and make them
        durable (fsync in a thread). A crash during the save leaves the previous
        positions. Calls for the same store are applied in call order."""
        pf = self._positions_file(cluster)
        if self._pos_exec is None:
            self._pos_exec = ThreadPoolExecutor(1, thread_name_prefix="lockmq-positions")
        await asyncio.get_running_loop().run_in_executor(self._pos_exec, pf.save,
                                                         dict(positions))

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
        self._positions_file(cluster).save(dict(positions or {}),
                                           {"owner": owner, "topic": topic})

    def delete_cluster(self, cluster: str) -> bool:
        """Forget ``cluster``: remove its positions file (owner, topic, positions).
        False if it had none."""
        pf = self._positions_file(cluster)
        existed = pf.exists
        pf.delete()
        pf.close()
        self._positions.pop(cluster, None)
        return existed

    def clusters(self) -> list[str]:
        """Clusters that have a positions file."""
        out = []
        for name in os.listdir(self.data_dir):
            if name.startswith("consume-") and name.endswith(".log"):
                out.append(name[len("consume-"):-len(".log")])
        return sorted(out)

    # ------------------------------------------------------------------ retention

    def enforce_retention(self, needed: dict[str, int] | None = None,
                          now_ms: int | None = None) -> RetentionReport:
        """Delete closed segments that are past the age or size limit.

        ``needed`` maps topics to the lowest queue offset a consumer cluster still
        needs. Age-based deletion never removes a segment holding a needed record;
        the size limit (``retention_bytes``) does, and then the loss is logged and
        counted in the report and in ``stats["forced_deleted_records"]``.
        The active segment is never deleted. Runs on the caller's thread (unlink
        is cheap); call it every minute or so.
        """
        cfg = self.config
        rep = RetentionReport()
        needed = needed or {}
        now = time.time() * 1000 if now_ms is None else now_ms
        protect = self._end
        for topic, q in needed.items():
            t = self._topics.get(topic)
            if t is None or q >= t.end:
                continue
            q = max(q, t.start, t.index.base)
            protect = min(protect, t.index.entry(q)[0])
        bases = self._bases
        k = 0  # segments [0, k) get deleted
        while k < len(bases) - 1:
            seg_end = bases[k + 1]
            path = os.path.join(self.seg_dir, segment_name(bases[k]))
            old = (cfg.retention_ms is not None
                   and os.stat(path).st_mtime * 1000 < now - cfg.retention_ms)
            if old and seg_end <= protect:
                k += 1
                continue
            break
        if cfg.retention_bytes is not None:
            while k < len(bases) - 1 and self._end - bases[k] > cfg.retention_bytes:
                if bases[k + 1] > protect:
                    rep.forced_segments.append(bases[k])
                k += 1
        if k == 0:
            rep.log_start, rep.log_bytes = bases[0], self._end - bases[0]
            return rep
        new_start = bases[k]
        if rep.forced_segments:
            for topic, q in needed.items():
                t = self._topics.get(topic)
                if t is None or q >= t.end:
                    continue
                lost = t.index.first_at_or_after(new_start, lo=max(q, t.start)) - max(q, t.start)
                if lost > 0:
                    rep.forced_records[topic] = lost
                    self.stats["forced_deleted_records"] += lost
            log.warning("store: size limit deleted segments %s still needed by consumers; "
                        "records lost per topic: %s", rep.forced_segments, rep.forced_records)
        for base in bases[:k]:
            fd = self._read_fds.pop(base, None)
            if fd is not None:
                os.close(fd)
            p = os.path.join(self.seg_dir, segment_name(base))
            rep.deleted_bytes += os.path.getsize(p)
            os.unlink(p)
            try:
                os.unlink(os.path.join(self.seg_dir, qstart_name(base)))
            except FileNotFoundError:
                pass
            rep.deleted_segments.append(base)
        del bases[:k]
        for t in self._topics.values():
            t.start = t.index.first_at_or_after(new_start, lo=t.start)
        rep.log_start, rep.log_bytes = bases[0], self._end - bases[0]
        log.info("store: retention deleted %d segments (%d bytes)", len(rep.deleted_segments),
                 rep.deleted_bytes)
        return rep


def open_store(data_dir: str, **settings) -> Store:
    """Shorthand: ``Store.open(StoreConfig(data_dir=data_dir, **settings))``."""
    return Store.open(StoreConfig(data_dir=data_dir, **settings))


__all__: Iterable[str] = ["Store", "RetentionReport", "open_store"]
