"""A small cache of decoded records for topics that several clusters read.

Every cluster on a topic reads each record of it (publish/subscribe), and live
clusters read the same tail at nearly the same time; decoding a record in the store
(``Store.read``: pread, checksum, header, JSON headers) is the largest part of the
broker's cost per delivered message. The first cluster's read fills this cache, the
others are served from it. A topic with one cluster does not use it (nothing would
ever hit).

Records are immutable once durable, so a cached record never goes stale; offsets
below the store's ``queue_start`` (removed by retention) are never served from here.
Memory is bounded by ``max_records`` over all topics (oldest insertions go first).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from lockmq.store import StoredRecord

#: records held over all topics (~0.3 KB each for small lock events)
DEFAULT_MAX_RECORDS = 32_768

Reader = Callable[[str, int, int], list[StoredRecord]]


class ReadCache:
    """Decoded records by ``(topic, queue_offset)``; see the module docstring."""

    def __init__(self, max_records: int = DEFAULT_MAX_RECORDS) -> None:
        self.max_records = max_records
        self._by_topic: dict[str, dict[int, StoredRecord]] = {}
        self._order: deque[tuple[str, int]] = deque()   # insertion order, for eviction
        self.hits = 0
        self.misses = 0

    def read(self, reader: Reader, topic: str, queue_offset: int, max_count: int,
             queue_start: int, keep: bool = True) -> list[StoredRecord]:
        """Up to ``max_count`` records of ``topic`` from ``queue_offset``: the cached
        prefix, then ``reader`` (the store) for the rest, which is cached if ``keep``
        (another reader will want it)."""
        if queue_offset < queue_start:           # retention moved the start: ask the store
            return reader(topic, queue_offset, max_count)
        cached = self._by_topic.get(topic)
        out: list[StoredRecord] = []
        if cached:
            get = cached.get
            q = queue_offset
            end = queue_offset + max_count
            while q < end:
                rec = get(q)
                if rec is None:
                    break
                out.append(rec)
                q += 1
            self.hits += len(out)
            if len(out) == max_count:
                return out
        rest = reader(topic, queue_offset + len(out), max_count - len(out))
        self.misses += len(rest)
        if keep:
            self._add(topic, rest)
        return out + rest if out else rest

    def _add(self, topic: str, recs: list[StoredRecord]) -> None:
        if not recs or self.max_records <= 0:
            return
        cached = self._by_topic.setdefault(topic, {})
        order = self._order
        for rec in recs:
            q = rec.queue_offset
            if q not in cached:
                cached[q] = rec
                order.append((topic, q))
        while len(order) > self.max_records:
            t, q = order.popleft()
            d = self._by_topic.get(t)
            if d is not None:
                d.pop(q, None)
                if not d:
                    del self._by_topic[t]
