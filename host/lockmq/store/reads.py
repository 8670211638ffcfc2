"""Reading records back: by topic queue offset (the consumer path) and by commit-log
offset. Runs on the event loop: preads of page-cache data, never waiting for the writer.
"""

from __future__ import annotations

from lockmq import accel

from typing import Callable

from .damage import DamageMap
from .errors import CorruptRecord
from .records import _TEXT_CACHE, _TEXT_CACHE_MAX, HEADER, StoredRecord, decode_record
from .segment import SegmentList
from .topic import Topic

#: most bytes one pread may span when reading a run of records of a topic
READ_SPAN = 256 * 1024

#: compiled: a pread's records decoded in one call (None without the extension)
_read_run = accel.speedups.read_run if accel.COMPILED else None


def read_topic(t: Topic, segments: SegmentList, log_end: int, queue_offset: int,
               n: int) -> list[StoredRecord]:
    """The ``n`` records of topic ``t`` from ``queue_offset`` on (all of them must be
    visible: the caller clamps to the topic's bounds)."""
    entries = t.index.read(queue_offset, n)
    out: list[StoredRecord] = []
    i = 0
    while i < len(entries):
        off, size, _s = entries[i]
        k = segments.index_of(off)
        seg = segments[k]
        seg_end = segments.end_of(k, log_end)
        # one pread for a run of nearby records (other topics' records between
        # them are read and skipped: cheaper than a syscall each)
        j = i + 1
        run_end = off + size
        limit = min(seg_end, off + READ_SPAN)
        while j < len(entries) and entries[j][0] + entries[j][1] <= limit:
            run_end = entries[j][0] + entries[j][1]
            j += 1
        data = seg.pread(run_end - off, off - seg.base)
        if len(data) != run_end - off:
            raise CorruptRecord(f"record at offset {off} of topic {t.name!r} is missing")
        decode_entries(data, off, entries, i, j, queue_offset, t.name, t.name_bytes, out)
        i = j
    return out


#: ``on_damage(topic, queue_offset, offset, size, why, in_log)``: a damaged record was
#: passed; ``in_log`` False means the index entry is wrong, not the log
OnDamage = Callable[[str, int, int, int, str, bool], None]


def read_topic_checked(t: Topic, segments: SegmentList, log_end: int, queue_offset: int,
                       n: int, damage: DamageMap, on_damage: OnDamage) -> list[StoredRecord]:
    """Up to ``n`` intact records of ``t`` from ``queue_offset`` to the topic's end,
    passing over damaged ones: an entry in a quarantined range, or a record that
    fails its checksum (reported to ``on_damage``, which quarantines it). The read
    path when the requested entries meet damage; one record per pread."""
    out: list[StoredRecord] = []
    q = queue_offset
    end = t.end
    while len(out) < n and q < end:
        entries = t.index.read(q, min(max(n, 64), end - q))
        if not entries:
            break
        for off, size, _s in entries:
            d = damage.at(off)
            if d is not None:
                on_damage(t.name, q, off, size, "", True)
            else:
                try:
                    k = segments.index_of(off)
                    seg = segments[k]
                    if off + size > segments.end_of(k, log_end):
                        raise CorruptRecord(f"record at offset {off} runs past its segment")
                    data = seg.pread(size, off - seg.base)
                    rec = decode_record(data, 0, off, q)
                except (CorruptRecord, OSError) as exc:
                    on_damage(t.name, q, off, size, str(exc), True)
                else:
                    if rec.topic == t.name:
                        out.append(rec)
                    else:
                        on_damage(t.name, q, off, size, f"the index entry points at a "
                                  f"{rec.topic!r} record", False)
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
