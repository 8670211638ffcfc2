"""Retention: which closed segments go, and deleting them.

Two limits, checked oldest segment first (the active segment is never deleted),
and both win over consumer clusters, as in Kafka and RocketMQ -- retention can never
fill the disk because a cluster stopped reading:

* age (``retention_ms``): a closed segment whose newest write is older goes;
* size (``retention_bytes``): while the log is larger, the oldest segment goes.

A cluster that had not read the deleted records skips forward to the new start (the
broker moves it; see ``BrokerCore.enforce_retention``); the store counts, per topic,
the records that were deleted before the slowest cluster read them.

:func:`select` decides and :func:`enforce` deletes, so a new rule changes one function.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .config import StoreConfig
from .segment import SegmentList
from .topic import Topic, first_live

log = logging.getLogger("lockmq.store")


@dataclass
class RetentionReport:
    """What :meth:`Store.enforce_retention` deleted.

    ``skipped_records`` counts, per topic, the deleted records that the slowest
    consumer cluster (``needed``) had not read yet: that cluster skips them.
    """

    deleted_segments: list[int] = field(default_factory=list)
    deleted_bytes: int = 0
    skipped_records: dict[str, int] = field(default_factory=dict)
    log_start: int = 0
    log_bytes: int = 0


def select(config: StoreConfig, segments: SegmentList, log_end: int, now_ms: float) -> int:
    """How many of the oldest segments to delete (never the active one)."""
    max_age = config.limit("retention_ms")
    max_bytes = config.limit("retention_bytes")
    bases = segments.bases
    k = 0  # segments [0, k) get deleted
    while k < len(bases) - 1:
        too_old = max_age is not None and segments[k].mtime_ms() < now_ms - max_age
        too_big = max_bytes is not None and log_end - bases[k] > max_bytes
        if not (too_old or too_big):
            break
        k += 1
    return k


def enforce(config: StoreConfig, segments: SegmentList, topics: dict[str, Topic],
            log_end: int, needed: dict[str, int], now_ms: float) -> RetentionReport:
    """Delete the segments :func:`select` picks and move each topic's start past them."""
    rep = RetentionReport()
    k = select(config, segments, log_end, now_ms)
    if k:
        new_start = segments.bases[k]
        for base, size in segments.delete_oldest(k):
            rep.deleted_segments.append(base)
            rep.deleted_bytes += size
        qs = segments.first.read_qstart()
        for name, t in topics.items():
            old = t.start
            t.start = max(t.start, first_live(t.index, name, new_start, qs, lo=t.start))
            q = needed.get(name)
            if q is not None and q < t.start:
                rep.skipped_records[name] = t.start - max(q, old)
        log.info("store: retention deleted %d segments (%d bytes)%s",
                 len(rep.deleted_segments), rep.deleted_bytes,
                 f"; unread records skipped per topic: {rep.skipped_records}"
                 if rep.skipped_records else "")
    rep.log_start, rep.log_bytes = segments.start, log_end - segments.start
    return rep
