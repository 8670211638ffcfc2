"""Commit-log segments: :class:`Segment` owns one segment's files, :class:`SegmentList`
the ordered segments of a log (like Kafka's ``LogSegment`` and its segment map).

A segment is ``message.log/<base>.log`` (records; commit-log offset ``base + pos``)
plus its queue-start sidecar ``<base>.qstart`` (each topic's queue end at the
segment's first byte, so indexes can be rebuilt after older segments are gone).
Every way a segment's files are created, written, read, cut and removed is here.

Threads: the writer thread creates, writes and syncs the active segment; the event
loop reads (its own read descriptor) and deletes closed segments. A
:class:`SegmentList` is changed on the loop only (and by recovery before that).
"""

from __future__ import annotations

import bisect
import json
import mmap
import os
from contextlib import contextmanager
from typing import Iterator

from .files import create_file, fsync_dir, make_dir, read_file, seal, unseal
from .names import list_segments, qstart_name, segment_name


class Segment:
    """One segment's log file and sidecar. ``base`` is its first commit-log offset."""

    __slots__ = ("seg_dir", "base", "path", "_wfd", "_rfd")

    def __init__(self, seg_dir: str, base: int) -> None:
        self.seg_dir = seg_dir
        self.base = base
        self.path = os.path.join(seg_dir, segment_name(base))
        self._wfd = -1
        self._rfd = -1

    def __repr__(self) -> str:
        return f"Segment({self.base})"

    @classmethod
    def create(cls, seg_dir: str, base: int) -> "Segment":
        """Create (or empty) the segment file at ``base``, open for writing."""
        seg = cls(seg_dir, base)
        seg._wfd = create_file(seg.path, os.O_WRONLY | os.O_TRUNC)
        return seg

    # ---------------------------------------------------------------- log file

    def size(self) -> int:
        """Bytes in the log file now."""
        return os.path.getsize(self.path)

    def mtime_ms(self) -> float:
        """When the log file was last written (ms since the epoch)."""
        return os.stat(self.path).st_mtime * 1000

    def set_mtime_ms(self, ms: float) -> None:
        """Set the log file's mtime (a closed segment's last write, on the store's clock)."""
        ns = int(ms * 1_000_000)
        os.utime(self.path, ns=(ns, ns))

    def open_writer(self) -> None:
        """Open the existing log file for writing (the active segment at open)."""
        if self._wfd < 0:
            self._wfd = os.open(self.path, os.O_WRONLY)

    def write_at(self, data: bytes, pos: int) -> None:
        """Write ``data`` at file position ``pos`` (pwrite until all of it is written)."""
        w = os.pwrite(self._wfd, data, pos)
        if w != len(data):
            view = memoryview(data)[w:]
            pos += w
            while view:
                w = os.pwrite(self._wfd, view, pos)
                pos += w
                view = view[w:]

    @property
    def write_fd(self) -> int:
        """The write descriptor (-1 when closed), for a caller doing its own pwrites."""
        return self._wfd

    def close_writer(self) -> None:
        """Close the write descriptor (the segment was closed by a roll)."""
        if self._wfd >= 0:
            os.close(self._wfd)
            self._wfd = -1

    def sync(self) -> None:
        """fdatasync the log file (it must be open for writing)."""
        os.fdatasync(self._wfd)

    def truncate(self, size: int, durable: bool = False) -> None:
        """Cut the log file to ``size`` bytes; ``durable`` also fsyncs the cut."""
        if self._wfd >= 0:
            os.ftruncate(self._wfd, size)
            if durable:
                os.fsync(self._wfd)
            return
        with open(self.path, "r+b") as f:
            f.truncate(size)
            if durable:
                os.fsync(f.fileno())

    def pread(self, n: int, pos: int) -> bytes:
        """Read ``n`` bytes at file position ``pos`` (the loop's own descriptor)."""
        if self._rfd < 0:
            self._rfd = os.open(self.path, os.O_RDONLY)
        return os.pread(self._rfd, n, pos)

    @contextmanager
    def mapped(self) -> Iterator[tuple[mmap.mmap | None, int]]:
        """``(read-only map or None if empty, size)`` of the log file, for scans."""
        fd = os.open(self.path, os.O_RDONLY)
        mm = None
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
            yield mm, size
        finally:
            if mm is not None:
                mm.close()
            os.close(fd)

    # ---------------------------------------------------------------- sidecar

    def write_qstart(self, ends: dict[str, int]) -> None:
        """Write (and fsync) the queue-start sidecar: each topic's queue end at the
        segment's first byte."""
        data = seal(json.dumps(ends, sort_keys=True).encode("ascii"))
        fd = create_file(os.path.join(self.seg_dir, qstart_name(self.base)),
                         os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_qstart(self) -> dict[str, int] | None:
        """The queue-start sidecar (None if missing or damaged)."""
        blob = read_file(os.path.join(self.seg_dir, qstart_name(self.base)))
        data = None if blob is None else unseal(blob)
        if data is None:
            return None
        try:
            return {str(k): int(v) for k, v in json.loads(data).items()}
        except (ValueError, AttributeError):
            return None

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Close the segment's descriptors (its files stay)."""
        self.close_writer()
        if self._rfd >= 0:
            os.close(self._rfd)
            self._rfd = -1

    def delete(self) -> None:
        """Close the segment and remove its log file and sidecar (the caller fsyncs
        the directory when it needs the removal durable)."""
        self.close()
        os.unlink(self.path)
        try:
            os.unlink(os.path.join(self.seg_dir, qstart_name(self.base)))
        except FileNotFoundError:
            pass


class SegmentList:
    """The segments of one commit log, oldest first; the last one is active.

    Closed segments are never written again; the active one receives appends and is
    never deleted. Positions are commit-log offsets throughout.
    """

    def __init__(self, seg_dir: str, segments: list[Segment]) -> None:
        self.seg_dir = seg_dir
        self._segs = segments
        #: base offsets, kept beside the segments for bisect
        self.bases = [s.base for s in segments]

    @classmethod
    def open(cls, seg_dir: str) -> "SegmentList":
        """The segments in ``seg_dir`` (created, with one empty segment at 0, if none)."""
        make_dir(seg_dir)
        bases = list_segments(seg_dir)
        if not bases:
            seg = Segment.create(seg_dir, 0)
            try:
                os.fsync(seg._wfd)
            finally:
                seg.close()
            fsync_dir(seg_dir)
            bases = [0]
        return cls(seg_dir, [Segment(seg_dir, b) for b in bases])

    def __len__(self) -> int:
        return len(self._segs)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._segs)

    def __getitem__(self, k: int) -> Segment:
        return self._segs[k]

    @property
    def first(self) -> Segment:
        """The oldest retained segment."""
        return self._segs[0]

    @property
    def active(self) -> Segment:
        """The segment appends go to."""
        return self._segs[-1]

    @property
    def start(self) -> int:
        """Commit-log offset of the oldest retained byte."""
        return self.bases[0]

    def index_of(self, offset: int) -> int:
        """Position in the list of the segment holding commit-log ``offset``."""
        return bisect.bisect_right(self.bases, offset) - 1

    def end_of(self, k: int, log_end: int) -> int:
        """Commit-log offset just past segment ``k`` (``log_end`` for the active one)."""
        return self.bases[k + 1] if k + 1 < len(self.bases) else log_end

    def roll(self, seg: Segment) -> None:
        """Add a new active segment (its file was created by the writer)."""
        self._segs.append(seg)
        self.bases.append(seg.base)

    def delete_oldest(self, k: int) -> list[tuple[int, int]]:
        """Delete the ``k`` oldest segments (never the active one); returns
        ``(base, bytes)`` of each."""
        k = min(k, len(self._segs) - 1)
        gone = []
        for seg in self._segs[:k]:
            size = seg.size()
            seg.delete()
            gone.append((seg.base, size))
        del self._segs[:k]
        del self.bases[:k]
        return gone

    def delete_after(self, k: int) -> None:
        """Delete every segment after segment ``k`` (recovery cutting a broken tail)."""
        for seg in self._segs[k + 1:]:
            seg.delete()
        del self._segs[k + 1:]
        del self.bases[k + 1:]

    def close(self) -> None:
        """Close every segment's descriptors."""
        for seg in self._segs:
            seg.close()
