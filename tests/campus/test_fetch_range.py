"""``replica.fetch`` refuses an offset outside the primary's log at once: before it
acknowledges anything and before it parks the fetch for ``wait_ms`` (a standby on
another log learns it on its first fetch, not after a long poll)."""

from __future__ import annotations

from typing import Any, Coroutine

from lockmq.admin_error import AdminError
from lockmq.store import NewRecord
from lockmq.testing import BrokerThread

LONG_WAIT = {"wait_ms": 30_000}


def _first_step(coro: Coroutine[Any, Any, Any]) -> str:
    """Run ``coro`` up to its first suspension: its error message if it raised
    before any, "parked" if it suspended (then it is closed)."""
    try:
        coro.send(None)
    except AdminError as exc:
        return str(exc)
    except StopIteration:
        return "answered"
    coro.close()
    return "parked"


def test_an_offset_outside_the_log_is_refused_before_the_wait(tmp_path) -> None:
    b = BrokerThread(str(tmp_path / "data"),
                     store={"segment_bytes": 4096, "retention_bytes": 4096},
                     replication={"sync": True})
    b.start()
    try:
        core = b.broker.core
        fetch = b.broker.admin.ops["replica.fetch"]
        for seq in range(200):   # ~ 6 segments of 4 KiB
            b.call(lambda s=seq: core.append([NewRecord("ev", "fr", s, 0, b"x" * 100)]))
        b.call(core.enforce_retention)
        start, end = b.call(lambda: (core.store.log_start, core.store.log_end))
        assert 0 < start < end, (start, end)
        # a valid fetch at the end parks: the probe does see a wait
        assert b.call(lambda: _first_step(fetch({"from": end, **LONG_WAIT}))) == "parked"
        past = b.call(lambda: _first_step(fetch({"from": end + 1, **LONG_WAIT})))
        assert "past the log end" in past
        gone = b.call(lambda: _first_step(fetch({"from": start - 1, **LONG_WAIT})))
        assert "deleted by retention" in gone
        # refused fetches acknowledged nothing
        assert b.call(lambda: b.broker.admin.ops["replica.status"]({}))["acked"] == end
    finally:
        b.stop()
