"""Quarantined damage: commit-log ranges that failed their checksum (or are gone).

A record that fails its CRC anywhere but at the very end of the active segment is
*damage*, not a torn write: recovery never cuts the intact records after it. The
damaged bytes stay where they are (offsets never move), their range is written to the
``damage`` file of the data directory, and every reader asks :class:`DamageMap`
before serving an index entry: an entry whose offset lies in a damaged range is
never served (its queue offset stays taken, so later queue offsets and the consume
positions that refer to them do not move). ``lockmq store damage DIR`` lists the
ranges and ``lockmq store salvage`` copies their bytes out.

Found in two ways: by recovery at open (the log it scans) and by a read that meets a
bad checksum before the checkpoint (recovery trusts that part of the log, so a flipped
byte there shows at the first read). Both are persisted here, logged and counted.
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .files import atomic_write, read_file, seal, unseal
from .names import DAMAGE as DAMAGE_FILE   # sealed JSON: the list of ranges, then its CRC


@dataclass
class Damage:
    """One quarantined commit-log range ``[start, end)``.

    Attributes:
        start, end: commit-log offsets of the damaged bytes.
        segment: base offset of the segment holding them.
        reason: what was wrong ("checksum mismatch", "missing: ...").
        records: how many records the range held, as far as can be told (``-1``:
            unknown, e.g. a length field was damaged too).
        topics: ``{topic: [queue offsets]}`` of the damaged records whose topic is
            known (from the index, the next segment's queue start or the header).
        acked: ``"yes"`` (the checkpoint or a read proved it durable: acknowledged in
            ``sync`` mode), ``"probably"`` (a closed segment), ``"unknown"`` (the
            active segment after the last checkpoint: may be a torn, unacked write).
        found: ``"recovery"`` or ``"read"``; ``found_ms``: when (wall clock).
    """

    start: int
    end: int
    segment: int
    reason: str
    records: int = -1
    topics: dict[str, list[int]] = field(default_factory=dict)
    acked: str = "unknown"
    found: str = "recovery"
    found_ms: int = 0

    def describe(self) -> str:
        """One line for logs and the CLI."""
        qs = "; ".join(f"{t} queue offsets {_ranges(q)}" for t, q in sorted(self.topics.items()))
        n = "unknown number of" if self.records < 0 else str(self.records)
        return (f"segment {self.segment}: bytes [{self.start}, {self.end}) ({self.end - self.start}"
                f" bytes, {n} records): {self.reason}; acknowledged: {self.acked}"
                f"{'; ' + qs if qs else ''}")

    def queue_offsets(self) -> int:
        """How many queue offsets (of known topics) the range took."""
        return sum(len(q) for q in self.topics.values())


def _ranges(qs: list[int]) -> str:
    out = []
    for q in sorted(qs):
        if out and out[-1][1] == q:
            out[-1][1] = q + 1
        else:
            out.append([q, q + 1])
    return ", ".join(str(a) if b == a + 1 else f"{a}-{b - 1}" for a, b in out)


class DamageMap:
    """The damaged ranges of one store, sorted by start, with the ``damage`` file."""

    def __init__(self, data_dir: str, items: list[Damage] | None = None) -> None:
        self.path = os.path.join(data_dir, DAMAGE_FILE)
        self.items: list[Damage] = sorted(items or [], key=lambda d: d.start)
        self._starts = [d.start for d in self.items]

    @classmethod
    def load(cls, data_dir: str) -> "DamageMap":
        """The saved ranges (none if the file is missing or unreadable)."""
        return cls(data_dir, load_items(data_dir))

    def __bool__(self) -> bool:
        return bool(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def at(self, offset: int) -> Damage | None:
        """The range holding commit-log ``offset`` (None if it is not damaged)."""
        k = bisect.bisect_right(self._starts, offset) - 1
        if k >= 0 and offset < self.items[k].end:
            return self.items[k]
        return None

    def overlaps(self, lo: int, hi: int) -> bool:
        """True if any range meets ``[lo, hi)``."""
        k = bisect.bisect_right(self._starts, hi - 1) - 1
        return hi > lo and k >= 0 and self.items[k].end > lo

    def add(self, d: Damage) -> bool:
        """Add a range unless one already holds its start; True if added."""
        if self.at(d.start) is not None:
            return False
        k = bisect.bisect_right(self._starts, d.start)
        self.items.insert(k, d)
        self._starts.insert(k, d.start)
        return True

    def forget_before(self, offset: int) -> None:
        """Drop ranges that end at or before ``offset`` (retention deleted them)."""
        keep = [d for d in self.items if d.end > offset]
        if len(keep) != len(self.items):
            self.items = keep
            self._starts = [d.start for d in keep]

    def save(self) -> None:
        """Write the ranges durably (atomic replace); no file when there are none."""
        if not self.items:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            return
        body = json.dumps([asdict(d) for d in self.items], sort_keys=True).encode()
        atomic_write(self.path, seal(body))


def load_items(data_dir: str) -> list[Damage]:
    """The ranges in ``data_dir``'s damage file ([] if missing or unreadable)."""
    path = os.path.join(data_dir, DAMAGE_FILE)
    blob = read_file(path)
    if blob is None:
        return []
    data = unseal(blob)
    try:
        raw: Any = json.loads(data) if data is not None else None
        return [Damage(**d) for d in raw]
    except (TypeError, ValueError):
        return []
