"""Reading records back: by topic queue offset (the consumer path) and by commit-log
offset. Runs on the event loop: preads of page-cache data, never waiting for the writer.
"""

from __future__ import annotations

from lockmq import accel

from typing import Callable

from .damage import DamageMap
from .errors import CorruptRecord
from .index import ENTRY
from .records import (_TEXT_CACHE, _TEXT_CACHE_MAX, HEADER, StoredRecord, decode_record,
                      next_valid, scan)
from .segment import SegmentList
from .topic import Topic

#: most bytes one pread may span when reading a run of records of a topic
READ_SPAN = 256 * 1024
#: how far a read repairing a wrong index entry looks for intact neighbours
NEIGHBOUR_WALK = 256

#: compiled: a pread's records decoded in one call (None without the extension)
_read_run = accel.speedups.read_run if accel.COMPILED else None


def read_topic(t: Topic, segments: SegmentList, log_end: int, queue_offset: int,
               n: int) -> list[StoredRecord]:
    """The ``n`` records of topic ``t`` from ``queue_offset`` on (all of them must be
    visible: the caller clamps to the topic's bounds)."""
    entries = t.index.read(queue_offset, n)
    out: list[StoredRecord] = []
    i = 0
    prev_end = 0
    while i < len(entries):
        off, size, _s = entries[i]
        if off < prev_end or size < HEADER.size:
            # the index is not checksummed: a damaged entry can point anywhere, even
            # at another intact record of the topic (read_topic_checked sorts it out)
            raise CorruptRecord(f"index entry {queue_offset + i} of {t.name!r} is out of "
                                "order")
        k = segments.index_of(off)
        seg = segments[k]
        seg_end = segments.end_of(k, log_end)
        # one pread for a run of nearby records (other topics' records between
        # them are read and skipped: cheaper than a syscall each)
        j = i + 1
        run_end = off + size
        limit = min(seg_end, off + READ_SPAN)
        while j < len(entries) and entries[j][0] + entries[j][1] <= limit \
                and entries[j][0] >= run_end:
            run_end = entries[j][0] + entries[j][1]
            j += 1
        prev_end = run_end
        data = seg.pread(run_end - off, off - seg.base)
        if len(data) != run_end - off:
            raise CorruptRecord(f"record at offset {off} of topic {t.name!r} is missing")
        decode_entries(data, off, entries, i, j, queue_offset, t.name, t.name_bytes, out)
        i = j
    return out


#: ``on_damage(topic, queue_offset, lo, hi, why, in_log)``: a damaged record was passed;
#: ``[lo, hi)`` is the damaged log range, or (``in_log`` False) the index entry was wrong
#: and could not be repaired
OnDamage = Callable[[str, int, int, int, str, bool], None]


class _SegmentScan:
    """One segment read record by record (the slow path of a failed read): where its
    intact records are and which ranges are damaged."""

    def __init__(self, segments: SegmentList, k: int, log_end: int) -> None:
        seg = segments[k]
        self.base = seg.base
        self.valid: list[tuple[int, int, str]] = []   # (offset, size, topic)
        self.bad: list[tuple[int, int]] = []
        end = segments.end_of(k, log_end) - seg.base
        with seg.mapped() as (mm, size):
            end = min(end, size)
            pos = 0
            while mm is not None and pos < end:
                for rv in scan(mm, pos, end):
                    self.valid.append((seg.base + rv.pos, rv.size, rv.topic))
                    pos = rv.pos + rv.size
                if pos >= end:
                    break
                nxt = next_valid(mm, pos, end)
                hi = end if nxt is None else nxt
                self.bad.append((seg.base + pos, seg.base + hi))
                pos = hi

    def bad_at(self, off: int) -> tuple[int, int] | None:
        for lo, hi in self.bad:
            if lo <= off < hi:
                return lo, hi
        return None


def _read_one(t: Topic, segments: SegmentList, log_end: int, off: int, size: int,
              q: int) -> StoredRecord:
    k = segments.index_of(off)
    if k < 0 or off >= log_end:
        raise CorruptRecord(f"offset {off} is outside the log")
    seg = segments[k]
    if off + size > segments.end_of(k, log_end):
        raise CorruptRecord(f"record at offset {off} runs past its segment")
    rec = decode_record(seg.pread(size, off - seg.base), 0, off, q)
    if rec.topic != t.name:
        raise CorruptRecord(f"the index entry points at a {rec.topic!r} record")
    return rec


def _diagnose(t: Topic, segments: SegmentList, log_end: int, q: int, off: int, size: int,
              why: str, scans: dict[int, _SegmentScan],
              on_damage: OnDamage) -> StoredRecord | None:
    """A read of ``t``'s entry ``q`` failed: is the log damaged there (quarantine the
    damaged range) or the index entry wrong (the index is not checksummed)? A wrong
    entry is repaired when exactly one intact record of the topic lies between its
    neighbours' records, and that record is returned."""
    k = segments.index_of(off)
    if 0 <= k and off < log_end:
        sc = scans.get(segments[k].base)
        if sc is None:
            sc = scans[segments[k].base] = _SegmentScan(segments, k, log_end)
        hit = sc.bad_at(off)
        if hit is not None and not any(v[0] == off for v in sc.valid):
            on_damage(t.name, q, hit[0], hit[1], why, True)
            return None
    # the log is intact at ``off``: the entry is wrong
    rec = _repair_segment_entries(t, segments, log_end, q, scans)
    if rec is not None:
        on_damage(t.name, q, rec.offset, rec.offset + 1, f"index entries repaired from the "
                  f"log (entry {q} said offset {off} size {size}: {why})", False)
        return rec
    # else: between the nearest entries on either side that read back right, the
    # topic's intact records must be exactly the queue offsets between them
    idx = t.index
    first_q = max(idx.base, t.start)

    def good(qq: int) -> int | None:
        o, z, _s = idx.entry(qq)
        try:
            _read_one(t, segments, log_end, o, z, qq)
        except (CorruptRecord, OSError, ValueError):
            return None
        return o
    q_lo, lo = q - 1, None
    while q_lo >= first_q and q - q_lo <= NEIGHBOUR_WALK:
        lo = good(q_lo)
        if lo is not None:
            break
        q_lo -= 1
    if lo is None:
        q_lo, lo = first_q - 1, segments.start - 1
    q_hi, hi = q + 1, None
    while q_hi < t.end and q_hi - q <= NEIGHBOUR_WALK:
        hi = good(q_hi)
        if hi is not None:
            break
        q_hi += 1
    if hi is None:
        q_hi, hi = t.end, log_end
    cands: list[tuple[int, int, str]] = []
    for j in range(max(0, segments.index_of(max(lo, segments.start))),
                   max(0, segments.index_of(min(hi, log_end - 1))) + 1):
        base = segments[j].base
        sc = scans.get(base)
        if sc is None:
            sc = scans[base] = _SegmentScan(segments, j, log_end)
        cands += [v for v in sc.valid if v[2] == t.name and lo < v[0] < hi]
    if len(cands) == q_hi - q_lo - 1 and cands:
        blob = bytearray()
        recs = []
        try:
            for k2, (coff, csize, _topic) in enumerate(cands):
                r = _read_one(t, segments, log_end, coff, csize, q_lo + 1 + k2)
                recs.append(r)
                blob += ENTRY.pack(coff, csize, r.broker_ts_us // 1_000_000 & 0xFFFFFFFF)
        except CorruptRecord:
            recs = []
        if recs:
            idx.write_entries(q_lo + 1, bytes(blob))
            on_damage(t.name, q, cands[0][0], cands[-1][0], f"index entries {q_lo + 1}.."
                      f"{q_hi - 1} repaired from the log (entry {q} said offset {off} size "
                      f"{size}: {why})", False)
            return recs[q - q_lo - 1]
    on_damage(t.name, q, off, off + size, f"index entry unusable ({why}); "
              f"{len(cands)} candidate records for {q_hi - q_lo - 1} queue offsets: the "
              "index is rebuilt from the log at the next start", False)
    return None


def _queue_start_of(segments: SegmentList, k: int, topic: str) -> int | None:
    if k == 0 and segments[0].base == 0:
        return 0
    qs = segments[k].read_qstart()
    return None if qs is None else qs.get(topic, 0)


def _repair_segment_entries(t: Topic, segments: SegmentList, log_end: int, q: int,
                            scans: dict[int, _SegmentScan]) -> StoredRecord | None:
    """Rewrite ``t``'s index entries of one segment from the log, when the segments'
    queue-start sidecars (checksummed) say which queue offsets it holds and the log
    there is intact with exactly that many records of ``t``; the record at ``q``."""
    n = len(segments)
    lo_k, hi_k = 0, n - 1
    k = -1
    while lo_k <= hi_k:   # the segment whose queue start is the last one <= q
        mid = (lo_k + hi_k) // 2
        qs = _queue_start_of(segments, mid, t.name)
        if qs is None:
            return None
        if qs <= q:
            k, lo_k = mid, mid + 1
        else:
            hi_k = mid - 1
    if k < 0:
        return None
    first = _queue_start_of(segments, k, t.name)
    last = t.end if k + 1 >= n else _queue_start_of(segments, k + 1, t.name)
    if first is None or last is None or not first <= q < last:
        return None
    base = segments[k].base
    sc = scans.get(base)
    if sc is None:
        sc = scans[base] = _SegmentScan(segments, k, log_end)
    mine = [v for v in sc.valid if v[2] == t.name]
    if sc.bad or len(mine) != last - first or first < t.index.base:
        return None
    blob = bytearray()
    for off, size, _t in mine:
        rec = _read_one(t, segments, log_end, off, size, first)
        blob += ENTRY.pack(off, size, rec.broker_ts_us // 1_000_000 & 0xFFFFFFFF)
    t.index.write_entries(first, bytes(blob))
    off, size, _t = mine[q - first]
    return _read_one(t, segments, log_end, off, size, q)


def read_topic_checked(t: Topic, segments: SegmentList, log_end: int, queue_offset: int,
                       n: int, damage: DamageMap, on_damage: OnDamage) -> list[StoredRecord]:
    """Up to ``n`` intact records of ``t`` from ``queue_offset`` to the topic's end,
    passing over damaged ones: an entry in a quarantined range, or a record that
    fails its checksum (the log is then read to tell log damage, quarantined through
    ``on_damage``, from a wrong index entry, repaired if it can be). The read path
    when the requested entries meet damage; one record per pread."""
    out: list[StoredRecord] = []
    q = queue_offset
    end = t.end
    scans: dict[int, _SegmentScan] = {}
    bounds: dict[int, tuple[int, int]] = {}
    prev_end = 0
    if q > max(t.index.base, t.start):
        p_off, p_size, _s = t.index.entry(q - 1)
        prev_end = p_off + p_size if p_off < log_end else 0
    while len(out) < n and q < end:
        entries = t.index.read(q, min(max(n, 64), end - q))
        if not entries:
            break
        for off, size, _s in entries:
            d = damage.at(off)
            if d is not None and t.name in d.topics:
                # an entry into damage is damaged only if the damage had that queue
                # offset: a wrong entry (the index is not checksummed) can point there
                span = bounds.get(id(d))
                if span is None:
                    qs = d.topics[t.name]
                    span = bounds[id(d)] = (min(qs), max(qs)) if qs else (1, 0)
                if not span[0] <= q <= span[1]:
                    d = None
                    off = -1   # (read below: fails, and the log is asked)
            if d is not None:
                on_damage(t.name, q, d.start, d.end, "", True)
                prev_end = max(prev_end, d.end if off >= d.start else prev_end)
            else:
                try:
                    if off < prev_end:
                        raise CorruptRecord(f"index entry {q} points before the previous "
                                            "record's end")
                    out.append(_read_one(t, segments, log_end, off, size, q))
                    prev_end = off + size
                except (CorruptRecord, OSError, ValueError) as exc:
                    rec = _diagnose(t, segments, log_end, q, off, size, str(exc), scans,
                                    on_damage)
                    if rec is not None:
                        out.append(rec)
                        prev_end = t.index.entry(q)[0] + t.index.entry(q)[1]  # (repaired)
            q += 1
            if len(out) >= n:
                break
    return out


def decode_entries(data: bytes, base: int, entries: list[tuple[int, int, int]], i: int,
                   j: int, queue_offset: int, topic: str, topic_bytes: bytes,
                   out: list[StoredRecord]) -> None:
    """Append the records of ``entries[i:j]`` (index entries of ``topic``; entry ``m``
    is at queue offset ``queue_offset + m``) from ``data``, read at commit-log offset
    ``base``; :class:`CorruptRecord` for a bad one or one of another topic."""
    m = i
    while m < j:
        if _read_run is not None:
            # compiled: the records without headers, checked as decode_record
            # checks them; it stops at any other, which is read below
            m = _read_run(data, base, entries, m, j, queue_offset, topic, topic_bytes,
                          StoredRecord, _TEXT_CACHE, _TEXT_CACHE_MAX, out)
            if m >= j:
                break
        rec = decode_record(data, entries[m][0] - base, entries[m][0], queue_offset + m)
        if rec.topic != topic:
            raise CorruptRecord(f"index of {topic!r} points at a {rec.topic!r} record")
        out.append(rec)
        m += 1


def read_at(segments: SegmentList, log_end: int, offset: int) -> StoredRecord:
    """The record at commit-log ``offset`` (queue_offset is -1)."""
    if not segments.start <= offset < log_end:
        raise ValueError(f"offset {offset} is outside the log")
    seg = segments[segments.index_of(offset)]
    head = seg.pread(4, offset - seg.base)
    length = HEADER.unpack_from(head + bytes(HEADER.size))[0]
    data = seg.pread(4 + length, offset - seg.base)
    return decode_record(data, 0, offset)
