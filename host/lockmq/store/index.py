"""The per-topic index file ``offset-<topic>.log`` (like RocketMQ's ConsumeQueue).

A 16-byte header, then one 16-byte entry per record of the topic, in queue order;
entry ``i`` is queue offset ``base + i``. Entries are read by position with pread,
never by loading the file. The index is never trusted past the last checkpoint:
recovery cuts it there and re-adds entries from the commit log.
"""

from __future__ import annotations

import os
import struct

from .files import create_file

MAGIC = b"LMQX"
INDEX_VERSION = 1
HEADER = struct.Struct("<4sHHQ")  # magic, version, entry size, base queue offset
HEADER_SIZE = HEADER.size  # 16
ENTRY = struct.Struct("<QII")  # commit-log offset, record size, broker time (s)
ENTRY_SIZE = ENTRY.size  # 16


class IndexError_(Exception):
    """The index file is unusable (bad header); recovery rebuilds it."""


class TopicIndex:
    """One topic's index file, opened read-write.

    ``base`` is the queue offset of the first entry in the file and ``count`` the
    number of whole entries in it; the file's queue end is ``base + count``.
    All methods are plain blocking file calls: the engine calls the writing ones
    from its writer thread and the reading ones (pread of page-cache data) from
    the event loop.
    """

    def __init__(self, path: str, fd: int, base: int, count: int) -> None:
        self.path = path
        self.fd = fd
        self.base = base
        self.count = count

    @classmethod
    def open(cls, path: str, base_if_new: int = 0) -> "TopicIndex":
        """Open (or create with ``base_if_new``) the index at ``path``.

        A partial trailing entry is cut off. Raises :class:`IndexError_` if the
        header is not an index header.
        """
        fd = create_file(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                os.pwrite(fd, HEADER.pack(MAGIC, INDEX_VERSION, ENTRY_SIZE, base_if_new), 0)
                return cls(path, fd, base_if_new, 0)
            hdr = os.pread(fd, HEADER_SIZE, 0)
            if len(hdr) < HEADER_SIZE:
                raise IndexError_(f"{path}: short header")
            magic, ver, esize, base = HEADER.unpack(hdr)
            if magic != MAGIC or ver != INDEX_VERSION or esize != ENTRY_SIZE:
                raise IndexError_(f"{path}: not a version-{INDEX_VERSION} index")
            count = (size - HEADER_SIZE) // ENTRY_SIZE
            if HEADER_SIZE + count * ENTRY_SIZE != size:
                os.ftruncate(fd, HEADER_SIZE + count * ENTRY_SIZE)
            return cls(path, fd, base, count)
        except BaseException:
            os.close(fd)
            raise

    @property
    def end(self) -> int:
        """Queue offset after the last entry in the file."""
        return self.base + self.count

    def write_entries(self, first_qoff: int, blob: bytes) -> None:
        """Write packed entries starting at queue offset ``first_qoff`` (pwrite until
        all of them are written: a short write is not an error)."""
        pos = self.entry_pos(first_qoff)
        view = memoryview(blob)
        while view:
            w = os.pwrite(self.fd, view, pos)
            pos += w
            view = view[w:]
        self.wrote(first_qoff, len(blob) // ENTRY_SIZE)

    def entry_pos(self, qoff: int) -> int:
        """File position of queue offset ``qoff``'s entry."""
        return HEADER_SIZE + (qoff - self.base) * ENTRY_SIZE

    def wrote(self, first_qoff: int, n: int) -> None:
        """Count ``n`` entries written from ``first_qoff`` on by someone else (the
        writer's one-call commit, :func:`lockmq._core.commit_write`)."""
        self.count = max(self.count, first_qoff - self.base + n)

    def truncate(self, end_qoff: int) -> None:
        """Drop every entry at or after queue offset ``end_qoff``."""
        keep = max(0, min(self.count, end_qoff - self.base))
        os.ftruncate(self.fd, HEADER_SIZE + keep * ENTRY_SIZE)
        self.count = keep

    def reset(self, base: int) -> None:
        """Empty the file and make its first queue offset ``base``."""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, HEADER.pack(MAGIC, INDEX_VERSION, ENTRY_SIZE, base), 0)
        self.base = base
        self.count = 0

    def read(self, qoff: int, n: int) -> list[tuple[int, int, int]]:
        """Return up to ``n`` entries ``(offset, size, broker_s)`` from queue offset ``qoff``."""
        i = qoff - self.base
        if i < 0:
            raise ValueError(f"queue offset {qoff} is before the index base {self.base}")
        n = min(n, self.count - i)
        if n <= 0:
            return []
        data = os.pread(self.fd, n * ENTRY_SIZE, HEADER_SIZE + i * ENTRY_SIZE)
        return list(ENTRY.iter_unpack(data[:len(data) - len(data) % ENTRY_SIZE]))

    def entry(self, qoff: int) -> tuple[int, int, int]:
        """The entry at queue offset ``qoff`` (must be in the file)."""
        got = self.read(qoff, 1)
        if not got:
            raise ValueError(f"queue offset {qoff} not in index {self.path}")
        return got[0]

    def first_at_or_after(self, commit_offset: int, lo: int | None = None) -> int:
        """Smallest queue offset whose record starts at or after ``commit_offset``
        (``end`` if none). Binary search with one pread per probe."""
        lo = self.base if lo is None else max(lo, self.base)
        hi = self.end
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[0] < commit_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def first_at_or_after_time(self, broker_s: int, lo: int | None = None) -> int:
        """Smallest queue offset whose record arrived at or after ``broker_s``."""
        lo = self.base if lo is None else max(lo, self.base)
        hi = self.end
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[2] < broker_s:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def rebase(self, new_base: int) -> None:
        """Rewrite the file without the entries before ``new_base`` (atomic replace)."""
        if new_base <= self.base:
            return
        new_base = min(new_base, self.end)
        tmp = self.path + ".tmp"
        fd = create_file(tmp, os.O_RDWR | os.O_TRUNC)
        try:
            os.write(fd, HEADER.pack(MAGIC, INDEX_VERSION, ENTRY_SIZE, new_base))
            pos = HEADER_SIZE + (new_base - self.base) * ENTRY_SIZE
            chunk = 1 << 20
            while True:
                data = os.pread(self.fd, chunk, pos)
                if not data:
                    break
                os.write(fd, data)
                pos += len(data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.replace(tmp, self.path)
        old = self.fd
        self.fd = fd
        self.count = self.end - new_base
        self.base = new_base
        os.close(old)

    def sync(self) -> None:
        """fdatasync the file."""
        os.fdatasync(self.fd)

    def close(self) -> None:
        """Close the file descriptor."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
