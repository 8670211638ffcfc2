"""The broker's read cache returns exactly what the store would."""

from __future__ import annotations

from lockmq.broker.readcache import ReadCache
from lockmq.store import StoredRecord


def _store(start: int, end: int):  # type: ignore[no-untyped-def]
    calls = []

    def read(topic: str, q: int, n: int) -> list[StoredRecord]:
        calls.append((q, n))
        q = max(q, start)
        return [StoredRecord(i * 10, i, topic, "L1", i, 0, 0, None, b"x")
                for i in range(q, min(end, q + n))]
    return read, calls


def test_prefix_from_cache_rest_from_store():
    read, calls = _store(0, 100)
    c = ReadCache(max_records=1000)
    assert [r.queue_offset for r in c.read(read, "t", 0, 10, 0)] == list(range(10))
    got = c.read(read, "t", 5, 10, 0)            # 5..9 cached, 10..14 from the store
    assert [r.queue_offset for r in got] == list(range(5, 15))
    assert calls == [(0, 10), (10, 5)]
    assert c.read(read, "t", 0, 15, 0) == read("t", 0, 15)
    assert c.hits == 20


def test_bounded_and_retention_bypass():
    read, calls = _store(50, 100)
    c = ReadCache(max_records=8)
    c.read(read, "t", 50, 20, 50)
    assert sum(len(d) for d in c._by_topic.values()) == 8
    # below the store's start: straight to the store (it skips to its start)
    assert [r.queue_offset for r in c.read(read, "t", 10, 3, 50)] == [50, 51, 52]
    assert [r.queue_offset for r in c.read(read, "t", 60, 50, 50)] == list(range(60, 100))


def test_not_kept_when_nobody_else_needs_it():
    read, calls = _store(0, 100)
    c = ReadCache(max_records=100)
    c.read(read, "t", 0, 10, 0, keep=False)
    c.read(read, "t", 0, 10, 0)
    assert calls == [(0, 10), (0, 10)] and c.hits == 0
