"""Background sweeps of the broker: run a function every N seconds until stopped.

The one way the broker runs timers (lease expiry, positions, retention, device
eviction, command expiry): each is a plain function, sync or async, given to
:func:`start_periodic`; a failing run is logged and the next one still happens.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Awaitable, Callable

from lockmq.background import stop_task

from .logs import EventLog

__all__ = ["start_periodic", "stop_task"]


def start_periodic(name: str, interval_s: float, fn: Callable[[], Awaitable[Any] | None],
                   log: EventLog | None = None) -> asyncio.Task[None]:
    """Call ``fn()`` (awaited if it is a coroutine function) every ``interval_s``
    seconds on the running loop, as task ``name``. An exception in one call is
    logged as ``periodic_failed`` (when ``log`` is given) and does not stop the timer."""
    async def loop() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                out = fn()
                if inspect.isawaitable(out):
                    await out
            except Exception as exc:  # noqa: BLE001 -- a timer must outlive a bad run
                if log is not None:
                    log("periodic_failed", task=name, error=repr(exc), level="error")
    return asyncio.get_running_loop().create_task(loop(), name=name)
