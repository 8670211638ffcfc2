"""The broker's one clock seam: wall time in milliseconds.

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


class SystemClock:
    """The real clock: ``time.time_ns``."""

    def wall_ms(self) -> float:
        """Milliseconds since the epoch, now."""
        return time.time_ns() / 1_000_000


class ManualClock:
    """A clock that moves only when told to (thread-safe): tests and time-scale benches.

    It starts at the given wall time (default: now) and moves only by :meth:`advance`.
    """

    def __init__(self, start_ms: float | None = None) -> None:
        self._lock = threading.Lock()
        self._wall_ms = time.time_ns() / 1_000_000 if start_ms is None else float(start_ms)

    def wall_ms(self) -> float:
        """The clock's wall time in ms."""
        with self._lock:
            return self._wall_ms

    def advance(self, ms: float) -> None:
        """Move time forward by ``ms`` milliseconds."""
        if ms < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._wall_ms += ms


#: The clock of every broker and store that is not given another.
SYSTEM_CLOCK: Clock = SystemClock()

__all__ = ["Clock", "SystemClock", "ManualClock", "SYSTEM_CLOCK"]
