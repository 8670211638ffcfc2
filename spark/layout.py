"""The commit-log layout on disk (host/lockmq/store/FORMAT.md), as seen by a reader.

Names and the record header come from the store itself (``lockmq.store.names``,
``lockmq.store.records``); this module adds what a reader of copied logs needs.

Finds the logs under a path (a broker data directory, an export, or a folder of
exports from many gateways), lists their segments, and reads the identity of the
gateway that wrote them. Pure Python: no JVM, no numpy.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass

# The store's own format definitions (light modules: no broker, no threads started)
from lockmq.store.names import SEGMENT_DIR, segment_base
from lockmq.store.records import HEADER_SIZE

#: Smallest legal value of the ``length`` field (the fixed header after it).
MIN_LENGTH = HEADER_SIZE - 4
MANIFEST = "manifest.json"
_LEN = struct.Struct("<I")
_LEN_CRC = struct.Struct("<II")
#: Identity files a broker data directory may carry (first found wins).
IDENTITY_FILES = ("broker.json", "identity.json", "broker-id")


@dataclass(frozen=True)
class Segment:
    """One segment file of a log."""

    path: str
    base: int
    size: int

    @property
    def end(self) -> int:
        """Log offset just past the last byte present in the file."""
        return self.base + self.size


@dataclass(frozen=True)
class Log:
    """One commit log: its key (path relative to the load root), folder and gateway."""

    key: str
    directory: str
    gateway_id: str | None

    def segments(self) -> list[Segment]:
        """The segment files present now, oldest first."""
        return list_segments(self.directory)


def list_segments(directory: str) -> list[Segment]:
    """List ``<directory>/message.log/*.log`` (or ``directory`` itself if it holds segments)."""
    seg_dir = os.path.join(directory, SEGMENT_DIR)
    if not os.path.isdir(seg_dir):
        seg_dir = directory
    out: list[Segment] = []
    try:
        names = os.listdir(seg_dir)
    except FileNotFoundError:
        return out
    for name in names:
        base = segment_base(name)
        if base is None:
            continue
        path = os.path.join(seg_dir, name)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:  # deleted by retention while we listed
            continue
        out.append(Segment(path, base, size))
    out.sort(key=lambda s: s.base)
    return out


def read_identity(directory: str) -> dict:
    """The export manifest or broker identity file of a log folder ({} if none)."""
    for name in (MANIFEST, *IDENTITY_FILES):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            raw = f.read()
        try:
            doc = json.loads(raw)
        except ValueError:
            text = raw.decode("utf-8", "replace").strip()
            return {"broker_id": text, "gateway_id": text} if text else {}
        return doc if isinstance(doc, dict) else {}
    return {}


def gateway_of(directory: str) -> str | None:
    """Gateway id of a log folder: manifest ``gateway_id``, else broker identity."""
    ident = read_identity(directory)
    for key in ("gateway_id", "gateway", "broker_id", "id"):
        value = ident.get(key)
        if value:
            return str(value)
    return None


def _is_log_dir(directory: str) -> bool:
    if os.path.isdir(os.path.join(directory, SEGMENT_DIR)):
        return True
    try:
        return any(segment_base(n) is not None for n in os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return False


def find_logs(root: str, gateway_id: str | None = None, max_depth: int = 4) -> list[Log]:
    """Find the logs under ``root``: itself if it is a log, else sub-folders (depth-bounded).

    ``gateway_id`` overrides the identity read from each log's manifest.
    Raises ``FileNotFoundError`` if ``root`` does not exist.
    """
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"lockmq: no such log directory: {root}")
    found: list[str] = []
    stack = [(root, 0)]
    while stack:
        d, depth = stack.pop()
        if _is_log_dir(d):
            found.append(d)
            continue
        if depth >= max_depth:
            continue
        try:
            subs = sorted(e.path for e in os.scandir(d) if e.is_dir() and not e.name.startswith((".", "_")))
        except FileNotFoundError:
            continue
        stack.extend((s, depth + 1) for s in reversed(subs))
    logs = []
    for d in sorted(found):
        key = os.path.relpath(d, root)
        logs.append(Log(key, d, gateway_id or gateway_of(d)))
    return logs


def walk_boundaries(
    buf: bytes | memoryview, start: int, end: int, every: int = 0, max_records: int = -1
) -> tuple[int, int, list[int], int]:
    """Walk record lengths from ``start`` (a record boundary) without checking CRCs.

    Stops at ``end``, at a record that does not fit before ``end`` (torn), at a zero
    length (unwritten tail) or after ``max_records`` records. Returns
    ``(stop_position, records_walked, cut_points, last_record_start)`` where
    ``cut_points`` holds a record boundary roughly every ``every`` bytes (none if
    ``every`` is 0).
    """
    unpack = _LEN.unpack_from
    pos = start
    n = 0
    cuts: list[int] = []
    next_cut = start + every if every else end + 1
    limit = end - 4
    last = start
    while pos <= limit and n != max_records:
        (length,) = unpack(buf, pos)
        if length < MIN_LENGTH:
            break
        nxt = pos + 4 + length
        if nxt > end:
            break
        last = pos
        pos = nxt
        n += 1
        if pos >= next_cut and pos < end:
            cuts.append(pos)
            next_cut = pos + every
    return pos, n, cuts, last


def record_ok(buf: bytes | memoryview, pos: int, end: int) -> bool:
    """True if a complete record with a matching CRC starts at ``pos``."""
    if pos + HEADER_SIZE > end:
        return False
    length, crc = _LEN_CRC.unpack_from(buf, pos)
    if length < MIN_LENGTH or pos + 4 + length > end:
        return False
    return zlib.crc32(memoryview(buf)[pos + 8 : pos + 4 + length]) == crc


def complete_end(buf: bytes | memoryview, start: int, end: int) -> int:
    """Position just past the last complete record in ``[start, end)`` of a live segment.

    The last record is included only if its CRC matches: a record whose bytes are
    still being written is left for a later read.
    """
    stop, n, _, last = walk_boundaries(buf, start, end)
    if n == 0:
        return start
    return stop if record_ok(buf, last, stop) else last
