"""A real broker in this process, on its own event-loop thread."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Callable

from lockmq.broker.embedded import EmbeddedBroker

from lockmq.clock import SYSTEM_CLOCK, Clock

from .tables import Tables, merge_tables

#: Timers a test does not want to wait for: positions flushed and leases swept
#: every 20 ms.
FAST_TIMERS: Tables = {"broker": {"position_flush_ms": 20},
                       "consumers": {"lease_sweep_ms": 20}}


def uvloop_wanted() -> bool:
    """Brokers run on uvloop (as in production) unless ``LOCKMQ_TEST_UVLOOP=0``."""
    return os.environ.get("LOCKMQ_TEST_UVLOOP", "1") == "1"


class BrokerThread(EmbeddedBroker):
    """:class:`~lockmq.broker.embedded.EmbeddedBroker` with test defaults: auth off,
    logs at WARNING, the loop chosen by ``LOCKMQ_TEST_UVLOOP``; ``tables`` are config
    tables, e.g. ``BrokerThread(d, consumers={"time_scale": 0.01})``."""

    def __init__(self, data_dir: str, port: int = 0, auth: str = "off",
                 uvloop: bool | None = None, clock: Clock = SYSTEM_CLOCK,
                 **tables: dict[str, Any]) -> None:
        super().__init__(data_dir, port=port, auth=auth, overrides=merge_tables(tables),
                         uvloop=uvloop_wanted() if uvloop is None else uvloop, clock=clock)

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run ``fn`` on the broker's loop (awaiting it if it returns a coroutine) and
        return its result: how a test reads or pokes broker state without a race."""
        async def wrap() -> Any:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result
        assert self._loop is not None, "broker not started"
        return asyncio.run_coroutine_threadsafe(wrap(), self._loop).result(timeout)

    def status_page(self) -> str:
        """Start the broker's status page on a free port; its base URL."""
        port = self.call(lambda: self.broker.status.start("127.0.0.1", 0))
        return f"http://127.0.0.1:{port}"
