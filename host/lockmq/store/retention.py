"""Retention: which closed segments go, and deleting them.

Two limits, checked oldest segment first (the active segment is never deleted):

* age (``retention_ms``): a segment whose newest write is older goes, unless a
  consumer cluster still needs a record in it (``protect``);
* size (``retention_bytes``): while the log is larger, the oldest segment goes even
  if a cluster needs it; the records lost that way are counted per topic.

:func:`select` decides and :func:`enforce` deletes, so a new rule (another limit, or
moving lagging clusters forward instead of protecting them) changes one function.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .config import StoreConfig
from .segment import SegmentList
from .topic import Topic

log = logging.getLogger("lockmq.store")


@dataclass
class RetentionReport:
    """What :meth:`Store.enforce_retention` deleted.

    ``forced_segments`` were deleted by the size limit although a cluster still
    needed records in them; ``forced_records`` counts, per topic, the needed
    records that were lost that way.
    """

    deleted_segments: list[int] = field(default_factory=list)
    deleted_bytes: int = 0
    forced_segments: list[int] = field(default_factory=list)
    forced_records: dict[str, int] = field(default_factory=dict)
    log_start: int = 0
    log_bytes: int = 0


def protected_offset(topics: dict[str, Topic], needed: dict[str, int], log_end: int) -> int:
    """Commit-log offset of the oldest record a cluster still needs (``log_end`` if none)."""
    protect = log_end
    for topic, q in needed.items():
        t = topics.get(topic)
        if t is None or q >= t.end:
            continue
        q = max(q, t.start, t.index.base)
        protect = min(protect, t.index.entry(q)[0])
    return protect


def select(config: StoreConfig, segments: SegmentList, log_end: int, protect: int,
           now_ms: float, rep: RetentionReport) -> int:
    """How many of the oldest segments to delete; size-forced ones go in ``rep``."""
    bases = segments.bases
    k = 0  # segments [0, k) get deleted
    while k < len(bases) - 1:
        old = (config.retention_ms is not None
               and segments[k].mtime_ms() < now_ms - config.retention_ms)
        if old and bases[k + 1] <= protect:
            k += 1
            continue
        break
    if config.retention_bytes is not None:
        while k < len(bases) - 1 and log_end - bases[k] > config.retention_bytes:
            if bases[k + 1] > protect:
                rep.forced_segments.append(bases[k])
            k += 1
    return k


def enforce(config: StoreConfig, segments: SegmentList, topics: dict[str, Topic],
            log_end: int, needed: dict[str, int], now_ms: float) -> RetentionReport:
    """Delete the segments :func:`select` picks and move each topic's start past them."""
    rep = RetentionReport()
    protect = protected_offset(topics, needed, log_end)
    k = select(config, segments, log_end, protect, now_ms, rep)
    if k:
        new_start = segments.bases[k]
        if rep.forced_segments:
            _count_forced(topics, needed, new_start, rep)
        for base, size in segments.delete_oldest(k):
            rep.deleted_segments.append(base)
            rep.deleted_bytes += size
        for t in topics.values():
            t.start = t.index.first_at_or_after(new_start, lo=t.start)
        log.info("store: retention deleted %d segments (%d bytes)", len(rep.deleted_segments),
                 rep.deleted_bytes)
    rep.log_start, rep.log_bytes = segments.start, log_end - segments.start
    return rep


def _count_forced(topics: dict[str, Topic], needed: dict[str, int], new_start: int,
                  rep: RetentionReport) -> None:
    """Count, per topic, the needed records before ``new_start`` (about to be lost)."""
    for topic, q in needed.items():
        t = topics.get(topic)
        if t is None or q >= t.end:
            continue
        lost = t.index.first_at_or_after(new_start, lo=max(q, t.start)) - max(q, t.start)
        if lost > 0:
            rep.forced_records[topic] = lost
    log.warning("store: size limit deleted segments %s still needed by consumers; "
                "records lost per topic: %s", rep.forced_segments, rep.forced_records)
