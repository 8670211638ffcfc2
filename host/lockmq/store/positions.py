"""Per-cluster consume positions: ``consume-<cluster>.log``.

The file is a short log of checksummed snapshots; each save appends one snapshot
and fdatasyncs. Loading takes the last snapshot whose CRC matches, so a crash in
the middle of a save leaves the previous positions. When the file grows past
``compact_bytes`` it is rewritten with only the latest snapshot (atomic replace).

Snapshot: ``length u32 | crc u32 (of the JSON) | JSON {"gen": n, "positions": {topic: offset}}``.
"""

from __future__ import annotations

import json
import os
import struct
import zlib

from .files import atomic_write
from .records import validate_cluster

_HEAD = struct.Struct("<II")


def positions_file_name(cluster: str) -> str:
    """File name of a cluster's positions inside the data directory."""
    return f"consume-{validate_cluster(cluster)}.log"


def _frame(gen: int, positions: dict[str, int]) -> bytes:
    body = json.dumps({"gen": gen, "positions": positions}, separators=(",", ":"),
                      sort_keys=True).encode("utf-8")
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def parse(data: bytes) -> tuple[int, dict[str, int], int]:
    """Return ``(gen, positions, valid_bytes)`` of the last good snapshot in ``data``."""
    pos, gen, positions, good = 0, 0, {}, 0
    while pos + _HEAD.size <= len(data):
        length, crc = _HEAD.unpack_from(data, pos)
        body = data[pos + _HEAD.size:pos + _HEAD.size + length]
        if len(body) != length or zlib.crc32(body) != crc:
            break
        try:
            obj = json.loads(body)
            gen, positions = int(obj["gen"]), {str(k): int(v) for k, v in obj["positions"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            break
        pos += _HEAD.size + length
        good = pos
    return gen, positions, good


class PositionsFile:
    """The positions of one consumer cluster. Not thread-safe: one writer at a time."""

    def __init__(self, data_dir: str, cluster: str, compact_bytes: int = 256 * 1024) -> None:
        self.path = os.path.join(data_dir, positions_file_name(cluster))
        self.compact_bytes = compact_bytes
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        self.gen, self.positions, good = parse(data)
        self._size = good
        self._fd = -1
        if good != len(data):
            # drop a torn last snapshot so that new ones append after a good one
            with open(self.path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())

    def load(self) -> dict[str, int]:
        """The last saved positions (a copy)."""
        return dict(self.positions)

    def save(self, updates: dict[str, int]) -> None:
        """Merge ``updates`` into the positions and make them durable (blocking)."""
        merged = dict(self.positions)
        for topic, off in updates.items():
            if type(off) is not int or off < 0:
                raise ValueError(f"position of {topic!r} must be a non-negative int")
            merged[str(topic)] = off
        gen = self.gen + 1
        frame = _frame(gen, merged)
        if self._size + len(frame) > self.compact_bytes or self._size == 0:
            self._close_fd()
            atomic_write(self.path, frame)
            self._size = len(frame)
        else:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_WRONLY)
            os.pwrite(self._fd, frame, self._size)
            os.fdatasync(self._fd)
            self._size += len(frame)
        self.gen, self.positions = gen, merged

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        """Close the file."""
        self._close_fd()
