"""Reconnect delays: exponential backoff with jitter.

A thousand clients that lose the broker at the same moment must not all come back
at the same moment (umqtt.robust's fixed 2 s retry is the storm to avoid).
"""

from __future__ import annotations

import random


class Backoff:
    """Successive delays ``uniform(c/2, c)`` with ``c = min(cap, base * 2**attempt)``.

    Args:
        base_s: first ceiling.
        cap_s: largest ceiling.
        rng: a ``random.Random`` (injected in tests).
    """

    def __init__(
        self, base_s: float = 0.05, cap_s: float = 5.0, rng: random.Random | None = None
    ) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("need 0 < base_s <= cap_s")
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """The delay before the next attempt; advances the attempt counter."""
        ceiling = min(self.cap_s, self.base_s * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """Forget past failures (call after a successful connect)."""
        self.attempt = 0
