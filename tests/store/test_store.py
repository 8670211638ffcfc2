"""Appending and reading through the Store: round trips, rolls, dedup, modes."""

from __future__ import annotations

import asyncio
import os

import pytest

from lockmq.store import (InvalidRecord, NewRecord, Store, StoreClosed, StoreLocked,
                          validate_topic)
from lockmq.store.inspect import check_dir

from .helpers import config, fill, payload_for, rec, run


def test_round_trip_across_segment_rolls(data_dir):
    async def main():
        s = Store.open(config(data_dir, segment_bytes=4096))
        res = await fill(s, "locks", "SN1", range(500), batch=37)
        res += await fill(s, "alarms", "SN2", range(120), batch=1)
        assert [a.queue_offset for a in res[:500]] == list(range(500))
        assert not any(a.duplicate for a in res)
        assert len(os.listdir(os.path.join(data_dir, "message.log"))) > 10
        got = s.read("locks", 0, 1000)
        assert [r.seq for r in got] == list(range(500))
        assert all(r.payload == payload_for("SN1", r.seq) for r in got)
        assert [r.queue_offset for r in got] == list(range(500))
        assert [r.offset for r in got] == [a.offset for a in res[:500]]
        assert [r.seq for r in s.read("locks", 123, 7)] == list(range(123, 130))
        assert s.read("locks", 500, 10) == []
        assert s.read("nope", 0, 10) == []
        assert s.queue_end("locks") == 500 and s.queue_end("alarms") == 120
        assert s.topics() == ["alarms", "locks"]
        assert s.read_at(res[42].offset).seq == 42
        await s.close()
        s = Store.open(config(data_dir, segment_bytes=4096))
        assert [r.seq for r in s.read("locks", 0, 1000)] == list(range(500))
        assert [r.seq for r in s.read("alarms", 0, 1000)] == list(range(120))
        s.close_sync()
    run(main())
    assert check_dir(str(data_dir)).ok


def test_scan_reads_a_whole_topic_in_chunks_from_an_offset(data_dir):
    async def main():
        s = Store.open(config(data_dir, segment_bytes=4096))
        await fill(s, "locks", "SN1", range(250), batch=50)
        await fill(s, "alarms", "SN2", range(3), batch=3)
        assert [r.seq for r in s.scan("locks", chunk=7)] == list(range(250))
        assert [r.queue_offset for r in s.scan("locks", 240, chunk=3)] == list(range(240, 250))
        assert [r.seq for r in s.scan("alarms")] == [0, 1, 2]
        assert list(s.scan("locks", 250)) == [] and list(s.scan("nope")) == []
        await s.close()
    run(main())


def test_rolls_inside_one_batch_record_each_topics_queue_start(data_dir):
    """Segment rolls in the middle of one group commit, topics interleaved: each new
    segment's queue-start sidecar holds every topic's queue offset at its first byte
    (the planner keeps the current topic's counter in a local during the batch)."""
    from lockmq.store.names import SEGMENT_DIR
    from lockmq.store.segment import Segment

    async def main():
        s = Store.open(config(data_dir, segment_bytes=1024))
        await s.append([rec("warmup", "SN0", 0)])
        recs = [rec(("locks", "alarms", "doors")[i % 3 if i % 7 else 0], f"SN{i % 5}", i)
                for i in range(300)]
        res = await s.append(recs)
        bases = list(s._segments.bases)
        await s.close()
        return res, bases

    res, bases = run(main())
    assert len(bases) > 10
    seg_dir = os.path.join(str(data_dir), SEGMENT_DIR)
    for base in bases[1:]:
        expect: dict[str, int] = {}
        for a in res:  # queue end of each topic before the segment's first byte
            if a.offset < base:
                expect[a.topic] = a.queue_offset + 1
        got = Segment(seg_dir, base).read_qstart()
        assert got is not None
        for topic, q in expect.items():
            assert got[topic] == q, (base, topic)
    assert check_dir(str(data_dir)).ok


def test_concurrent_writers_are_batched_and_all_stored(data_dir):
    async def main():
        s = Store.open(config(data_dir, segment_bytes=64 * 1024))
        woke = []
        s.on_durable(lambda topic, end: woke.append((topic, end)))

        async def writer(i):
            return [await s.append([rec("t", f"L{i}", k)]) for k in range(20)]
        out = await asyncio.gather(*[writer(i) for i in range(200)])
        assert s.stats["batches"] < 4000  # group commit: far fewer batches than appends
        assert s.queue_end("t") == 4000
        qoffs = sorted(a[0].queue_offset for w in out for a in w)
        assert qoffs == list(range(4000))
        assert woke and woke[-1] == ("t", 4000)
        assert all(b >= a for (_, a), (_, b) in zip(woke, woke[1:]))
        got = s.read("t", 0, 5000)
        assert len(got) == 4000 and all(r.payload == payload_for(r.sn, r.seq) for r in got)
        await s.close()
    run(main())


def test_duplicates_are_not_stored_again_also_after_restart(data_dir):
    async def main():
        s = Store.open(config(data_dir))
        first = await s.append([rec("t", "A", 1), rec("t", "A", 2), rec("t", "A", 2)])
        assert [a.duplicate for a in first] == [False, False, True]
        again = await s.append([rec("t", "A", 1), rec("u", "B", 1)])
        assert [a.duplicate for a in again] == [True, False]
        assert again[0].offset == -1 and again[0].queue_offset == -1
        assert s.last_seq("A") == 2 and s.last_seq("B") == 1 and s.last_seq("C") is None
        assert s.stats["duplicates"] == 2
        await s.close()
        s = Store.open(config(data_dir))
        assert s.last_seq("A") == 2
        res = await s.append([rec("t", "A", 2), rec("t", "A", 3)])
        assert [a.duplicate for a in res] == [True, False]
        assert s.queue_end("t") == 3
        await s.close()
        # without a checkpoint the dedup table is rebuilt from the log
        os.unlink(os.path.join(data_dir, "checkpoint"))
        s = Store.open(config(data_dir))
        assert s.recovery.full_scan
        res = await s.append([rec("t", "A", 3), rec("t", "A", 1), rec("t", "A", 4)])
        assert [a.duplicate for a in res] == [True, True, False]
        await s.close()
    run(main())


def test_system_ids_are_stored_whatever_the_batching(data_dir):
    """The broker's own ids ("$...") are never dropped as duplicates: not across group
    commits, and not when two copies share one (which two concurrent calls do or do
    not is timing, so the answer must not depend on it)."""
    async def main():
        s = Store.open(config(data_dir))
        one = await s.append([rec("t", "$broker", 7), rec("t", "$broker", 7)])
        other = await s.append([rec("t", "$broker", 7)])
        with s.writes_held():   # two calls queued while the writer waits: one commit
            both = asyncio.gather(s.append([rec("t", "$broker", 9)]),
                                  s.append([rec("t", "$broker", 9), rec("t", "A", 1),
                                            rec("t", "A", 1)]))
            await asyncio.sleep(0)   # (each task's first step queues its call)
        first, second = await both
        assert [a.duplicate for a in one + other + first] == [False] * 4
        assert [a.duplicate for a in second] == [False, False, True]
        assert s.queue_end("t") == 6
        await s.close()
    run(main())


def test_bad_record_refuses_the_whole_call(data_dir):
    async def main():
        s = Store.open(config(data_dir))
        with pytest.raises(InvalidRecord):
            await s.append([rec("t", "A", 1), NewRecord("t", "A", -1)])
        with pytest.raises(InvalidRecord):
            await s.append([NewRecord("bad topic", "A", 1)])
        assert s.queue_end("t") == 0
        assert (await s.append([rec("t", "A", 1)]))[0].queue_offset == 0
        assert await s.append([]) == []
        await s.close()
        with pytest.raises(StoreClosed):
            await s.append([rec("t", "A", 2)])
    run(main())


def test_append_then_answers_per_record_and_stores_the_valid_ones_together(data_dir):
    # append (awaited) refuses a call with a bad record whole (above); append_then, the
    # publish path's, answers each record: the bad ones their own error, the others
    # stored in the call's one group commit
    async def main():
        s = Store.open(config(data_dir))
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        batches = s.stats["batches"]
        s.append_then([rec("t", "A", 1), NewRecord("t", "A", -1), rec("t", "B", 1),
                       NewRecord("bad topic", "A", 2)],
                      lambda res, exc: done.set_result((res, exc)))
        res, exc = await done
        assert exc is None and len(res) == 4
        assert isinstance(res[1], InvalidRecord) and isinstance(res[3], InvalidRecord)
        assert [res[0].queue_offset, res[2].queue_offset] == [0, 1]
        assert s.stats["batches"] == batches + 1
        assert [r.sn for r in s.read("t", 0, 10)] == ["A", "B"]
        # no valid record at all: answered at once, nothing stored
        got = []
        s.append_then([NewRecord("t", "A", -1)], lambda res, exc: got.append((res, exc)))
        assert len(got) == 1 and isinstance(got[0][0][0], InvalidRecord) and got[0][1] is None
        assert s.queue_end("t") == 2
        await s.close()
    run(main())


def test_async_mode_acks_after_write_and_survives_close(data_dir):
    async def main():
        s = Store.open(config(data_dir, flush="async", flush_interval_ms=20))
        await asyncio.gather(*[s.append([rec("t", f"S{i}", 1)]) for i in range(300)])
        assert s.queue_end("t") == 300
        await asyncio.sleep(0.1)
        assert s.stats["fsyncs"] >= 1
        await s.close()
        s = Store.open(config(data_dir, flush="async"))
        assert len(s.read("t", 0, 1000)) == 300
        s.close_sync()
    run(main())


def test_directory_is_locked_against_a_second_store(data_dir):
    s = Store.open(config(data_dir))
    with pytest.raises(StoreLocked):
        Store.open(config(data_dir))
    s.close_sync()
    Store.open(config(data_dir)).close_sync()


def test_queue_offset_at_time(data_dir):
    async def main():
        s = Store.open(config(data_dir))
        await fill(s, "t", "A", range(10))
        now_ms = s.read("t", 0, 1)[0].broker_ts_us // 1000
        assert s.queue_offset_at_time("t", now_ms - 5000) == 0
        assert s.queue_offset_at_time("t", now_ms + 5000) == 10
        await s.close()
    run(main())


def test_topic_names_become_safe_file_names(data_dir):
    async def main():
        s = Store.open(config(data_dir))
        for t in ["$dlq.cluster-1", "$retry.c%2", "..", "a.b_c-D"]:
            validate_topic(t)
            await s.append([rec(t, "X" + t, 1)])
        await s.close()
        names = set(os.listdir(data_dir))
        assert "offset-$dlq.cluster-1.log" in names and "offset-...log" in names
        s = Store.open(config(data_dir))
        assert s.topics() == sorted(["$dlq.cluster-1", "$retry.c%2", "..", "a.b_c-D"])
        s.close_sync()
    run(main())


@pytest.mark.parametrize("bad", [
    {"flush": "fast"}, {"segment_bytes": 100}, {"segment_bytes": "128M"},
    {"dedup_window": 100_000}, {"retention_ms": 0}, {"min_free_bytes": -1},
    {"max_batch_bytes": 10}, {"flush_interval_ms": True},
])
def test_bad_settings_are_refused_by_name(data_dir, bad):
    from lockmq.store import StoreConfig
    with pytest.raises(ValueError) as info:
        Store.open(StoreConfig(data_dir=str(data_dir), **bad))
    assert next(iter(bad)).split("_")[0] in str(info.value)
