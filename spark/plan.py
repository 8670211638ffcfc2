"""Planning reads of commit logs: offsets, read limits, and packing work into partitions.

An *offset* of a log is the log position of the next record to read (FORMAT.md:
segment base + position in the segment). Offsets of a set of logs are a dict
``{log directory (absolute path): position}`` -- JSON with string keys, which is
what a Spark streaming source checkpoints. Runs on the driver; opens files only
to find record boundaries (no CRC work except on the last record of a live log).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

from lockmq.store import index as store_index
from lockmq.store.names import index_files

from .layout import Log, Segment, complete_end, find_logs, record_ok, walk_boundaries

DEFAULT_MAX_PARTITION_BYTES = 32 << 20
MIN_PARTITION_BYTES = 1 << 20


@dataclass(frozen=True)
class Piece:
    """Bytes ``[start, end)`` (positions in the file) of one segment, to decode."""

    log: str
    gateway_id: str | None
    path: str
    base: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Number of bytes in the piece."""
        return self.end - self.start


def discover(paths: list[str], gateway_id: str | None = None) -> list[Log]:
    """All logs under ``paths``, keyed by their absolute folder path."""
    logs: dict[str, Log] = {}
    for p in paths:
        for log in find_logs(p, gateway_id):
            logs[log.directory] = Log(log.directory, log.directory, log.gateway_id)
    return [logs[k] for k in sorted(logs)]


def parse_offsets(text: str | None, logs: list[Log], default: str) -> dict[str, int]:
    """Offsets from an option: ``earliest``, ``latest`` or a JSON object ``{log: pos}``."""
    text = (text or default).strip()
    if text == "earliest":
        return earliest(logs)
    if text == "latest":
        return latest(logs)
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError(f"lockmq: offsets must be 'earliest', 'latest' or JSON, got {text[:80]!r}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, int) and v >= 0 for v in doc.values()):
        raise ValueError("lockmq: offsets JSON must map log paths to non-negative integers")
    out = earliest(logs)
    out.update({os.path.abspath(k): v for k, v in doc.items()})
    return out


def earliest(logs: list[Log]) -> dict[str, int]:
    """The first position present in every log (0 for an empty log)."""
    out = {}
    for log in logs:
        segs = log.segments()
        out[log.key] = segs[0].base if segs else 0
    return out


def _read(path: str, start: int = 0, end: int | None = None) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read() if end is None else f.read(max(0, end - start))


def log_end(segs: list[Segment], directory: str | None = None) -> int:
    """Position just past the last complete record of a log (whose newest segment may be live).

    Walks the newest segment from its last record start known to the topic
    indexes of ``directory`` (if any), else from its beginning.
    """
    if not segs:
        return 0
    last = segs[-1]
    begin = 0
    if directory is not None:
        starts = TopicIndexes(directory).starts
        i = int(np.searchsorted(starts, last.end, side="left")) - 1
        while i >= 0 and starts[i] >= last.base:
            pos = int(starts[i]) - last.base
            try:
                head = _read(last.path, pos, last.size)
            except FileNotFoundError:
                return last.base
            if record_ok(head, 0, len(head)):
                begin = pos
                break
            i -= 1  # stale entry: try an earlier one
            if i < len(starts) - 64:
                break
    try:
        buf = _read(last.path, begin)
    except FileNotFoundError:
        return last.base
    return last.base + begin + complete_end(buf, 0, len(buf))


def latest(logs: list[Log]) -> dict[str, int]:
    """The end of every log."""
    return {log.key: log_end(log.segments(), log.directory) for log in logs}


def _seg_ranges(segs: list[Segment], start: int, end: int) -> list[tuple[Segment, int, int]]:
    """(segment, file start, file end) for the part of ``[start, end)`` in each segment."""
    out = []
    for i, s in enumerate(segs):
        hi = s.end if i + 1 < len(segs) else max(s.base, end)
        lo_pos, hi_pos = max(start, s.base), min(end, hi, s.end)
        if hi_pos > lo_pos:
            out.append((s, lo_pos - s.base, hi_pos - s.base))
    return out


def limit_offsets(logs: list[Log], start: dict[str, int], end: dict[str, int],
                  max_records: int | None = None, max_bytes: int | None = None) -> dict[str, int]:
    """Cut ``end`` so that at most ``max_records`` records / ``max_bytes`` bytes lie past ``start``.

    Logs are taken in key order; at least one record is admitted when any is
    available, so a stream always progresses.
    """
    if max_records is None and max_bytes is None:
        return dict(end)
    rec_left = max_records if max_records is not None else -1
    byte_left = max_bytes if max_bytes is not None else sys.maxsize
    out = dict(start)
    progressed = False
    for log in logs:
        key = log.key
        s0, e0 = start.get(key, 0), end.get(key, 0)
        out[key] = s0
        if e0 <= s0:
            continue
        if rec_left == 0 or byte_left <= 0:
            continue
        for seg, lo, hi in _seg_ranges(log.segments(), s0, e0):
            try:
                buf = _read(seg.path, 0, hi)
            except FileNotFoundError:
                continue
            if rec_left == 0 or byte_left <= 0:
                break
            stop, n, _, _ = walk_boundaries(buf, lo, min(hi, lo + byte_left), 0, rec_left)
            if n == 0 and not progressed:
                stop, n, _, _ = walk_boundaries(buf, lo, hi, 0, 1)
            if n:
                progressed = True
                out[key] = seg.base + stop
                if rec_left > 0:
                    rec_left -= n
                byte_left -= stop - lo
            if stop < hi:
                break
            out[key] = seg.base + hi
    return out


def pieces(logs: list[Log], start: dict[str, int], end: dict[str, int]) -> tuple[list[Piece], int]:
    """The pieces of every log between ``start`` and ``end``.

    Returns ``(pieces, missing_bytes)``, the latter counting positions in the range
    that no segment holds any more (deleted by retention).
    """
    out: list[Piece] = []
    missing = 0
    for log in logs:
        s0, e0 = start.get(log.key, 0), end.get(log.key, 0)
        if e0 <= s0:
            continue
        segs = log.segments()
        if segs and s0 < segs[0].base:
            missing += min(e0, segs[0].base) - s0
        for seg, lo, hi in _seg_ranges(segs, s0, e0):
            out.append(Piece(log.key, log.gateway_id, seg.path, seg.base, lo, hi))
    return out, missing


class TopicIndexes:
    """Record positions known from a log folder's topic indexes (``offset-<topic>.log``).

    The storage engine keeps one 16-byte entry (commit-log offset, size, time)
    per record in each topic's index (host/lockmq/store/index.py). Their union
    is a sorted list of record starts: split points for free, without reading the
    segment. An index may lag behind the log or be stale, so every cut taken from
    it is checked (the record there must have a matching CRC) before use.
    """

    # the index format is the store's (lockmq.store.index)
    ENTRY = np.dtype([("offset", "<u8"), ("size", "<u4"), ("time", "<u4")])
    assert ENTRY.itemsize == store_index.ENTRY_SIZE
    HEADER = store_index.HEADER_SIZE
    MAGIC = store_index.MAGIC

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._starts: np.ndarray | None = None

    _cache: dict[str, tuple[tuple, np.ndarray]] = {}

    @property
    def starts(self) -> np.ndarray:
        """Sorted record start offsets found in all topic indexes (empty if none)."""
        if self._starts is None:
            try:
                names = sorted(index_files(self.directory).values())
                key = tuple((n, os.stat(os.path.join(self.directory, n)).st_size) for n in names)
            except OSError:
                names, key = [], ()
            hit = self._cache.get(self.directory)
            if hit is not None and hit[0] == key:
                self._starts = hit[1]
                return hit[1]
            parts = []
            for name in names:
                path = os.path.join(self.directory, name)
                try:
                    with open(path, "rb") as f:
                        head = f.read(self.HEADER)
                        if len(head) < self.HEADER or head[:4] != self.MAGIC:
                            continue
                        raw = f.read()
                except OSError:
                    continue
                n = len(raw) // self.ENTRY.itemsize
                parts.append(np.frombuffer(raw, dtype=self.ENTRY, count=n)["offset"].astype(np.int64))
            starts = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            if len(parts) > 1 or (len(starts) > 1 and not (starts[1:] > starts[:-1]).all()):
                starts.sort()
                starts = starts[np.concatenate(([True], starts[1:] != starts[:-1]))]
            self._starts = starts
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[self.directory] = (key, starts)
        return self._starts


class _Cutter:
    """Finds record boundaries inside one piece: from the topic indexes, else by walking."""

    def __init__(self, piece: Piece, indexes: TopicIndexes) -> None:
        self.p = piece
        self.idx = indexes
        self._buf: bytes | None = None
        self.from_index = 0

    def _data(self) -> bytes:
        if self._buf is None:
            try:
                self._buf = _read(self.p.path, 0, self.p.end)
            except FileNotFoundError:
                self._buf = b""
        return self._buf

    def _ok(self, pos: int) -> bool:
        try:
            with open(self.p.path, "rb") as f:
                f.seek(pos)
                head = f.read(8)
                if len(head) < 8:
                    return False
                length = int.from_bytes(head[:4], "little")
                if length < 36 or pos + 4 + length > self.p.end:
                    return False
                f.seek(pos)
                rec = f.read(4 + length)
        except OSError:
            return False
        return record_ok(rec, 0, len(rec))

    def cut(self, lo: int, hi: int) -> int:
        """The last record boundary in ``(lo, hi]`` (``lo`` if there is none)."""
        starts = self.idx.starts
        if len(starts):
            base = self.p.base
            i = int(np.searchsorted(starts, base + hi, side="right")) - 1
            if i >= 0 and base + lo < starts[i] < base + self.p.end and self._ok(int(starts[i]) - base):
                self.from_index += 1
                return int(starts[i]) - base
        return walk_boundaries(self._data(), lo, hi)[0]

    def next_record(self, lo: int) -> int:
        """The end of the record at ``lo`` (``lo`` if none fits)."""
        return walk_boundaries(self._data(), lo, self.p.end, 0, 1)[0]


def pack(items: list[Piece], max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
         min_partitions: int = 1, min_partition_bytes: int = MIN_PARTITION_BYTES) -> list[list[Piece]]:
    """Group pieces into partitions of roughly equal bytes, splitting big pieces on record boundaries.

    Many small segment files share one partition (each Spark task costs ~50 ms);
    a big one is cut at record boundaries taken from the topic indexes when the
    log has them (a live data directory), else found by walking record lengths.
    Aims at ``min_partitions`` partitions (or a multiple of it, so that no core
    idles in the last wave), none above ``max_partition_bytes`` and none below
    ``min_partition_bytes`` (unless there is less data than that).
    """
    total = sum(p.size for p in items)
    if not total:
        return []
    # a whole multiple of min_partitions (the cores): 3 equal tasks on 2 cores take
    # as long as 4, with one core idle for the last third
    waves = math.ceil(total / max(1, max_partition_bytes) / max(1, min_partitions))
    target = min(max_partition_bytes, math.ceil(total / (max(1, min_partitions) * max(1, waves))))
    target = max(target, min(min_partition_bytes, max_partition_bytes), 1)
    slack = target + target // 4
    parts: list[list[Piece]] = []
    cur: list[Piece] = []
    cur_bytes = 0

    def add(piece: Piece) -> None:
        nonlocal cur_bytes
        cur.append(piece)
        cur_bytes += piece.size

    def flush() -> None:
        nonlocal cur, cur_bytes
        if cur:
            parts.append(cur)
        cur, cur_bytes = [], 0

    indexes: dict[str, TopicIndexes] = {}
    for p in items:
        if cur_bytes + p.size <= slack:
            add(p)
            if cur_bytes >= target:
                flush()
            continue
        idx = indexes.get(p.log)
        if idx is None:
            idx = indexes[p.log] = TopicIndexes(p.log)
        cutter = _Cutter(p, idx)
        lo = p.start
        while lo < p.end:
            room = target - cur_bytes
            if cur_bytes + (p.end - lo) <= slack:
                add(Piece(p.log, p.gateway_id, p.path, p.base, lo, p.end))
                break
            stop = cutter.cut(lo, min(p.end, lo + max(room, 0)))
            if stop == lo:
                if cur:
                    flush()
                    continue
                stop = cutter.next_record(lo)
                if stop == lo:  # not a record boundary: leave the rest to the decoder
                    stop = p.end
            add(Piece(p.log, p.gateway_id, p.path, p.base, lo, stop))
            flush()
            lo = stop
        if cur_bytes >= target:
            flush()
    flush()
    return parts


def plan(paths: list[str], start: dict[str, int] | None, end: dict[str, int] | None,
         gateway_id: str | None = None, max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
         min_partitions: int = 1, min_partition_bytes: int = MIN_PARTITION_BYTES) -> tuple[list[list[Piece]], dict[str, int], dict[str, int], int]:
    """Discover logs and plan a read: ``(partitions, start, end, missing_bytes)``."""
    logs = discover(paths, gateway_id)
    s = earliest(logs) if start is None else {**earliest(logs), **start}
    e = latest(logs) if end is None else {**latest(logs), **end}
    items, missing = pieces(logs, s, e)
    return pack(items, max_partition_bytes, min_partitions, min_partition_bytes), s, e, missing
