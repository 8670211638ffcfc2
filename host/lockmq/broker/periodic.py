"""Background sweeps of the broker: run a function every N seconds until stopped."""

from __future__ import annotations

import asyncio
from typing import Callable


def start_periodic(name: str, interval_s: float, fn: Callable[[], None]) -> asyncio.Task[None]:
    """Call ``fn()`` every ``interval_s`` seconds on the running loop, as task ``name``."""
    async def loop() -> None:
        while True:
            await asyncio.sleep(interval_s)
            fn()
    return asyncio.get_running_loop().create_task(loop(), name=name)


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has stopped."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
