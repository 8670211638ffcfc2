"""The broker's one clock seam: wall time, and steady time that cannot jump.

Two readings, for two jobs:

* :meth:`Clock.wall_ms` -- the system's wall clock: timestamps people read (a
  record's broker time, a dead letter's time) and times of day a user asked for
  (scheduled messages).
* :meth:`Clock.steady_ms` -- the scale of every *duration the broker judges*:
  record age for retention, cluster expiry, retry due times. It reads like wall
  time but advances only with the machine's monotonic clock (``CLOCK_BOOTTIME``),
  so an NTP or operator step of the wall clock -- a week forward, an hour back --
  moves nothing: no fresh record looks old, no retry is held. It survives broker
  restarts: :meth:`SystemClock.restore` continues it from the file it saves
  (``[broker] data_dir``/``clock``) on the same boot, whatever the wall clock says
  meanwhile; after a reboot it starts at the wall clock, never below its last saved
  value.

A step is a change of ``wall - steady`` larger than :data:`STEP_MS`:
:meth:`SystemClock.check_step` reports it (the broker logs ``clock_step`` and
counts ``lockmq_clock_steps_total``); it changes no decision by itself.

Production uses a :class:`SystemClock` per broker; a test or ``bench/soak.py``
hands a :class:`ManualClock` to a broker in a thread and moves time forward by days
in seconds (:meth:`ManualClock.step` moves the wall clock alone). No environment
variable changes time.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from typing import Protocol

#: a change of ``wall - steady`` above this is a step of the wall clock (NTP slews
#: smaller errors; a slew is not a step)
STEP_MS = 2000.0

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _boot_ns() -> int:
    """Time since boot, counting suspend, never stepped (``CLOCK_BOOTTIME``)."""
    try:
        return time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):   # not Linux
        return time.monotonic_ns()


def _boot_id() -> str:
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


class Clock(Protocol):
    """What the broker asks of a clock."""

    def wall_ms(self) -> float:
        """Milliseconds since the Unix epoch (microsecond resolution)."""

    def steady_ms(self) -> float:
        """Wall-like milliseconds that never jump: the scale of judged durations."""


class SystemClock:
    """The real clock: ``time.time_ns`` for wall time, ``CLOCK_BOOTTIME`` under
    steady time. One per broker (its steady base is the broker's own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base_boot = _boot_ns()
        self._base_ms = time.time_ns() / 1_000_000
        #: ``wall - steady`` at the last check (a step changes it)
        self._offset = 0.0
        #: steps seen by :meth:`check_step`
        self.steps = 0

    def wall_ms(self) -> float:
        """Milliseconds since the epoch, now."""
        return time.time_ns() / 1_000_000

    def steady_ms(self) -> float:
        """Steady time (see the module docstring)."""
        return self._base_ms + (_boot_ns() - self._base_boot) / 1_000_000

    def check_step(self) -> float | None:
        """The size of a wall-clock step since the last call (ms; negative: back),
        or None. Counted in :attr:`steps`."""
        with self._lock:
            offset = self.wall_ms() - self.steady_ms()
            delta = offset - self._offset
            if abs(delta) <= STEP_MS:
                return None
            self._offset = offset
            self.steps += 1
            return delta

    # -- across restarts -------------------------------------------------------------

    def restore(self, path: str) -> str:
        """Continue steady time from the file :meth:`save` wrote: on the same boot
        by the boot clock's advance since (the wall clock may have been stepped
        while the broker was down), after a reboot from the wall clock but never
        below the saved value. Returns what happened, for the log."""
        saved = _load(path)
        now_boot = _boot_ns()
        wall = time.time_ns() / 1_000_000
        how = "no saved steady time: starts at the wall clock"
        steady = wall
        if saved is not None:
            if saved["boot_id"] and saved["boot_id"] == _boot_id() \
                    and now_boot >= saved["boot_ns"]:
                steady = saved["steady_ms"] + (now_boot - saved["boot_ns"]) / 1_000_000
                how = "continued from the saved steady time (same boot)"
            elif wall < saved["steady_ms"]:
                steady = saved["steady_ms"]
                how = ("after a reboot the wall clock is behind the saved steady time: "
                       "continued from the saved value")
            else:
                how = "after a reboot: starts at the wall clock"
        with self._lock:
            self._base_boot = now_boot
            self._base_ms = steady
            self._offset = wall - steady
        return how

    def save(self, path: str) -> None:
        """Write the steady time and the boot clock durably (temp file, fsync,
        rename), so :meth:`restore` can continue it."""
        body = json.dumps({"steady_ms": self.steady_ms(), "boot_ns": _boot_ns(),
                           "boot_id": _boot_id(), "wall_ms": self.wall_ms()}).encode()
        data = body + zlib.crc32(body).to_bytes(4, "little")
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)


def _load(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    body, crc = blob[:-4], blob[-4:]
    if len(blob) < 4 or zlib.crc32(body).to_bytes(4, "little") != crc:
        return None
    try:
        d = json.loads(body)
        return {"steady_ms": float(d["steady_ms"]), "boot_ns": int(d["boot_ns"]),
                "boot_id": str(d.get("boot_id", ""))}
    except (ValueError, KeyError, TypeError):
        return None


class ManualClock:
    """A clock that moves only when told to (thread-safe): tests and time-scale benches.

    It starts at the given wall time (default: now); :meth:`advance` moves wall and
    steady time together, :meth:`step` the wall clock alone (an NTP step).
    """

    def __init__(self, start_ms: float | None = None) -> None:
        self._lock = threading.Lock()
        self._wall_ms = time.time_ns() / 1_000_000 if start_ms is None else float(start_ms)
        self._steady_ms = self._wall_ms
        self._offset = 0.0
        self.steps = 0

    def wall_ms(self) -> float:
        """The clock's wall time in ms."""
        with self._lock:
            return self._wall_ms

    def steady_ms(self) -> float:
        """The clock's steady time in ms (moved by :meth:`advance` only)."""
        with self._lock:
            return self._steady_ms

    def advance(self, ms: float) -> None:
        """Move time forward by ``ms`` milliseconds."""
        if ms < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._wall_ms += ms
            self._steady_ms += ms

    def step(self, ms: float) -> None:
        """Step the wall clock by ``ms`` (either way); steady time does not move."""
        with self._lock:
            self._wall_ms += ms

    def check_step(self) -> float | None:
        """As :meth:`SystemClock.check_step`."""
        with self._lock:
            offset = self._wall_ms - self._steady_ms
            delta = offset - self._offset
            if abs(delta) <= STEP_MS:
                return None
            self._offset = offset
            self.steps += 1
            return delta

    def restore(self, path: str) -> str:
        """Nothing to restore: a manual clock is where the test put it."""
        return "manual clock"

    def save(self, path: str) -> None:
        """Nothing to save."""


def steady_ms_of(clock: object) -> float:
    """``clock.steady_ms()``, or its wall time for a clock without one (a test's)."""
    fn = getattr(clock, "steady_ms", None)
    return fn() if fn is not None else clock.wall_ms()  # type: ignore[attr-defined]


#: The clock of every store and tool that is not given another (a broker makes its own
#: :class:`SystemClock`, so its steady base is its own).
SYSTEM_CLOCK: Clock = SystemClock()

__all__ = ["Clock", "SystemClock", "ManualClock", "SYSTEM_CLOCK", "STEP_MS", "steady_ms_of"]
