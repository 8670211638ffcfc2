"""Latency histograms the broker keeps (exported as Prometheus histograms).

Three, in seconds, each observed where the event ends:

* ``publish_ack``: a publish batch handed to the store until its acks are written
  (the durable path: group commit, fsync, replication when sync) -- one
  observation per record;
* ``publish_deliver``: a record stored until it is first delivered to a consumer
  (the consumers' lag as time; retries and redeliveries are not counted);
* ``command_round_trip``: a downlink command sent to a lock until its result.

Cheap on the hot path: a bucket index found by :func:`bisect.bisect_left`, two
additions. Counts are cumulative from the broker's start, as Prometheus wants.
"""

from __future__ import annotations

from bisect import bisect_left

#: bucket upper bounds in seconds: 0.25 ms to 60 s (fsync ~0.2 ms .. a slow consumer)
BUCKETS_S: tuple[float, ...] = (
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)


class Histogram:
    """Counts per bucket (the last one is +Inf), the sum and the count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...] = BUCKETS_S) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float, n: int = 1) -> None:
        """``n`` events that each took ``seconds``."""
        if seconds < 0.0:
            seconds = 0.0
        self.counts[bisect_left(self.bounds, seconds)] += n
        self.sum += seconds * n
        self.count += n

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative ``(le, count)`` pairs, ``+Inf`` last (prometheus_client's shape)."""
        out, total = [], 0
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), self.counts):
            total += n
            out.append((bound, total))
        return out


class Latencies:
    """The broker's three histograms (see the module docstring)."""

    HELP = {
        "publish_ack": "Seconds from a publish handed to the store to its ack written "
                       "(durable, replicated when sync)",
        "publish_deliver": "Seconds from a record stored to its first delivery to a consumer",
        "command_round_trip": "Seconds from a downlink command sent to a lock to its result",
    }

    def __init__(self) -> None:
        self.publish_ack = Histogram()
        self.publish_deliver = Histogram()
        self.command_round_trip = Histogram()

    def items(self) -> list[tuple[str, Histogram]]:
        """``(name, histogram)`` of each."""
        return [(name, getattr(self, name)) for name in self.HELP]
