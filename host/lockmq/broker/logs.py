"""The broker's counters (:class:`Stats`), exposed by the ``stats`` admin op and the
status page, beside its structured log.

The log itself (:class:`~lockmq.eventlog.EventLog`: one line per event, kv or JSON,
stderr or a rotatable file) lives in :mod:`lockmq.eventlog`, below the broker, so the
registry server and a standby write the same lines without importing the broker; it
is named here too because every broker module takes both from this one place.
"""

from __future__ import annotations

import time
from typing import Any

from lockmq.eventlog import EventLog, EventLogHandler

from .counters import COUNTERS
from .latency import Latencies

__all__ = ["EventLog", "EventLogHandler", "Stats"]


class Stats:
    """The broker's counters (monotonic) and gauges (set by the broker)."""

    def __init__(self) -> None:
        #: every counter of the one registry (lockmq.broker.counters, which /metrics
        #: reads too), at 0 from the start
        self.c: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.started = time.time()
        #: the latency histograms (publish->ack, publish->deliver, command round trip)
        self.latency = Latencies()

    def inc(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` (one of lockmq.broker.counters.COUNTERS)."""
        self.c[name] = self.c.get(name, 0) + n

    def snapshot(self) -> dict[str, Any]:
        """The counters plus uptime."""
        out: dict[str, Any] = dict(self.c)
        out["uptime_s"] = round(time.time() - self.started, 3)
        return out
