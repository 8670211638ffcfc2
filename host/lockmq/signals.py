"""Ctrl-C and SIGTERM end a long-running command (or service) cleanly."""

from __future__ import annotations

import asyncio
import signal


def stop_on_signals() -> asyncio.Event:
    """An event set on SIGINT or SIGTERM (where the running loop can handle signals):
    a command awaits it, then stops its clients and prints its totals."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    return stop
