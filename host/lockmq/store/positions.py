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

import errno
import json
import os
import struct
import threading
import zlib
from typing import Any

from .errors import StoreFull
from .files import atomic_write, fsync_dir, read_file, seal, unseal
from .names import POSITIONS_COPY, positions_file_name
from .records import validate_cluster

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

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


def _frame_at(data: bytes, pos: int) -> tuple[dict[str, Any], int] | None:
    """The snapshot at ``data[pos:]`` and where it ends, or None if it is not one."""
    if pos + _HEAD.size > len(data):
        return None
    length, crc = _HEAD.unpack_from(data, pos)
    body = data[pos + _HEAD.size:pos + _HEAD.size + length]
    if len(body) != length or zlib.crc32(body) != crc:
        return None
    try:
        obj = json.loads(body)
        snap = {"gen": int(obj["gen"]),
                "positions": {str(k): int(v) for k, v in obj["positions"].items()},
                "meta": {k: str(obj[k]) for k in META_KEYS if isinstance(obj.get(k), str)},
                "counters": {k: int((obj.get("counters") or {})[k]) for k in COUNTER_KEYS
                             if k in (obj.get("counters") or {})}}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return snap, pos + _HEAD.size + length


def parse_full(data: bytes) -> tuple[dict[str, Any] | None, int, int]:
    """``(latest snapshot or None, valid_end, damaged_bytes)`` of a positions file.

    Snapshots are read in order; past a damaged one the next intact one is searched
    for (a JSON body starts with ``{``), so a flipped byte in the middle costs no
    later save. ``valid_end`` is where the last intact snapshot ends (what follows is
    a torn save); ``damaged_bytes`` counts the unreadable bytes before it."""
    pos, best, good, damaged = 0, None, 0, 0
    while pos + _HEAD.size <= len(data):
        got = _frame_at(data, pos)
        if got is not None:
            snap, nxt = got
            if best is None or snap["gen"] >= best["gen"]:
                best = snap
            damaged += pos - good
            pos = good = nxt
            continue
        nxt = data.find(b"{", pos + _HEAD.size + 1)
        while nxt >= 0 and _frame_at(data, nxt - _HEAD.size) is None:
            nxt = data.find(b"{", nxt + 1)
        if nxt < 0:
            break
        pos = nxt - _HEAD.size
    return best, good, damaged


def parse_meta(data: bytes) -> tuple[int, dict[str, int], dict[str, str], dict[str, int], int]:
    """Return ``(gen, positions, meta, counters, valid_bytes)`` of the last good
    snapshot; ``meta`` holds ``owner`` and ``topic``, ``counters`` the
    :data:`COUNTER_KEYS`, when the snapshot has them."""
    snap, good, _damaged = parse_full(data)
    if snap is None:
        return 0, {}, {}, {}, good
    return snap["gen"], snap["positions"], snap["meta"], snap["counters"], good


def load_copy(data_dir: str) -> dict[str, dict[str, Any]] | None:
    """The second copy of every cluster's positions (``positions.copy``): ``{cluster:
    {"gen", "positions", "meta", "counters"}}``; None if missing or damaged."""
    blob = read_file(os.path.join(data_dir, POSITIONS_COPY))
    data = None if blob is None else unseal(blob)
    if data is None:
        return None
    try:
        raw = json.loads(data)
        return {str(k): {"gen": int(v["gen"]), "positions": dict(v["positions"]),
                         "meta": dict(v.get("meta") or {}),
                         "counters": dict(v.get("counters") or {})} for k, v in raw.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def save_copy(data_dir: str, copy: dict[str, dict[str, Any]]) -> None:
    """Write the second copy durably (atomic replace)."""
    body = json.dumps(copy, sort_keys=True, separators=(",", ":")).encode()
    atomic_write(os.path.join(data_dir, POSITIONS_COPY), seal(body))


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
        snap, good, damaged = parse_full(data)
        #: what the file was like when opened: "missing", "ok", "torn" (a save cut
        #: short at its end), "damaged" (unreadable bytes before a good snapshot) or
        #: "unreadable" (no good snapshot at all)
        self.state = "missing" if not data else "unreadable" if snap is None else \
            "damaged" if damaged else "torn" if good != len(data) else "ok"
        self.damaged_bytes = damaged if snap is not None else len(data)
        if snap is None:
            self.gen, self.positions, self.meta, self.counters = 0, {}, {}, {}
        else:
            self.gen, self.positions = snap["gen"], snap["positions"]
            self.meta, self.counters = snap["meta"], snap["counters"]
        self._size = good
        self._fd = -1
        if self.state == "torn":
            # drop a torn last snapshot so that new ones append after a good one
            with open(self.path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())
        elif self.state == "damaged":
            self._size = 0   # the next save rewrites the file with its latest state only

    def snapshot(self) -> dict[str, Any]:
        """The saved state, for the second copy."""
        with self._lock:
            return {"gen": self.gen, "positions": dict(self.positions),
                    "meta": dict(self.meta), "counters": dict(self.counters)}

    def restore(self, snap: dict[str, Any]) -> None:
        """Write ``snap`` (from the second copy) as the file's state."""
        with self._lock:
            self.gen = int(snap["gen"]) - 1
            self.positions, self.meta, self.counters = {}, {}, {}
            self._size = 0
        self.save({str(k): int(v) for k, v in snap["positions"].items()},
                  {k: v for k, v in snap["meta"].items() if k in META_KEYS},
                  {k: int(v) for k, v in snap["counters"].items() if k in COUNTER_KEYS})

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
            try:
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
            except OSError as exc:
                if exc.errno in _NO_SPACE:   # the saved state is the previous one
                    raise StoreFull(f"cannot save the positions of {self.path}: "
                                    f"disk full ({exc})") from exc
                raise
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
