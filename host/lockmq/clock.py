"""The broker's one clock seam: wall time in milliseconds and a monotonic clock.

Everything that ages data asks a :class:`Clock`: the store (record timestamps,
segment age and time-based rolls, retention), the consumer clusters (last
activity, expiry) and ``lockmq export``. Production uses :data:`SYSTEM_CLOCK`; a
test or ``bench/soak.py`` hands a :class:`ManualClock` to a broker in a thread and
moves time forward by days in seconds. No environment variable changes time.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """What the broker asks of a clock."""

    def wall_ms(self) -> float:
        """Milliseconds since the Unix epoch (microsecond resolution)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for intervals)."""


class SystemClock:
    """The real clock: ``time.time_ns`` and ``time.monotonic``."""

    def wall_ms(self) -> float:
        """Milliseconds since the epoch, now."""
        return time.time_ns() / 1_000_000

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (thread-safe): tests and time-scale benches.

    Both readings start at the given wall time and move together with :meth:`advance`.
    """

    def __init__(self, start_ms: float | None = None) -> None:
        self._lock = threading.Lock()
        self._wall_ms = time.time_ns() / 1_000_000 if start_ms is None else float(start_ms)
        self._mono = 0.0

    def wall_ms(self) -> float:
        """The clock's wall time in ms."""
        with self._lock:
            return self._wall_ms

    def monotonic(self) -> float:
        """Seconds since the clock was made, in the clock's time."""
        with self._lock:
            return self._mono

    def advance(self, ms: float) -> None:
        """Move time forward by ``ms`` milliseconds."""
        if ms < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._wall_ms += ms
            self._mono += ms / 1000.0


#: The clock of every broker and store that is not given another.
SYSTEM_CLOCK: Clock = SystemClock()

__all__ = ["Clock", "SystemClock", "ManualClock", "SYSTEM_CLOCK"]
