"""Handshake deadlines: one loop-wide timer for every connection still in its handshake.

A connection must finish CONNECT/AUTH within ``broker.handshake_timeout_s``. A timer
per connection (``call_later`` at accept, ``cancel`` at AUTH) is two timer-heap
operations and a handle per lock: in a storm of 10,000 locks a second, that is
work for nothing, since almost every lock authenticates in milliseconds. Here the
connections in their handshake sit in one insertion-ordered dict; with one timeout
for all, insertion order is deadline order, so one timer armed for the oldest
deadline finds every expired connection at the front and stops at the first that
is not. Late by at most :data:`SLACK_S` (the sweep batches what expires close
together), never early.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Handshaking(Protocol):
    """What the sweep needs of a connection: the callback of an expired handshake."""

    def _handshake_timeout(self) -> None: ...


#: A deadline is acted on at most this much later (so one sweep serves every
#: connection whose deadline falls within it, not one timer each).
SLACK_S = 0.05


class HandshakeDeadlines:
    """The connections not authenticated yet, oldest first; see the module docstring."""

    def __init__(self) -> None:
        #: connection -> monotonic deadline (insertion order = deadline order while
        #: the timeout does not change; a shorter one set later is acted on late by
        #: at most the difference, never early)
        self._pending: dict[Handshaking, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, conn: Handshaking, timeout_s: float) -> None:
        """``conn`` must authenticate within ``timeout_s``, else its
        ``_handshake_timeout()`` is called."""
        self._pending[conn] = time.monotonic() + timeout_s
        if self._timer is None:
            self._arm(timeout_s)

    def discard(self, conn: Handshaking) -> None:
        """``conn`` authenticated or closed: no deadline any more."""
        self._pending.pop(conn, None)

    def _arm(self, delay_s: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(
            max(0.0, delay_s) + SLACK_S, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        now = time.monotonic()
        expired = []
        for conn, deadline in self._pending.items():
            if deadline > now:
                break
            expired.append(conn)
        for conn in expired:
            del self._pending[conn]
        for conn in expired:
            conn._handshake_timeout()
        if self._pending and self._timer is None:
            self._arm(next(iter(self._pending.values())) - now)
