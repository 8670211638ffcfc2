"""Per-cluster consume positions: ``consume-<cluster>.log``.

The file is a short log of checksummed snapshots; each save appends one snapshot
and fdatasyncs. Loading takes the last snapshot whose CRC matches, so a crash in
the middle of a save leaves the previous positions. When the file grows past
``compact_bytes`` it is rewritten with only the latest snapshot (atomic replace).

Snapshot: ``length u32 | crc u32 (of the JSON) | JSON {"gen": n, "positions": {topic: offset},
"owner": "token:billing", "topic": "lock.events", "counters": {"last_active_ms": ...,
"skipped": ...}}``. ``owner`` (who created the cluster: only that principal, or an admin,
may join it), ``topic`` (the topic the cluster is bound to) and ``counters`` (when the
cluster was last used, for its expiry, and how many messages retention made it skip)
are optional: files written before they existed have none of them.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from typing import Any

from .files import atomic_write, fsync_dir
from .names import positions_file_name
from .records import validate_cluster

_HEAD = struct.Struct("<II")
#: What a snapshot may carry besides the positions.
META_KEYS = ("owner", "topic")
#: The integer counters a snapshot may carry (kept by later saves, like the metadata).
COUNTER_KEYS = ("last_active_ms", "skipped")


def _frame(gen: int, positions: dict[str, int], meta: dict[str, str] | None = None,
           counters: dict[str, int] | None = None) -> bytes:
    obj: dict[str, Any] = {"gen": gen, "positions": positions}
    if meta:
        obj.update(meta)
    if counters:
        obj["counters"] = counters
    body = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def parse(data: bytes) -> tuple[int, dict[str, int], int]:
    """Return ``(gen, positions, valid_bytes)`` of the last good snapshot in ``data``."""
    gen, positions, _meta, _counters, good = parse_meta(data)
    return gen, positions, good


def parse_meta(data: bytes) -> tuple[int, dict[str, int], dict[str, str], dict[str, int], int]:
    """Return ``(gen, positions, meta, counters, valid_bytes)`` of the last good
    snapshot; ``meta`` holds ``owner`` and ``topic``, ``counters`` the
    :data:`COUNTER_KEYS`, when the snapshot has them."""
    pos, gen, positions, meta, counters, good = 0, 0, {}, {}, {}, 0
    while pos + _HEAD.size <= len(data):
        length, crc = _HEAD.unpack_from(data, pos)
        body = data[pos + _HEAD.size:pos + _HEAD.size + length]
        if len(body) != length or zlib.crc32(body) != crc:
            break
        try:
            obj = json.loads(body)
            gen, positions = int(obj["gen"]), {str(k): int(v) for k, v in obj["positions"].items()}
            meta = {k: str(obj[k]) for k in META_KEYS if isinstance(obj.get(k), str)}
            saved = obj.get("counters") or {}
            counters = {k: int(saved[k]) for k in COUNTER_KEYS if k in saved}
        except (ValueError, KeyError, TypeError, AttributeError):
            break
        pos += _HEAD.size + length
        good = pos
    return gen, positions, meta, counters, good


class PositionsFile:
    """The positions of one consumer cluster. Not thread-safe: one writer at a time."""

    def __init__(self, data_dir: str, cluster: str, compact_bytes: int = 256 * 1024) -> None:
        self.path = os.path.join(data_dir, positions_file_name(validate_cluster(cluster)))
        self.compact_bytes = compact_bytes
        # saves come from the positions thread and (claims) from the event loop
        self._lock = threading.Lock()
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        self.exists = bool(data)
        self.gen, self.positions, self.meta, self.counters, good = parse_meta(data)
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

    def save(self, updates: dict[str, int], meta: dict[str, str] | None = None,
             counters: dict[str, int] | None = None) -> None:
        """Merge ``updates`` (and ``meta``: ``owner``, ``topic``; ``counters``:
        :data:`COUNTER_KEYS`) into the saved state and make it durable (blocking).
        Metadata and counters once saved are kept by later saves."""
        with self._lock:
            merged = dict(self.positions)
            for topic, off in updates.items():
                if type(off) is not int or off < 0:
                    raise ValueError(f"position of {topic!r} must be a non-negative int")
                merged[str(topic)] = off
            new_meta = dict(self.meta)
            for k, v in (meta or {}).items():
                if k not in META_KEYS or not isinstance(v, str):
                    raise ValueError(f"positions metadata: unknown key {k!r} or not a string")
                new_meta[k] = v
            new_counters = dict(self.counters)
            for k, n in (counters or {}).items():
                if k not in COUNTER_KEYS or type(n) is not int:
                    raise ValueError(f"positions counters: unknown key {k!r} or not an int")
                new_counters[k] = n
            gen = self.gen + 1
            frame = _frame(gen, merged, new_meta, new_counters)
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
            self.gen, self.positions, self.meta = gen, merged, new_meta
            self.counters = new_counters
            self.exists = True

    def delete(self) -> None:
        """Remove the file (the cluster is forgotten: positions, owner, topic)."""
        with self._lock:
            self._close_fd()
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            fsync_dir(os.path.dirname(self.path) or ".")
            self.gen, self.positions, self.meta, self._size = 0, {}, {}, 0
            self.counters = {}
            self.exists = False

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        """Close the file."""
        self._close_fd()
