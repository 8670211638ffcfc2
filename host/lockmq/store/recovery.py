"""Crash recovery: bring the data directory to a consistent state at open.

Starts from the checkpoint (or from the start of the log if there is none or it is
unusable), scans the commit log after it and re-adds the index entries and dedup
state of the scanned records. Work is proportional to the log written since the
last checkpoint.

A torn write can only be at the end of the active segment: that tail (no valid
record after it) is cut. Every other record that fails its checksum -- in a closed
segment, before the checkpoint's durable end, or followed by intact records -- is
*damage* (Kafka cuts only the active segment too): its range is quarantined
(:mod:`.damage`), the intact records after it stay in the log and in their topic's
index, and the damaged records keep their queue offsets (index entries into the
damaged range, never served) so that later queue offsets and the consume positions
that refer to them do not move. Bytes missing from a closed segment (a short or
deleted file) or from the end of the log the checkpoint calls durable are damage
in the same way.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import time
import zlib
from dataclasses import dataclass, field

from . import checkpoint as ckpt
from .dedup import DedupTable
from .files import atomic_write, fsync_dir, read_file, seal, unseal
from .index import ENTRY, IndexError_, TopicIndex
from .damage import Damage, DamageMap
from .names import LOG_START, REINDEX, SEGMENT_DIR, TMP_SUFFIX, index_file_name, index_files
from .records import (HEADER, HEADER_SIZE, InvalidRecord, check_record, next_valid,
                      trailing_zeros, validate_topic)
from .segment import Segment, SegmentList

log = logging.getLogger("lockmq.store")


@dataclass
class RecoveryReport:
    """What :meth:`Store.open` found and did.

    Attributes:
        full_scan: True if no usable checkpoint existed and the whole log was read.
        scanned_from: commit-log offset where scanning started.
        scanned_bytes / scanned_records: log read and re-indexed after that point.
        bytes_cut: bytes removed from the end of the log (torn or corrupt tail; not
            the preallocated zeros after it).
        records_cut: records (whole or torn) that were in the removed bytes, as far
            as their framing could still be followed.
        cut_reason: why the tail was cut ("" if nothing was cut).
        log_end: the log end after recovery.
        seconds: wall time of recovery.
        notes: anything else worth telling an operator.
        damage: ranges quarantined by this recovery (:class:`~.damage.Damage`);
            the store's whole list, older ones too, is ``Store.damage``.
    """

    full_scan: bool = False
    scanned_from: int = 0
    scanned_bytes: int = 0
    scanned_records: int = 0
    bytes_cut: int = 0
    records_cut: int = 0
    cut_reason: str = ""
    log_end: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)

    @property
    def damaged_records(self) -> int:
        """Records in the ranges quarantined by this recovery (as far as known)."""
        return sum(max(d.records, d.queue_offsets()) for d in self.damage)


def count_cut_records(buf: bytes | memoryview, pos: int, end: int) -> int:
    """Best-effort count of records in ``buf[pos:end]`` by following length fields."""
    n = 0
    while pos < end:
        n += 1
        if end - pos < HEADER_SIZE:
            break
        length = HEADER.unpack_from(buf, pos)[0]
        if length < HEADER_SIZE - 4:
            break
        pos += 4 + length
    return n


def _scan_segment(mm: mmap.mmap, pos: int, end: int, base: int,
                  pending: dict[str, bytearray], dedup: DedupTable) -> tuple[int, int]:
    """Index every valid record of a mapped segment from ``pos``; return where the
    valid records end and how many there were. The hot loop of recovery."""
    mv = memoryview(mm)
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    pack = ENTRY.pack
    add = dedup.add
    names: dict[bytes, tuple[str, str]] = {}
    blobs: dict[str, bytearray] = pending
    n = 0
    hsize = HEADER_SIZE
    try:
        while end - pos >= hsize:
            (length, crc, fmt, _flags, tlen, slen, _res, hlen, seq, plen, _lts,
             bts) = unpack(mv, pos)
            nxt = pos + 4 + length
            if (nxt > end or fmt != 1 or hsize + tlen + slen + hlen + plen != 4 + length
                    or crc32(mv[pos + 8:nxt]) != crc):
                break
            t0 = pos + hsize
            tb = mm[t0:t0 + tlen + slen]
            name = names.get(tb)
            if name is None:
                if len(names) > 100_000:
                    names.clear()
                try:
                    name = names[tb] = (tb[:tlen].decode("ascii"), tb[tlen:].decode("ascii"))
                except UnicodeDecodeError:
                    break
            topic, sn = name
            blob = blobs.get(topic)
            if blob is None:
                blob = blobs[topic] = bytearray()
            blob += pack(base + pos, 4 + length, bts // 1_000_000)
            add(sn, seq)
            n += 1
            pos = nxt
    finally:
        mv.release()
    return pos, n


def _u32(n: int) -> int:
    return max(0, min(n, 0xFFFFFFFF))


class _Recovery:
    """One recovery's state: the scanned records' index entries per topic (written
    after the scan, so the old index files can still be asked where a damaged
    record's queue offset was), and the damage found."""

    def __init__(self, segs: SegmentList, indexes: dict[str, TopicIndex],
                 starts: dict[str, int], default_start: dict[str, int], durable_end: int,
                 rep: RecoveryReport, damage: DamageMap, now_ms: int, trusted: bool) -> None:
        self.segs = segs
        #: index entries below ``starts`` are kept (recovery from the checkpoint)
        self.trusted = trusted
        self.old = indexes
        self.starts = starts
        self.default_start = default_start
        self.durable_end = durable_end
        self.rep = rep
        self.damage = damage
        self.now_ms = now_ms
        self.pending: dict[str, bytearray] = {}
        #: damage of the segment being scanned, each with every topic's pending
        #: count when it was found (where missing queue offsets belong)
        self.seg_marks: list[tuple[Damage, dict[str, int]]] = []

    def start_of(self, topic: str) -> int:
        """The queue offset of ``topic``'s first scanned record."""
        q = self.starts.get(topic)
        if q is None:
            q = self.starts[topic] = self.default_start.get(topic, 0)
        return q

    def qnext(self, topic: str) -> int:
        """The queue offset the next scanned record of ``topic`` gets."""
        return self.start_of(topic) + len(self.pending.get(topic, b"")) // ENTRY.size

    def _blob(self, topic: str) -> bytearray:
        self.start_of(topic)
        b = self.pending.get(topic)
        if b is None:
            b = self.pending[topic] = bytearray()
        return b

    def damaged(self, seg: Segment, closed: bool, lo: int, hi: int, reason: str,
                buf: mmap.mmap | None = None, pos: int = 0) -> Damage:
        """Quarantine commit-log bytes ``[lo, hi)`` of ``seg``: give the damaged
        records their queue offsets, record and log the range. ``buf[pos:]`` is the
        damaged record as mapped, when there is one (its header may say its topic)."""
        d = Damage(lo, hi, seg.base, reason, found_ms=self.now_ms,
                   acked="yes" if lo < self.durable_end else
                   ("probably" if closed else "unknown"))
        marks = {t: len(b) // ENTRY.size for t, b in self.pending.items()}
        found = self._from_old_indexes(d)
        if not found and buf is not None:
            found = self._from_header(d, buf, pos, hi - seg.base)
        if found:
            d.records = sum(len(q) for q in d.topics.values())
        elif buf is not None:
            d.records = -1
        self.seg_marks.append((d, marks))
        if self.damage.add(d):
            self.rep.damage.append(d)
        log.error("store recovery: damaged log quarantined (the intact records after it "
                  "are kept): %s", d.describe())
        return d

    def _from_old_indexes(self, d: Damage) -> bool:
        """Queue offsets of the records in ``d`` from the index files as they were
        (entries below the checkpoint are kept; later ones are checked to continue the
        rebuilt numbering)."""
        found = False
        for topic, idx in self.old.items():
            if not idx.count:
                continue
            q = idx.first_at_or_after(d.start)
            if self.trusted and idx.base < q <= self.start_of(topic):
                # a kept record crossing ``d.start`` (a cut file) is damaged too
                off, size, _s = idx.entry(q - 1)
                if off < d.start < off + size and off >= self.segs.start:
                    q -= 1
                    d.start = off
            going = True
            while going and q < idx.end:
                entries = idx.read(q, 1024)
                for off, size, ts in entries:
                    if off >= d.end or off < d.start:
                        going = False
                        break
                    if self.trusted and q < self.start_of(topic):
                        pass                         # kept: a trusted entry
                    elif q == self.qnext(topic):
                        self._blob(topic).extend(ENTRY.pack(off, size, ts))
                    else:
                        going = False
                        break
                    d.topics.setdefault(topic, []).append(q)
                    found = True
                    q += 1
                if not entries:
                    break
        return found

    def _from_header(self, d: Damage, buf: mmap.mmap, pos: int, end: int) -> bool:
        """The damaged record's topic from its own header, if its framing is intact
        (its length leads exactly to the next intact record) and the topic is known."""
        if end - pos < HEADER_SIZE:
            return False
        (length, _crc, _f, _fl, tlen, _sl, _r, _h, _seq, _p, _l, bts) = HEADER.unpack_from(buf, pos)
        if pos + 4 + length != end:
            return False
        try:
            topic = validate_topic(bytes(buf[pos + HEADER_SIZE:pos + HEADER_SIZE + tlen])
                                   .decode("ascii"))
        except (InvalidRecord, UnicodeDecodeError):
            return False
        if topic not in self.old and topic not in self.pending:
            return False
        d.topics[topic] = [self.qnext(topic)]
        self._blob(topic).extend(ENTRY.pack(d.start, 4 + length, _u32(bts // 1_000_000)))
        return True

    def realign(self, ends: dict[str, int] | None, where: str) -> None:
        """At the end of a segment: each topic's queue end there (``ends``: the next
        segment's queue start, or the checkpoint's) must match the rebuilt numbering;
        queue offsets of damaged records found missing are given to the segment's
        last damage (an index entry into it), where their records were."""
        marks, self.seg_marks = self.seg_marks, []
        if not ends:
            return
        for topic, want in sorted(ends.items()):
            have = self.qnext(topic)
            if want > have and marks:
                d, at = marks[-1]
                k = at.get(topic, 0)
                n = want - have
                blob = self._blob(topic)
                first = self.start_of(topic) + k
                blob[k * ENTRY.size:k * ENTRY.size] = \
                    ENTRY.pack(d.start, _u32(d.end - d.start), 0) * n
                d.topics.setdefault(topic, []).extend(range(first, first + n))
                d.records = max(d.records, 0) + n
            elif want != have and (want > have or topic in self.pending):
                self.rep.notes.append(f"topic {topic!r}: the rebuilt index ends at queue "
                                      f"offset {have} {where}, which says {want}")


def recover(data_dir: str, dedup: DedupTable) -> tuple[SegmentList, dict[str, TopicIndex],
                                                       RecoveryReport, DamageMap]:
    """Recover ``data_dir``; return its segments, open topic indexes, the report and
    the store's damage (old and new quarantined ranges).

    ``dedup`` is filled with the recovered dedup state.
    """
    t0 = time.monotonic()
    rep = RecoveryReport()
    for name in os.listdir(data_dir):
        if name.endswith(TMP_SUFFIX):
            os.unlink(os.path.join(data_dir, name))
    segs = SegmentList.open(os.path.join(data_dir, SEGMENT_DIR))
    bases = segs.bases
    damage = DamageMap.load(data_dir)
    saved_start = load_log_start(data_dir)
    damage.forget_before(segs.start if saved_start is None else min(saved_start, segs.start))
    known = len(damage)

    # open every index file (but those a read found wrong: rebuilt)
    reindex = _load_reindex(data_dir)
    indexes: dict[str, TopicIndex] = {}
    bad_index = False
    for topic, name in index_files(data_dir).items():
        if topic in reindex:
            rep.notes.append(f"index of {topic!r} was found wrong by a read; rebuilding")
            os.unlink(os.path.join(data_dir, name))
            bad_index = True
            continue
        try:
            indexes[topic] = TopicIndex.open(os.path.join(data_dir, name))
        except IndexError_ as exc:
            rep.notes.append(f"index of {topic!r} unusable ({exc}); rebuilding")
            os.unlink(os.path.join(data_dir, name))
            bad_index = True

    # an index header is not checksummed: its base can be no later than the queue
    # start of the first segment (rebasing drops dead entries up to there, no further)
    first_qs = segs.first.read_qstart() if bases[0] > 0 else {}
    for topic, idx in list(indexes.items()):
        if first_qs is not None and idx.base > first_qs.get(topic, 0):
            rep.notes.append(f"index of {topic!r} starts at queue offset {idx.base}, after "
                             f"the log's first ({first_qs.get(topic, 0)}): its header is "
                             "damaged; rebuilding")
            idx.close()
            os.unlink(idx.path)
            del indexes[topic]
            bad_index = True

    cp = ckpt.load(data_dir)
    usable = cp is not None and not bad_index and bases[0] <= cp.log_end
    if cp is None and (len(bases) > 1 or segs.active.size() > 0 or indexes):
        rep.notes.append("no usable checkpoint; reading the whole log")
    if usable:
        assert cp is not None
        for topic, end in cp.queue_ends.items():
            idx = indexes.get(topic)
            if idx is None or idx.end < end:
                rep.notes.append(f"index of {topic!r} is shorter than the checkpoint says; "
                                 "reading the whole log")
                usable = False
                break
    # a checkpoint that decodes tells what was durable even when recovery cannot
    # start from it
    durable_end = cp.log_end if cp is not None else 0
    first_qstart: dict[str, int] = {}
    if usable:
        assert cp is not None
        starts = {topic: cp.queue_ends.get(topic, idx.base) for topic, idx in indexes.items()}
        try:
            dedup.load(cp.dedup)
        except (ValueError, UnicodeDecodeError):
            rep.notes.append("dedup snapshot unreadable; dedup restarts empty")
        scan_from = max(cp.log_end, bases[0])
    else:
        rep.full_scan = True
        got = segs.first.read_qstart() if bases[0] > 0 else {}
        if got is None:
            rep.notes.append(f"queue-start file of segment {bases[0]} missing: queue offsets "
                             "restart at 0")
            got = {}
        first_qstart = got
        starts = {}
        scan_from = bases[0]
    rep.scanned_from = scan_from
    rec = _Recovery(segs, indexes, starts, first_qstart, durable_end, rep, damage,
                    int(time.time() * 1000), usable)

    i = max(0, segs.index_of(scan_from))
    if saved_start is None:
        save_log_start(data_dir, segs.start)
    elif saved_start < segs.start:
        # retention did not delete what is missing at the start: the oldest segments
        # were lost (their records' index entries, if kept, say which)
        rec.damaged(Segment(segs.seg_dir, saved_start), True, saved_start, segs.start,
                    f"missing: the log starts at {segs.start}, but retention left it at "
                    f"{saved_start}")
    # closed segments before the scan (trusted by the checkpoint): whole files?
    for j in range(i):
        _check_closed_size(rec, j)
    rec.seg_marks = []

    # scan the tail
    log_end = segs.active.base + segs.active.size()
    cut: int | None = None  # position in the active segment where a torn tail starts
    for j in range(i, len(segs)):
        base = bases[j]
        seg = segs[j]
        last = j == len(bases) - 1
        closed_end = None if last else _check_closed_size(rec, j, scanned=True)
        with seg.mapped() as (mm, size):
            limit = size if closed_end is None else min(size, closed_end)
            start = scan_from - base if j == i else 0
            pos = start
            while mm is not None and pos < limit:
                pos, n = _scan_segment(mm, pos, limit, base, rec.pending, dedup)
                rep.scanned_records += n
                if pos >= limit:
                    break
                if last and trailing_zeros(mm, pos, size) == pos:
                    limit = size = pos   # the active segment's preallocated zeros: its
                    break                # records end here, the writer writes over them
                why = check_record(mm, pos, limit) or "unreadable record"
                nxt = next_valid(mm, pos, limit)
                if nxt is None and last and base + pos >= durable_end:
                    # nothing intact after it, at the end of the active segment, past
                    # what was durable: a torn write, never acknowledged -- cut
                    data_end = trailing_zeros(mm, pos, size)
                    rep.cut_reason = f"{why} at offset {base + pos}"
                    rep.records_cut = count_cut_records(mm, pos, data_end)
                    rep.bytes_cut = data_end - pos   # zeros after them were never data
                    cut = pos
                    break
                hi = limit if nxt is None else nxt
                if nxt is None and last:
                    hi = trailing_zeros(mm, pos, size)
                    limit = size = hi
                rec.damaged(seg, not last, base + pos, base + hi, why, mm, pos)
                pos = hi
            rep.scanned_bytes += max(0, min(pos, limit) - start)
            if last:
                log_end = base + (cut if cut is not None else limit)
        if closed_end is not None and size < closed_end:
            # (bytes before ``start`` are trusted by the checkpoint: lost all the same)
            _lost(rec, j, base + size, base + closed_end, closed=True)
        if not last:
            rec.realign(segs[j + 1].read_qstart(), f"at the start of segment {bases[j + 1]}")
    if cut is not None:
        segs.active.truncate(cut, durable=True)
        fsync_dir(segs.seg_dir)
        log.warning("store recovery cut %d bytes (%d records) from the end of the active "
                    "segment (a torn write, never acknowledged): %s",
                    rep.bytes_cut, rep.records_cut, rep.cut_reason)

    if log_end < durable_end:
        # the checkpoint says more was durable: those bytes are lost, and the log goes
        # on after them so that no offset (and no queue offset) is given out twice
        _lost(rec, len(segs) - 1, log_end, durable_end, closed=False,
              reason=f"missing: the log ends at {log_end} but the checkpoint says "
                     f"{durable_end} bytes were durable")
        rec.realign(cp.queue_ends if cp is not None else None, "at the checkpoint")
        old = segs.active
        old.truncate(log_end - old.base, durable=True)
        seg = Segment.create(segs.seg_dir, durable_end)
        try:
            os.fsync(seg.write_fd)
        finally:
            seg.close()
        seg.write_qstart({t: rec.qnext(t) for t in set(rec.starts) | set(rec.pending)})
        fsync_dir(segs.seg_dir)
        segs.roll(Segment(segs.seg_dir, durable_end))
        log_end = durable_end

    # write the index entries: kept ones up to the checkpoint, then the scanned ones
    for topic, idx in indexes.items():
        if usable:
            idx.truncate(rec.start_of(topic))
        else:
            idx.reset(rec.start_of(topic))
    for topic, blob in rec.pending.items():
        idx = indexes.get(topic)
        if idx is None:
            idx = indexes[topic] = TopicIndex.open(
                os.path.join(data_dir, index_file_name(topic)),
                base_if_new=rec.start_of(topic))
        idx.write_entries(idx.end, bytes(blob))
    for idx in indexes.values():
        idx.sync()
    if len(damage) != known or rep.damage:
        damage.save()
    if reindex:
        os.unlink(os.path.join(data_dir, REINDEX))
    fsync_dir(data_dir)
    rep.log_end = log_end
    rep.seconds = time.monotonic() - t0
    return segs, indexes, rep, damage


def load_log_start(data_dir: str) -> int | None:
    """Where retention (or the first open) left the log's start; None if unknown."""
    blob = read_file(os.path.join(data_dir, LOG_START))
    data = None if blob is None else unseal(blob)
    try:
        return None if data is None else int(json.loads(data)["start"])
    except (ValueError, KeyError, TypeError):
        return None


def save_log_start(data_dir: str, start: int) -> None:
    """Record the log's start (retention moved it): what is missing below the first
    segment beyond it was lost, not deleted."""
    atomic_write(os.path.join(data_dir, LOG_START), seal(json.dumps({"start": start})
                                                         .encode()))


def _load_reindex(data_dir: str) -> set[str]:
    try:
        with open(os.path.join(data_dir, REINDEX), "rb") as f:
            return {str(t) for t in json.loads(f.read())}
    except FileNotFoundError:
        return set()
    except (OSError, ValueError, TypeError):
        return {t for t in index_files(data_dir)}   # unreadable: rebuild them all


def _check_closed_size(rec: _Recovery, j: int, scanned: bool = False) -> int:
    """Where closed segment ``j`` must end (the next segment's first byte), as a
    position in it. A file longer than that by zeros only (a roll cut short by a
    crash) is cut to it; a shorter one lost bytes: damage, quarantined here for a
    segment that is not scanned (``scanned``: the scan does it after reading it)."""
    segs = rec.segs
    seg = segs[j]
    want = segs.bases[j + 1] - seg.base
    size = seg.size()
    if size > want:
        with seg.mapped() as (mm, _n):
            zeros = mm is not None and trailing_zeros(mm, want, size) == want
        if zeros:
            seg.truncate(want, durable=True)
            rec.rep.notes.append(f"segment {seg.base}: cut {size - want} zero bytes after its "
                                 "last record (a roll the crash interrupted)")
        else:
            rec.rep.notes.append(f"segment {seg.base}: {size - want} bytes past the start of "
                                 f"the next segment are not part of the log (ignored)")
    elif size < want and not scanned:
        _lost(rec, j, seg.base + size, seg.base + want, closed=True)
    return want


def _lost(rec: _Recovery, j: int, lo: int, hi: int, closed: bool, reason: str = "") -> None:
    """Quarantine bytes ``[lo, hi)`` that are not on disk at all."""
    if hi <= lo:
        return
    seg = rec.segs[j]
    rec.damaged(seg, closed, lo, hi, reason or
                f"missing: segment file ends at {lo}, {hi - lo} bytes before the next "
                f"segment starts")
