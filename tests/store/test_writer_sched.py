"""The writer thread's scheduling policy (``StoreConfig.writer_sched``): by default it
does not preempt the event loop when it wakes (SCHED_BATCH on Linux)."""

from __future__ import annotations

import os

import pytest

from lockmq.store import Store, StoreConfig

from .helpers import config, fill, run

needs_sched = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"),
                                 reason="no SCHED_BATCH on this system")


def writer_policy(store: Store) -> int:
    """The scheduling policy of the store's running writer thread."""
    thread = store._writer._thread  # (the thread exists once something was appended)
    assert thread is not None and thread.native_id is not None
    return os.sched_getscheduler(thread.native_id)


@needs_sched
@pytest.mark.parametrize("sched, policy", [("batch", "SCHED_BATCH"), ("normal", "SCHED_OTHER")])
def test_writer_thread_runs_under_the_configured_policy(data_dir, sched, policy):
    async def main():
        s = Store.open(config(data_dir, writer_sched=sched))
        try:
            assert len(await fill(s, "locks", "SN1", range(20), batch=7)) == 20
            assert writer_policy(s) == getattr(os, policy)
            # the loop thread is never changed
            assert os.sched_getscheduler(0) == os.SCHED_OTHER
        finally:
            await s.close()
    run(main())


def test_an_unknown_writer_sched_is_refused_by_name():
    with pytest.raises(ValueError, match="writer_sched must be 'batch' or 'normal'"):
        StoreConfig(writer_sched="fifo").validate()
