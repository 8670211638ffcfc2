"""Offline inspection of a data directory: verify every checksum, dump records.

Read-only; used by ``lockmq store check`` and ``lockmq store dump``. Safe to run
next to a live broker, but a live store may show a tail that is still being
written, so check a stopped store for a definitive answer.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass, field
from typing import Callable, Iterator

from . import checkpoint as ckpt
from .errors import CorruptRecord
from .index import ENTRY, ENTRY_SIZE, HEADER, HEADER_SIZE, INDEX_VERSION, MAGIC, IndexError_
from .names import (CHECKPOINT, SEGMENT_DIR, index_file_name, index_files, list_segments,
                    positions_files)
from .damage import Damage, DamageMap, load_items
from .positions import load_copy, parse_full as parse_positions_full
from .records import StoredRecord, check_record, decode_record, next_valid, scan, trailing_zeros
from .segment import Segment


@dataclass
class CheckReport:
    """Outcome of :func:`check_dir`. ``problems`` are corruption (exit 1);
    ``notes`` are states crash recovery repairs by design."""

    segments: int = 0
    records: int = 0
    log_bytes: int = 0
    topics: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True if no corruption was found."""
        return not self.problems


def _segments(data_dir: str) -> list[Segment]:
    """The segments of a data directory, oldest first, without changing anything."""
    seg_dir = os.path.join(data_dir, SEGMENT_DIR)
    if not os.path.isdir(seg_dir):
        raise FileNotFoundError(f"{data_dir} has no {SEGMENT_DIR}/ folder: not a lockmq data directory")
    return [Segment(seg_dir, b) for b in list_segments(seg_dir)]


def check_dir(data_dir: str) -> CheckReport:
    """Verify every record checksum, segment continuity, indexes, checkpoint, positions.

    Damage is reported as it is: the byte range, whether the broker has quarantined
    it (the ``damage`` file) and what that cost; the intact records after it are
    counted like any other (recovery keeps them)."""
    rep = CheckReport()
    segs = _segments(data_dir)
    rep.segments = len(segs)
    known = DamageMap(data_dir, load_items(data_dir))
    bad = DamageMap(data_dir)   # what this check finds, for the index comparison
    offsets: dict[str, array] = {}
    log_end = segs[0].base if segs else 0

    def damaged(lo: int, hi: int, seg: int, why: str) -> None:
        bad.add(Damage(lo, hi, seg, why))
        q = known.at(lo)
        if q is not None:
            status = (f"quarantined by the broker ({q.found}); {q.describe()}")
        else:
            status = ("not quarantined yet: the next broker start quarantines it and keeps "
                      "the intact records after it")
        rep.problems.append(f"segment {seg}: damaged bytes [{lo}, {hi}) ({hi - lo} bytes): "
                            f"{why}; {status}")

    for i, seg in enumerate(segs):
        base = seg.base
        last = i == len(segs) - 1
        if i and base != log_end:
            if base > log_end:
                damaged(log_end, base, segs[i - 1].base,
                        f"missing: the segment file ends {base - log_end} bytes before the "
                        "next segment starts")
            else:
                rep.problems.append(f"segment {base}: starts at {base}, before the previous "
                                    f"segment's end {log_end}")
        pos = 0
        with seg.mapped() as (mm, size):
            if not last:
                size = min(size, segs[i + 1].base - base)
            while mm is not None and pos < size:
                for rv in scan(mm, pos, size):
                    a = offsets.get(rv.topic)
                    if a is None:
                        a = offsets[rv.topic] = array("Q")
                    a.append(base + rv.pos)
                    rep.records += 1
                    pos = rv.pos + rv.size
                if pos >= size:
                    break
                if last and trailing_zeros(mm, pos, size) == pos:
                    size = pos   # the active segment's preallocated zeros
                    break
                why = check_record(mm, pos, size) or "unreadable record"
                nxt = next_valid(mm, pos, size)
                if nxt is None and last:
                    data_end = trailing_zeros(mm, pos, size)
                    if known.at(base + pos) is not None:
                        damaged(base + pos, base + data_end, base, why)
                    else:
                        rep.problems.append(
                            f"tail of the last segment {base}: {why} at offset {base + pos}; "
                            f"{data_end - pos} bytes after it are unreadable and nothing "
                            "intact follows (a torn write: recovery cuts it)")
                        bad.add(Damage(base + pos, base + data_end, base, why))
                    size = data_end
                    break
                hi = size if nxt is None else nxt
                damaged(base + pos, base + hi, base, why)
                pos = hi
        rep.log_bytes += size
        log_end = base + size
    log_start = segs[0].base if segs else 0
    for topic, a in offsets.items():
        rep.topics[topic] = len(a)
    for d in known.items:
        if bad.at(d.start) is None and d.start >= log_start:
            rep.notes.append(f"quarantined earlier (its bytes now read back intact or are "
                             f"past the log end): {d.describe()}")

    # indexes
    for topic, name in index_files(data_dir).items():
        path = os.path.join(data_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            rep.problems.append(f"index {name}: {exc}")
            continue
        try:
            hdr = os.pread(fd, HEADER_SIZE, 0)
            try:
                magic, ver, esize, ibase = HEADER.unpack(hdr)
                if magic != MAGIC or ver != INDEX_VERSION or esize != ENTRY_SIZE:
                    raise IndexError_("bad header")
            except Exception:
                rep.problems.append(f"index {name}: bad header (recovery rebuilds it)")
                continue
            size = os.fstat(fd).st_size
            n = (size - HEADER_SIZE) // ENTRY_SIZE
            got = array("Q")
            holes = 0
            pos = HEADER_SIZE
            while pos < HEADER_SIZE + n * ENTRY_SIZE:
                chunk = os.pread(fd, min(1 << 20, HEADER_SIZE + n * ENTRY_SIZE - pos), pos)
                for off, _sz, _ts in ENTRY.iter_unpack(chunk[:len(chunk) - len(chunk) % ENTRY_SIZE]):
                    if off >= log_start:
                        if (bad or known) and (bad.at(off) is not None
                                               or known.at(off) is not None):
                            holes += 1   # a damaged record's entry: never served
                        else:
                            got.append(off)
                pos += len(chunk)
            if holes:
                rep.notes.append(f"index {name}: {holes} entries of damaged records "
                                 "(their queue offsets are skipped, never served)")
        finally:
            os.close(fd)
        want = offsets.get(topic, array("Q"))
        common = min(len(got), len(want))
        if got[:common] != want[:common]:
            k = next(i for i in range(common) if got[i] != want[i])
            rep.problems.append(f"index {name}: entry {k} after the log start points at "
                                f"{got[k]}, the log has that record at {want[k]}")
        elif len(got) > len(want):
            rep.notes.append(f"index {name}: {len(got) - len(want)} entries past the log end "
                             "(recovery cuts them)")
        elif len(got) < len(want):
            rep.notes.append(f"index {name}: {len(want) - len(got)} records not indexed yet "
                             "(recovery adds them)")
    for topic in offsets:
        if not os.path.exists(os.path.join(data_dir, index_file_name(topic))):
            rep.notes.append(f"topic {topic!r} has no index file (recovery rebuilds it)")

    # checkpoint
    cpath = os.path.join(data_dir, CHECKPOINT)
    if os.path.exists(cpath):
        cp = ckpt.load(data_dir)
        if cp is None:
            rep.problems.append("checkpoint: damaged (recovery then reads the whole log)")
        elif cp.log_end > log_end:
            rep.problems.append(f"checkpoint: says {cp.log_end} bytes are durable but the log "
                                f"ends at {log_end}")
    else:
        rep.notes.append("no checkpoint (recovery reads the whole log)")

    # positions, against their second copy
    copy = load_copy(data_dir)
    files = positions_files(data_dir)
    if files and copy is None:
        rep.notes.append("positions.copy is missing or damaged (the broker writes it again)")
    for cluster, name in files.items():
        with open(os.path.join(data_dir, name), "rb") as f:
            data = f.read()
        snap, good, damaged = parse_positions_full(data)
        if snap is None:
            saved = (copy or {}).get(cluster)
            rep.problems.append(
                f"{name}: unreadable ({len(data)} bytes, no intact save); " +
                (f"positions.copy has save {saved['gen']}: the broker restores it at start"
                 if saved else "no copy: the cluster restarts from nothing"))
        elif damaged:
            rep.problems.append(f"{name}: {damaged} bytes damaged before its latest intact "
                                f"save ({snap['gen']}), which the broker uses")
        elif good != len(data):
            rep.notes.append(f"{name}: {len(data) - good} bytes of a torn last save "
                             "(the previous positions are used)")
    for cluster, saved in sorted((copy or {}).items()):
        if cluster not in files:
            rep.problems.append(f"consume-{cluster}.log: missing; positions.copy has its "
                                f"save {saved['gen']} (the broker restores it at start; "
                                "messages acknowledged after that save come again)")
    return rep


def iter_records(data_dir: str, start_offset: int = 0,
                 on_damage: "Callable[[int, int, str], None] | None" = None
                 ) -> Iterator[StoredRecord]:
    """Yield every record of the commit log from ``start_offset`` in log order
    (queue_offset -1). Where the log is unreadable: raise
    :class:`~lockmq.store.CorruptRecord`, or with ``on_damage``, call
    ``on_damage(start, end, why)`` for the damaged range and go on with the next
    intact record."""
    segs = _segments(data_dir)
    for i, seg in enumerate(segs):
        base = seg.base
        last = i == len(segs) - 1
        if not last and segs[i + 1].base <= start_offset:
            continue
        with seg.mapped() as (mm, size):
            if mm is None:
                continue
            if not last:
                size = min(size, segs[i + 1].base - base)
            pos = max(0, start_offset - base)
            while pos < size:
                for rv in scan(mm, pos, size):
                    yield decode_record(mm[rv.pos:rv.pos + rv.size], 0, base + rv.pos)
                    pos = rv.pos + rv.size
                if pos >= size or (last and trailing_zeros(mm, pos, size) == pos):
                    break
                why = check_record(mm, pos, size) or "unreadable record"
                if on_damage is None:
                    raise CorruptRecord(f"offset {base + pos}: {why}")
                nxt = next_valid(mm, pos, size)
                hi = size if nxt is None else nxt
                on_damage(base + pos, base + hi, why)
                pos = hi
