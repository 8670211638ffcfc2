"""Fixtures for the broker's end-to-end tests: a real broker on 127.0.0.1.

``broker`` runs :class:`lockmq.testing.BrokerThread` (real TCP, real files with
fsync, auth off, fast timers); the tests speak to it with :class:`lockmq.testing.Peer`.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Callable, Iterator

import pytest

from lockmq.clock import SYSTEM_CLOCK, Clock
from lockmq.testing import FAST_TIMERS, BrokerThread, merge_tables


@pytest.fixture
def make_broker(tmp_path: Any) -> Iterator[Callable[..., BrokerThread]]:
    """Start brokers with settings: ``make_broker(consumers={...})``; every one is
    stopped after the test (all of them, even if stopping one fails)."""
    with ExitStack() as stack:
        def make(data_dir: str | None = None, clock: Clock = SYSTEM_CLOCK,
                 **settings: dict[str, Any]) -> BrokerThread:
            b = BrokerThread(data_dir or str(tmp_path / "data"), clock=clock,
                             **merge_tables(FAST_TIMERS, settings)).start()
            stack.callback(b.stop)
            return b

        yield make


@pytest.fixture
def broker(make_broker: Callable[..., BrokerThread]) -> BrokerThread:
    """A broker on defaults (auth off, fast timers)."""
    return make_broker()
