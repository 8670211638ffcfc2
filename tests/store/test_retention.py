"""Retention by age and size, protection of what consumer clusters still need."""

from __future__ import annotations

import os
import time

import pytest

from lockmq.store import Store
from lockmq.store.inspect import check_dir

from .helpers import config, rec, run

FUTURE = int(time.time() * 1000) + 10 * 365 * 24 * 3600 * 1000


def _build(data_dir, **kw):
    async def main():
        s = Store.open(config(data_dir, segment_bytes=2048, **kw))
        for i in range(0, 300, 6):
            await s.append([rec("a" if k % 2 else "b", "S", k) for k in range(i, i + 6)])
        return s
    return main


def test_age_retention_wins_over_a_cluster_that_has_not_read(data_dir):
    # (was: age retention kept what a cluster needed -- an abandoned cluster then
    # filled the disk; issue 12 makes the limits win and counts what is skipped)
    async def main():
        s = await _build(data_dir, retention_ms=1000)()
        nseg = len(s._segments)
        assert s.enforce_retention({}, now_ms=0).deleted_segments == []  # nothing is old yet
        rep = s.enforce_retention({"a": 0, "b": 149}, now_ms=FUTURE)
        assert len(s._segments) == 1 and rep.log_start == s.log_start
        assert len(rep.deleted_segments) == nseg - 1   # all but the active segment
        start_a = s.queue_start("a")
        assert start_a > 0 and rep.skipped_records == {"a": start_a}
        assert s.stats["skipped_records"] == start_a
        got = s.read("a", 0, 1)  # before the start: reads from the first retained record
        assert got[0].queue_offset == start_a
        assert s.queue_end("a") == 150
        await s.close()
    run(main())
    assert check_dir(str(data_dir)).ok


def test_size_limit_deletes_unread_records_and_counts_them(data_dir):
    async def main():
        s = await _build(data_dir, retention_bytes=6000, retention_ms=-1)()
        rep = s.enforce_retention({"a": 0, "b": 149})
        assert rep.deleted_segments and rep.skipped_records.get("a", 0) > 0
        assert "b" not in rep.skipped_records
        assert s.stats["skipped_records"] == rep.skipped_records["a"]
        assert s.log_end - s.log_start <= 6000 + 2048
        assert s.queue_start("a") == rep.skipped_records["a"]
        # a second pass deletes nothing more and counts nothing twice
        again = s.enforce_retention({"a": 0})
        assert again.deleted_segments == [] and again.skipped_records == {}
        await s.close()
    run(main())


def test_queue_offsets_survive_restart_after_retention(data_dir):
    async def main():
        s = await _build(data_dir, retention_ms=1000)()
        s.enforce_retention({}, now_ms=FUTURE)
        start_a, end_a = s.queue_start("a"), s.queue_end("a")
        first = s.read("a", start_a, 1)[0]
        await s.close()
        for drop_checkpoint in (False, True):
            if drop_checkpoint:  # full rebuild: queue offsets come from the .qstart file
                os.unlink(os.path.join(data_dir, "checkpoint"))
            s = Store.open(config(data_dir, segment_bytes=2048))
            assert s.recovery.full_scan == drop_checkpoint
            assert (s.queue_start("a"), s.queue_end("a")) == (start_a, end_a)
            again = s.read("a", start_a, 1)[0]
            assert (again.offset, again.seq, again.queue_offset) == \
                (first.offset, first.seq, first.queue_offset)
            res = await s.append([rec("a", "S", 10_000 + drop_checkpoint)])
            assert res[0].queue_offset == end_a
            await s.close()
            end_a += 1
    run(main())


@pytest.mark.parametrize("forever", [None, -1])
def test_no_limits_deletes_nothing(data_dir, forever):
    async def main():
        s = await _build(data_dir, retention_ms=forever, retention_bytes=forever)()
        rep = s.enforce_retention({}, now_ms=FUTURE)
        assert rep.deleted_segments == [] and s.queue_start("a") == 0
        await s.close()
    run(main())
