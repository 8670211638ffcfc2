"""Ctrl-C and SIGTERM end a long-running command (or service) cleanly; SIGHUP asks
a service to reload its configuration."""

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


def ignore_stop_signals() -> None:
    """SIGINT and SIGTERM are ignored from here to the exit: a service that has shut
    down exits with its own status however often it is signalled meanwhile (systemd
    escalates with SIGKILL, never needs a second SIGTERM). The running loop's handlers
    are removed first: closing the loop would otherwise restore the defaults, and a
    signal in the moments before the exit would end the process with it."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)
        except (NotImplementedError, RuntimeError, ValueError):   # not the main thread
            pass


def reload_on_sighup() -> asyncio.Event:
    """An event set on SIGHUP (``systemctl reload``), which would otherwise end the
    process: the service reloads its configuration when it sees it set."""
    requested = asyncio.Event()
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, requested.set)
    except (NotImplementedError, RuntimeError, AttributeError):
        pass
    return requested
