"""Worker-pool sizing from the backlog: the paper's dynamically scaled consumer cluster.

The paper (§2.1.3) lets a topic's consumer cluster grow when producers burst and
shrink when the queue drains. Here that decision is a small pure object, fed the
cluster's backlog (messages waiting in the topic queue for this cluster) and how
many of this consumer's workers are busy, with the clock injected so tests need no
sleeping:

* **grow** at once when the backlog per worker exceeds ``target_per_worker`` (at
  most doubling per step, so a brief spike does not spawn ``max`` threads);
* **shrink** by one worker when the pool has had idle workers for
  ``idle_shrink_s`` seconds, never below ``min_workers``.
"""

from __future__ import annotations

import math


class Autoscaler:
    """Decide how many workers a consumer should run.

    Args:
        min_workers: never fewer (>= 1).
        max_workers: never more (>= min_workers).
        target_per_worker: backlog each worker is expected to absorb before
            another worker is worth starting.
        idle_shrink_s: how long workers must have been idle before one is retired.
    """

    def __init__(
        self,
        min_workers: int = 1,
        max_workers: int = 8,
        target_per_worker: int = 100,
        idle_shrink_s: float = 5.0,
    ) -> None:
        if min_workers < 1:
            raise ValueError("min_workers must be >= 1")
        if max_workers < min_workers:
            raise ValueError("max_workers must be >= min_workers")
        if target_per_worker < 1:
            raise ValueError("target_per_worker must be >= 1")
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.target_per_worker = target_per_worker
        self.idle_shrink_s = idle_shrink_s
        self._idle_since: float | None = None

    def clamp(self, n: int) -> int:
        """``n`` limited to ``[min_workers, max_workers]``."""
        return max(self.min_workers, min(self.max_workers, n))

    def decide(self, current: int, backlog: int, busy: int, now: float) -> int:
        """Return the worker count to run from now on.

        Args:
            current: workers running now.
            backlog: messages waiting for the cluster (the broker's lag figure).
            busy: workers of this consumer handling a message at this moment.
            now: a monotonic clock reading in seconds.
        """
        current = self.clamp(current)
        wanted = self.clamp(math.ceil(backlog / self.target_per_worker))
        if wanted > current:
            self._idle_since = None
            return min(wanted, current * 2)
        if backlog > 0 and busy >= current:
            # Everyone is busy and work is waiting: not the moment to shrink.
            self._idle_since = None
            return current
        if current > wanted and busy < current:
            if self._idle_since is None:
                self._idle_since = now
            elif now - self._idle_since >= self.idle_shrink_s:
                self._idle_since = now
                return current - 1
            return current
        self._idle_since = None
        return current
