"""The in-memory state of one topic: its index and its queue bounds."""

from __future__ import annotations

from .index import TopicIndex


class Topic:
    """State of one topic.

    ``next`` belongs to the writer thread (next queue offset to assign); ``end`` and
    ``start`` to the event loop (visible end, first retained queue offset).
    """

    __slots__ = ("name", "name_bytes", "index", "end", "start", "next")

    def __init__(self, name: str, index: TopicIndex) -> None:
        self.name = name
        self.name_bytes = name.encode()   # as its records hold it (the compiled read)
        self.index = index
        self.end = index.end
        self.next = index.end
        self.start = index.base


def first_live(index: TopicIndex, topic: str, log_start: int,
               queue_starts: dict[str, int] | None, lo: int | None = None) -> int:
    """The topic's first queue offset at or after commit-log ``log_start``: the first
    segment's queue-start sidecar says it (checksummed) when it names the topic; else
    a binary search of the index (not checksummed: a damaged entry could mislead it)."""
    q = None if queue_starts is None else queue_starts.get(topic)
    if q is not None and index.base <= q <= index.end:
        return q
    if not index.count:
        return index.end
    return index.first_at_or_after(log_start, lo=lo)
