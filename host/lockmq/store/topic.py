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
