"""Offline inspection of a data directory: verify every checksum, dump records.

Read-only; used by ``lockmq store check`` and ``lockmq store dump``. Safe to run
next to a live broker, but a live store may show a tail that is still being
written, so check a stopped store for a definitive answer.
"""

from __future__ import annotations

import mmap
import os
from array import array
from dataclasses import dataclass, field
from typing import Iterator

from . import checkpoint as ckpt
from .errors import CorruptRecord
from .files import SEGMENT_DIR, list_segments, segment_name
from .index import ENTRY, ENTRY_SIZE, HEADER, HEADER_SIZE, INDEX_VERSION, MAGIC, IndexError_
from .positions import parse as parse_positions
from .records import StoredRecord, check_record, decode_record, scan


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


def _segments(data_dir: str) -> tuple[str, list[int]]:
    seg_dir = os.path.join(data_dir, SEGMENT_DIR)
    if not os.path.isdir(seg_dir):
        raise FileNotFoundError(f"{data_dir} has no {SEGMENT_DIR}/ folder: not a lockmq data directory")
    return seg_dir, list_segments(seg_dir)


def check_dir(data_dir: str) -> CheckReport:
    """Verify every record checksum, segment continuity, indexes, checkpoint, positions."""
    rep = CheckReport()
    seg_dir, bases = _segments(data_dir)
    rep.segments = len(bases)
    offsets: dict[str, array] = {}
    log_end = bases[0] if bases else 0
    for i, base in enumerate(bases):
        path = os.path.join(seg_dir, segment_name(base))
        size = os.path.getsize(path)
        if i and base != log_end:
            rep.problems.append(f"segment {base}: expected to start at {log_end} "
                                f"(previous segment ends there)")
        pos = 0
        if size:
            with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
                for rv in scan(mm, 0, size):
                    a = offsets.get(rv.topic)
                    if a is None:
                        a = offsets[rv.topic] = array("Q")
                    a.append(base + rv.pos)
                    rep.records += 1
                    pos = rv.pos + rv.size
                if pos < size:
                    why = check_record(mm, pos, size)
                    where = "tail of the last segment" if i == len(bases) - 1 else "segment"
                    rep.problems.append(
                        f"{where} {base}: {why} at offset {base + pos}; {size - pos} bytes "
                        "after it are unreadable (recovery cuts them)")
        rep.log_bytes += size
        log_end = base + size
    log_start = bases[0] if bases else 0
    for topic, a in offsets.items():
        rep.topics[topic] = len(a)

    # indexes
    for name in sorted(os.listdir(data_dir)):
        if not (name.startswith("offset-") and name.endswith(".log")):
            continue
        topic = name[len("offset-"):-len(".log")]
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
            pos = HEADER_SIZE
            while pos < HEADER_SIZE + n * ENTRY_SIZE:
                chunk = os.pread(fd, min(1 << 20, HEADER_SIZE + n * ENTRY_SIZE - pos), pos)
                for off, _sz, _ts in ENTRY.iter_unpack(chunk[:len(chunk) - len(chunk) % ENTRY_SIZE]):
                    if off >= log_start:
                        got.append(off)
                pos += len(chunk)
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
        if not os.path.exists(os.path.join(data_dir, f"offset-{topic}.log")):
            rep.notes.append(f"topic {topic!r} has no index file (recovery rebuilds it)")

    # checkpoint
    cpath = os.path.join(data_dir, ckpt.FILE_NAME)
    if os.path.exists(cpath):
        cp = ckpt.load(data_dir)
        if cp is None:
            rep.problems.append("checkpoint: damaged (recovery then reads the whole log)")
        elif cp.log_end > log_end:
            rep.problems.append(f"checkpoint: says {cp.log_end} bytes are durable but the log "
                                f"ends at {log_end}")
    else:
        rep.notes.append("no checkpoint (recovery reads the whole log)")

    # positions
    for name in sorted(os.listdir(data_dir)):
        if name.startswith("consume-") and name.endswith(".log"):
            with open(os.path.join(data_dir, name), "rb") as f:
                data = f.read()
            _gen, _pos, good = parse_positions(data)
            if good != len(data):
                rep.notes.append(f"{name}: {len(data) - good} bytes of a torn last save "
                                 "(the previous positions are used)")
    return rep


def iter_records(data_dir: str, start_offset: int = 0) -> Iterator[StoredRecord]:
    """Yield every record of the commit log from ``start_offset`` in log order
    (queue_offset -1). Raises :class:`~lockmq.store.CorruptRecord` where the log is
    unreadable."""
    seg_dir, bases = _segments(data_dir)
    for i, base in enumerate(bases):
        nxt = bases[i + 1] if i + 1 < len(bases) else None
        if nxt is not None and nxt <= start_offset:
            continue
        path = os.path.join(seg_dir, segment_name(base))
        size = os.path.getsize(path)
        if not size:
            continue
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            pos = max(0, start_offset - base)
            for rv in scan(mm, pos, size):
                yield decode_record(mm[rv.pos:rv.pos + rv.size], 0, base + rv.pos)
                pos = rv.pos + rv.size
            if pos < size:
                raise CorruptRecord(f"offset {base + pos}: {check_record(mm, pos, size)}")
