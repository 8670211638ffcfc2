"""Waiting for a condition, bounded: tests wait for what they need, never for luck."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def _poll(cond: Callable[[], T], what: str, timeout: float, deadline: float) -> T | None:
    """``cond()`` if true; None to poll again; ``AssertionError`` once past ``deadline``."""
    got = cond()
    if got:
        return got
    if time.monotonic() >= deadline:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return None


def wait_for(cond: Callable[[], T], what: str, timeout: float = 30.0,
             interval: float = 0.05) -> T:
    """Poll ``cond`` until it returns something true and return it; fail with
    ``AssertionError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (got := _poll(cond, what, timeout, deadline)) is None:
        time.sleep(interval)
    return got


async def wait_for_async(cond: Callable[[], T], what: str, timeout: float = 30.0,
                         interval: float = 0.02) -> T:
    """:func:`wait_for` inside a coroutine: the event loop keeps running (producers,
    consumers) while ``cond`` is polled."""
    deadline = time.monotonic() + timeout
    while (got := _poll(cond, what, timeout, deadline)) is None:
        await asyncio.sleep(interval)
    return got


def raises(exc_type: type[BaseException], fn: Callable[[], Any]) -> Any:
    """Run ``fn``, which must raise ``exc_type``; return the exception (like
    ``pytest.raises``, without needing pytest at import time)."""
    try:
        fn()
    except exc_type as exc:
        return exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)!s} did not raise {exc_type.__name__}")
