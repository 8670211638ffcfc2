"""The store writer's compiled loop (``_speedups.plan_run``) against its Python one.

The same appends -- several topics, producers, duplicates, sequences out of order,
system ids, small segments that roll -- must give the same results, the same log
and the same reads with the compiled loop and without it (the compiled variant is
skipped, with the reason, when ``lockmq._speedups`` was not built).
"""
from __future__ import annotations

import asyncio
import os
import tempfile

from hypothesis import given, settings, strategies as st

from lockmq.store import NewRecord, Store, StoreConfig, writer

from .helpers import NOT_BUILT, SPEEDUPS


_rec = st.tuples(st.sampled_from(["locks", "alarms", "$devices"]),
                 st.sampled_from(["LK-1", "LK-2", "$broker"]), st.integers(0, 40),
                 st.integers(0, 200))
_calls = st.lists(st.lists(_rec, min_size=1, max_size=12), min_size=1, max_size=8)


def _store_run(calls: list, plan_run) -> tuple:
    """Append ``calls`` (pairs of calls at once: one group commit may hold several)
    with ``plan_run`` as the writer's loop; the results, the reads, the files."""
    saved = writer._plan_run
    writer._plan_run = plan_run
    try:
        with tempfile.TemporaryDirectory() as d:
            async def main() -> tuple:
                s = Store.open(StoreConfig(data_dir=d, segment_bytes=1024, min_free_bytes=0))
                res = []
                for i in range(0, len(calls), 2):
                    got = await asyncio.gather(*(
                        s.append([NewRecord(t, sn, seq, 7, b"p" * size)
                                  for t, sn, seq, size in call]) for call in calls[i:i + 2]))
                    res.extend(got)
                reads = {t: [(r.offset, r.queue_offset, r.sn, r.seq, r.payload)
                             for r in s.read(t, 0, 10_000)] for t in s.topics()}
                await s.close()
                return res, reads
            res, reads = asyncio.run(main())
            files = sorted(os.listdir(os.path.join(d, "message.log")))
            return res, reads, files
    finally:
        writer._plan_run = saved


@NOT_BUILT   # (then the writer runs its Python loop only)
@settings(max_examples=40, deadline=None)
@given(_calls)
def test_compiled_writer_loop_stores_what_the_python_one_does(calls: list) -> None:
    assert _store_run(calls, SPEEDUPS.plan_run) == _store_run(calls, None)


def test_python_writer_loop_still_dedups_and_rolls() -> None:
    calls = [[("locks", "LK-1", s, 100) for s in range(12)],
             [("locks", "LK-1", 3, 100), ("alarms", "LK-2", 1, 10), ("locks", "LK-1", 12, 10)]]
    res, reads, files = _store_run(calls, None)
    assert [a.duplicate for a in res[1]] == [True, False, False]
    assert [r[3] for r in reads["locks"]] == list(range(13)) and len(files) > 2
