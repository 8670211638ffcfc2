"""Crash recovery: bring the data directory to a consistent state at open.

Starts from the checkpoint (or from the start of the log if there is none or it is
unusable), scans the commit log after it, truncates a torn or corrupt tail and
re-adds the index entries and dedup state of the scanned records. Work is
proportional to the log written since the last checkpoint.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
import zlib
from dataclasses import dataclass, field

from . import checkpoint as ckpt
from .dedup import DedupTable
from .files import fsync_dir
from .index import ENTRY, IndexError_, TopicIndex
from .names import SEGMENT_DIR, TMP_SUFFIX, index_file_name, index_files
from .records import HEADER, HEADER_SIZE, check_record, trailing_zeros
from .segment import SegmentList

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


def recover(data_dir: str, dedup: DedupTable) -> tuple[SegmentList, dict[str, TopicIndex],
                                                       RecoveryReport]:
    """Recover ``data_dir``; return its segments, open topic indexes and the report.

    ``dedup`` is filled with the recovered dedup state.
    """
    t0 = time.monotonic()
    rep = RecoveryReport()
    for name in os.listdir(data_dir):
        if name.endswith(TMP_SUFFIX):
            os.unlink(os.path.join(data_dir, name))
    segs = SegmentList.open(os.path.join(data_dir, SEGMENT_DIR))
    bases = segs.bases

    # open every index file
    indexes: dict[str, TopicIndex] = {}
    bad_index = False
    for topic, name in index_files(data_dir).items():
        try:
            indexes[topic] = TopicIndex.open(os.path.join(data_dir, name))
        except IndexError_ as exc:
            rep.notes.append(f"index of {topic!r} unusable ({exc}); rebuilding")
            os.unlink(os.path.join(data_dir, name))
            bad_index = True

    cp = ckpt.load(data_dir)
    last_size = segs.active.size()
    log_end = segs.active.base + last_size
    usable = cp is not None and not bad_index and bases[0] <= cp.log_end <= log_end
    if cp is None and (len(bases) > 1 or last_size > 0 or indexes):
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
    first_qstart: dict[str, int] | None = {}
    if usable:
        assert cp is not None
        for topic, idx in indexes.items():
            idx.truncate(cp.queue_ends.get(topic, idx.base))
        try:
            dedup.load(cp.dedup)
        except (ValueError, UnicodeDecodeError):
            rep.notes.append("dedup snapshot unreadable; dedup restarts empty")
        scan_from = max(cp.log_end, bases[0])
    else:
        rep.full_scan = True
        first_qstart = segs.first.read_qstart() if bases[0] > 0 else {}
        if first_qstart is None:
            rep.notes.append(f"queue-start file of segment {bases[0]} missing: queue offsets "
                             "restart at 0")
            first_qstart = {}
        for topic, idx in indexes.items():
            idx.reset(first_qstart.get(topic, 0))
        scan_from = bases[0]
    rep.scanned_from = scan_from

    # scan the tail
    i = max(0, segs.index_of(scan_from))
    pending: dict[str, bytearray] = {}
    cut: tuple[int, int] | None = None  # (segment index, position in it)
    for j in range(i, len(segs)):
        base = bases[j]
        with segs[j].mapped() as (mm, size):
            start = scan_from - base if j == i else 0
            pos = start
            if mm is not None:
                pos, n = _scan_segment(mm, start, size, base, pending, dedup)
                rep.scanned_records += n
            rep.scanned_bytes += pos - start
            # only the newest segment is preallocated: zeros at its end are not data
            last = j == len(bases) - 1
            data_end = trailing_zeros(mm, pos, size) if last and mm is not None else size
            if pos < size and data_end == pos and last:
                # the active segment's preallocated zeros: its records end here, and
                # the writer goes on writing over them
                log_end = base + pos
            elif pos < size:
                why = check_record(mm, pos, size) if mm is not None else "empty"
                rep.cut_reason = f"{why} at offset {base + pos}"
                rep.records_cut = count_cut_records(mm, pos, data_end) if mm is not None else 0
                rep.bytes_cut = data_end - pos   # zeros after them were never data
                cut = (j, pos)
            elif j + 1 < len(bases) and base + size != bases[j + 1]:
                # a lost tail of a closed segment (or a stray file): later segments
                # would sit at the wrong offsets, so they go
                rep.cut_reason = (f"segment {base} ends at {base + size} but the next one "
                                  f"starts at {bases[j + 1]}")
                cut = (j, size)
        if cut is not None:
            break
    if cut is not None:
        # cut this segment, remove later ones
        k, cut_pos = cut
        for later in list(segs)[k + 1:]:
            with later.mapped() as (mm, size):
                data_end = size if later is not segs.active or mm is None \
                    else trailing_zeros(mm, 0, size)
                if mm is not None:
                    rep.records_cut += count_cut_records(mm, 0, data_end)
                rep.bytes_cut += data_end
        segs.delete_after(k)
        segs.active.truncate(cut_pos, durable=True)
        fsync_dir(segs.seg_dir)
        log_end = segs.active.base + cut_pos
        log.warning("store recovery cut %d bytes (%d records) from the log end: %s",
                    rep.bytes_cut, rep.records_cut, rep.cut_reason)

    # add the scanned index entries
    for topic, blob in pending.items():
        idx = indexes.get(topic)
        if idx is None:
            idx = indexes[topic] = TopicIndex.open(
                os.path.join(data_dir, index_file_name(topic)),
                base_if_new=first_qstart.get(topic, 0) if rep.full_scan else 0)
        idx.write_entries(idx.end, bytes(blob))
    for idx in indexes.values():
        idx.sync()
    fsync_dir(data_dir)
    rep.log_end = log_end
    rep.seconds = time.monotonic() - t0
    return segs, indexes, rep
