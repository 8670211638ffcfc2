"""Background tasks on the event loop, for every package (broker, MQTT): stopping one.

It lives below both ``lockmq.broker`` and ``lockmq.mqtt`` so that each can use it
without importing the other.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable


async def stop_task(task: asyncio.Task[Any] | None, log: Callable[..., Any] | None = None) -> None:
    """Cancel ``task`` (if any) and wait until it has stopped. A task that had already
    ended by failing does not stop the shutdown: its error is logged as
    ``task_failed`` (when ``log`` is given) and the stop goes on."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # noqa: BLE001 -- stopping must not fail on a dead task
        if log is not None:
            log("task_failed", task=task.get_name(), error=repr(exc), level="error")
