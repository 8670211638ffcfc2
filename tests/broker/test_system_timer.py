"""The system-record timer (``BrokerCore.publish_system``): records the broker writes
itself wait up to ``SYSTEM_FLUSH_S`` for a client append to ride along with. When an
append took the records a timer was set for, that timer stores nothing early: records
gathered since wait their own time.

The event loop's clock is held by the test (``loop.time``), so "before the timer" and
"after it" are steps of the test, not races against the machine's speed."""

from __future__ import annotations

import asyncio
import io
from typing import Any

from lockmq.broker.core import SYSTEM_FLUSH_S, BrokerCore
from lockmq.broker.logs import EventLog, Stats
from lockmq.config import config_from_dict
from lockmq.store import NewRecord
from lockmq.testing import wait_for_async


async def _run_due_timers(core: BrokerCore, armed: Any) -> None:
    """Turn the loop until the timer handle ``armed`` has run (it is due: a few
    turns; bounded so a timer that never runs fails instead of hanging)."""
    for _ in range(1000):
        if core._sys_timer is not armed:
            return
        await asyncio.sleep(0)   # one loop turn
    raise AssertionError("the due system-record timer did not run")


def test_a_timer_whose_records_an_append_took_leaves_the_later_ones_waiting(
        tmp_path) -> None:
    async def run() -> None:
        cfg = config_from_dict({"broker": {"data_dir": str(tmp_path / "data")}})
        core = BrokerCore(cfg, EventLog("DEBUG", stream=io.StringIO()), Stats())
        core.open()
        store = core.store
        assert store is not None
        loop = asyncio.get_running_loop()
        now = [loop.time()]
        loop.time = lambda: now[0]   # type: ignore[method-assign]  (the test's clock)
        answered: list = []

        def client_append(seq: int) -> None:
            core.append_then([NewRecord("t", "lock-a", seq, 1, b"a%d" % seq)],
                             lambda res, exc: answered.append(exc))
        try:
            core.publish_system("$devices", b"A")
            armed = core._sys_timer   # due at SYSTEM_FLUSH_S
            now[0] += SYSTEM_FLUSH_S * 0.8
            client_append(1)          # takes A along
            core.publish_system("$devices", b"B")   # B's wait starts here
            now[0] += SYSTEM_FLUSH_S * 0.4          # past A's timer, within B's wait
            await _run_due_timers(core, armed)
            assert [r.payload for r in core._sys_batch] == [b"B"], \
                "the timer set for A stored B before B's own wait was over"
            client_append(2)          # B rides this one
        finally:
            del loop.time   # the loop's own clock again
        await wait_for_async(lambda: len(answered) == 2 and core.system_idle,
                             "both appends and the system records stored")
        assert answered == [None, None]
        (a, b), (a1, a2) = store.read("$devices", 0, 10), store.read("t", 0, 10)
        assert [a.payload, b.payload] == [b"A", b"B"]
        assert a.offset < a1.offset < b.offset < a2.offset   # each ahead of its ride
        await core.close()

    asyncio.run(run())
