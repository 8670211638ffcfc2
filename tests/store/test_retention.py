"""Retention by age and size, protection of what consumer clusters still need."""

from __future__ import annotations

import os
import time

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


def test_age_retention_keeps_what_a_cluster_needs(data_dir):
    async def main():
        s = await _build(data_dir, retention_ms=1000)()
        nseg = len(os.listdir(os.path.join(data_dir, "message.log")))
        assert s.enforce_retention({}, now_ms=0).deleted_segments == []  # nothing is old yet
        rep = s.enforce_retention({"a": 50}, now_ms=FUTURE)
        assert rep.deleted_segments and not rep.forced_segments
        assert 0 < s.queue_start("a") <= 50
        assert s.read("a", 50, 1)[0].queue_offset == 50
        assert s.queue_start("b") > 0
        got = s.read("b", 0, 1)  # before the start: reads from the first retained record
        assert got[0].queue_offset == s.queue_start("b")
        # everything old, nothing needed: all but the active segment go
        rep2 = s.enforce_retention({}, now_ms=FUTURE)
        assert len(s._segments) == 1 and rep2.log_start == s.log_start
        assert len(rep.deleted_segments) + len(rep2.deleted_segments) < nseg
        assert s.queue_end("a") == 150
        await s.close()
    run(main())
    assert check_dir(str(data_dir)).ok


def test_size_limit_deletes_needed_records_and_counts_them(data_dir):
    async def main():
        s = await _build(data_dir, retention_bytes=6000, retention_ms=None)()
        rep = s.enforce_retention({"a": 0, "b": 149})
        assert rep.forced_segments and rep.forced_records.get("a", 0) > 0
        assert "b" not in rep.forced_records
        assert s.stats["forced_deleted_records"] == rep.forced_records["a"]
        assert s.log_end - s.log_start <= 6000 + 2048
        assert s.queue_start("a") == rep.forced_records["a"]
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


def test_no_limits_deletes_nothing(data_dir):
    async def main():
        s = await _build(data_dir, retention_ms=None)()
        rep = s.enforce_retention({}, now_ms=FUTURE)
        assert rep.deleted_segments == [] and s.queue_start("a") == 0
        await s.close()
    run(main())
