"""The writer's source (``Store.read_before_commit``, issue #14): a function the writer
thread calls before each group commit it takes, whose appends (``known_topics``) go
into that very commit; the broker's lane reads its sockets there."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lockmq.store import Store, TopicNotOpen

from .helpers import config, fill, rec, run

# (no checkpoint due while a test runs: that would wake the writer, which then calls
# its source on its way round, at a moment the test does not choose)
QUIET = {"checkpoint_interval_ms": 3_600_000}


async def writer_waits(s: Store) -> None:
    """Return once the writer thread waits for work. The commit before has been
    answered on the loop before the writer goes round: without this, a test's next
    step can find it still on its way (and a source set now called before a take
    the test meant to come first)."""
    for _ in range(500):
        if s.writer_waits:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the writer never went idle")


def test_what_the_source_appends_goes_into_the_next_commit(data_dir):
    async def main():
        s = Store.open(config(data_dir, **QUIET))
        try:
            await fill(s, "locks", "SN1", range(3))   # (the topic and the writer exist)
            await writer_waits(s)
            loop = asyncio.get_running_loop()
            answered: asyncio.Future = loop.create_future()
            todo = [[rec("locks", "SN2", i) for i in range(5)]]
            threads = []

            def source() -> None:
                threads.append(threading.current_thread().name)
                if todo:
                    s.append_then(todo.pop(), lambda res, exc: answered.set_result((res, exc)),
                                  known_topics=True)
            s.read_before_commit(source)
            batches = s.stats["batches"]
            await fill(s, "locks", "SN1", range(3, 4))   # (one commit: the source runs after)
            res, exc = await asyncio.wait_for(answered, 5)
            assert exc is None and [a.queue_offset for a in res] == [4, 5, 6, 7, 8]
            assert set(threads) == {"lockmq-store-writer"}
            assert s.stats["batches"] == batches + 2   # (fill's commit, then the source's)
            s.read_before_commit(None)
        finally:
            await s.close()
    run(main())


def test_an_idle_writer_runs_its_source_when_told_it_has_something(data_dir):
    async def main():
        s = Store.open(config(data_dir, **QUIET))
        try:
            await fill(s, "locks", "SN1", range(3))
            await writer_waits(s)
            called = threading.Event()
            s.read_before_commit(called.set)
            await asyncio.sleep(0.2)
            assert not called.is_set()   # an idle writer does not poll its source
            s.source_ready()
            assert await asyncio.to_thread(called.wait, 5)
            s.read_before_commit(None)
        finally:
            await s.close()
    run(main())


def test_a_new_topic_is_not_created_from_the_writer_thread(data_dir):
    async def main():
        s = Store.open(config(data_dir))
        try:
            await fill(s, "locks", "SN1", range(3))
            with pytest.raises(TopicNotOpen, match="'doors'"):
                s.append_then([rec("doors", "SN1", 9)], lambda res, exc: None,
                              known_topics=True)
            assert "doors" not in s.topics()
            # the loop's own append creates it
            assert len(await fill(s, "doors", "SN1", range(9, 10))) == 1
        finally:
            await s.close()
    run(main())
