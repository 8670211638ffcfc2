"""Injected I/O faults: ENOSPC mid-write, a failed fsync, a full queue, index rewrite."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from lockmq import accel
from lockmq.store import Store, StoreBusy, StoreFailed, StoreFull, engine, writer
from lockmq.store.inspect import check_dir

from .helpers import config, rec, run


def _in_writer() -> bool:
    return threading.current_thread().name == "lockmq-store-writer"


#: the writer's two ways of doing a commit's file work: os.pwrite/os.fdatasync calls
#: (Python) and one _core.commit_write call (compiled), where faults are injected
#: into that call instead (it does not go through the os module)
PATHS = ["python", pytest.param("compiled", marks=pytest.mark.skipif(
    not accel.COMPILED, reason=f"lockmq._core not in use: {accel.DESCRIPTION}"))]


def _commit_path(monkeypatch, path: str, fault):
    """Run the writer on ``path``; for "compiled", wrap its commit_write so that
    ``fault(writes, fd, parts, pos, sync)`` may write part of it and raise first."""
    if path == "python":
        monkeypatch.setattr(writer, "_commit_write", None)
        return
    real = accel.speedups.commit_write

    def commit_write(writes, fd, parts, pos, sync):
        if _in_writer():
            fault(real, writes, fd, parts, pos, sync)
        return real(writes, fd, parts, pos, sync)
    monkeypatch.setattr(writer, "_commit_write", commit_write)


@pytest.mark.parametrize("path", PATHS)
def test_injected_enospc_cuts_the_batch_back(data_dir, monkeypatch, path):
    real_pwrite = os.pwrite
    fail = {"on": False}

    def half_then_enospc(real, writes, fd, parts, pos, sync):
        if fail["on"]:   # the index entries and half the log bytes land, then ENOSPC
            data = b"".join(parts)
            real(writes, fd, [data[:len(data) // 2]], pos, False)
            raise OSError(errno.ENOSPC, "No space left on device")
    _commit_path(monkeypatch, path, half_then_enospc)

    def pwrite(fd, data, pos):
        if fail["on"] and _in_writer() and len(data) > 16 * 3:
            n = real_pwrite(fd, bytes(data)[:len(data) // 2], pos)  # half lands, then ENOSPC
            assert n > 0
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, pos)

    async def main():
        s = Store.open(config(data_dir, segment_bytes=1 << 20))
        ok = await s.append([rec("t", "A", i) for i in range(10)])
        end = s.log_end
        monkeypatch.setattr(os, "pwrite", pwrite)
        fail["on"] = True
        with pytest.raises(StoreFull, match="disk full"):
            await s.append([rec("t", "A", i) for i in range(10, 20)])
        fail["on"] = False
        assert s.log_end == end and s.queue_end("t") == 10
        seg = os.path.join(data_dir, "message.log", "00000000000000000000.log")
        assert os.path.getsize(seg) == end  # the half-written batch is gone
        again = await s.append([rec("t", "A", i) for i in range(10, 20)])  # not duplicates
        assert not any(a.duplicate for a in again)
        assert [a.queue_offset for a in again] == list(range(10, 20))
        assert [r.seq for r in s.read("t", 0, 100)] == list(range(20))
        assert ok[0].offset == 0
        await s.close()
    run(main())
    assert check_dir(str(data_dir)).ok


@pytest.mark.parametrize("path", PATHS)
def test_failed_fsync_stops_all_writes_until_restart(data_dir, monkeypatch, path):
    real = os.fdatasync
    state = {"fail": False}

    def written_then_eio(real_commit, writes, fd, parts, pos, sync):
        if state["fail"] and sync:   # the writes land, the fdatasync fails
            real_commit(writes, fd, parts, pos, False)
            raise OSError(errno.EIO, "Input/output error")
    _commit_path(monkeypatch, path, written_then_eio)

    def fdatasync(fd):
        if state["fail"] and _in_writer():
            raise OSError(errno.EIO, "Input/output error")
        return real(fd)

    async def main():
        s = Store.open(config(data_dir))
        await s.append([rec("t", "A", 1)])
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        state["fail"] = True
        with pytest.raises(StoreFailed):
            await s.append([rec("t", "A", 2)])
        state["fail"] = False
        with pytest.raises(StoreFailed):  # no more writes, even though fsync works again
            await s.append([rec("t", "A", 3)])
        assert s.queue_end("t") == 1 and [r.seq for r in s.read("t", 0, 9)] == [1]
        await s.close()
        s = Store.open(config(data_dir))
        assert [r.seq for r in s.read("t", 0, 9)] == [1]
        assert not (await s.append([rec("t", "A", 2)]))[0].duplicate
        await s.close()
    run(main())


def test_full_queue_answers_busy(data_dir):
    import asyncio

    async def main():
        s = Store.open(config(data_dir, max_pending_bytes=2000, max_batch_bytes=4096,
                              max_record_bytes=1024))
        outcomes = await asyncio.gather(
            *[s.append([rec("t", f"S{i}", 1)]) for i in range(300)], return_exceptions=True)
        busy = [o for o in outcomes if isinstance(o, StoreBusy)]
        done = [o for o in outcomes if isinstance(o, list)]
        assert busy and done and len(busy) + len(done) == 300
        assert s.queue_end("t") == len(done)
        await s.close()
    run(main())


def test_index_with_many_dead_entries_is_rewritten_at_open(data_dir, monkeypatch):
    monkeypatch.setattr(engine, "REBASE_DEAD_ENTRIES", 10)

    async def main():
        s = Store.open(config(data_dir, segment_bytes=2048, retention_ms=1))
        for i in range(0, 200, 5):
            await s.append([rec("t", "A", k) for k in range(i, i + 5)])
        s.enforce_retention({}, now_ms=10**15)
        start, end = s.queue_start("t"), s.queue_end("t")
        assert start > 10
        await s.close()
        s = Store.open(config(data_dir, segment_bytes=2048))
        assert (s.queue_start("t"), s.queue_end("t")) == (start, end)
        assert os.path.getsize(os.path.join(data_dir, "offset-t.log")) == 16 + 16 * (end - start)
        assert [r.seq for r in s.read("t", start, 3)] == [start, start + 1, start + 2]
        await s.close()
    run(main())


@pytest.mark.parametrize("path", PATHS)
def test_reads_and_the_loop_never_wait_for_an_fsync(data_dir, monkeypatch, path):
    """While the writer thread is stuck in fdatasync, the event loop runs, reads
    answer at once, and the records being synced are not visible yet."""
    import asyncio

    real = os.fdatasync
    gate = threading.Event()
    entered = threading.Event()
    armed = threading.Event()   # from the second append on (the first one must not stick:
    #                             it held the test 10 s, and set `entered` too early)

    def slow_sync(real_commit, writes, fd, parts, pos, sync):
        if sync and armed.is_set() and not gate.is_set():   # written; stuck before the sync ends
            real_commit(writes, fd, parts, pos, False)
            entered.set()
            gate.wait(10)
    _commit_path(monkeypatch, path, slow_sync)

    def slow_fdatasync(fd):
        if _in_writer() and not gate.is_set():
            entered.set()
            gate.wait(10)
        return real(fd)

    async def main():
        s = Store.open(config(data_dir))
        await s.append([rec("t", "A", i) for i in range(5)])
        seen = []
        s.on_durable(lambda topic, end: seen.append(end))
        monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
        armed.set()
        pending = asyncio.ensure_future(s.append([rec("t", "A", i) for i in range(5, 9)]))
        while not entered.is_set():  # the loop keeps running while the thread waits
            await asyncio.sleep(0.005)
        got = s.read("t", 0, 100)  # would hang here if reads waited for the fsync
        assert [r.seq for r in got] == list(range(5))  # written, not durable: invisible
        assert s.queue_end("t") == 5 and not pending.done() and seen == []
        gate.set()
        res = await pending
        assert [a.queue_offset for a in res] == [5, 6, 7, 8] and seen == [9]
        assert [r.seq for r in s.read("t", 0, 100)] == list(range(9))
        await s.close()
    run(main())


def test_a_batch_the_writer_cannot_plan_is_refused_not_left_waiting(data_dir, monkeypatch):
    """An error while planning a group commit (a compiled loop's MemoryError, say)
    answers that batch's calls with StoreFailed -- it used to kill the writer thread
    and leave them waiting forever -- and the next append is stored as if it never
    came: nothing of the failed plan was written or counted."""
    import asyncio
    real = writer.GroupCommit._plan
    state = {"fail": True}

    def plan(self, batch):
        if state["fail"]:
            state["fail"] = False
            raise MemoryError("injected")
        return real(self, batch)
    monkeypatch.setattr(writer.GroupCommit, "_plan", plan)

    async def main():
        s = Store.open(config(data_dir))
        with pytest.raises(StoreFailed, match="MemoryError"):
            await asyncio.wait_for(s.append([rec("t", "A", 1)]), 10)
        again = await asyncio.wait_for(s.append([rec("t", "A", 1), rec("t", "A", 2)]), 10)
        assert [(a.queue_offset, a.duplicate) for a in again] == [(0, False), (1, False)]
        assert [r.seq for r in s.read("t", 0, 10)] == [1, 2]
        await s.close()
    run(main())
    assert check_dir(str(data_dir)).ok


def test_a_short_index_write_is_finished(data_dir, monkeypatch):
    """pwrite may write less than asked without an error: the Python path goes on
    with the rest of the index entries, as the log bytes (Segment.write_at) and the
    compiled commit_write do, instead of counting entries that never landed."""
    real_pwrite = os.pwrite
    state = {"short": 0}

    def pwrite(fd, data, pos):
        if _in_writer() and state["short"] == 0 and len(data) == 16 * 5:  # the index write
            state["short"] += 1
            return real_pwrite(fd, bytes(data)[:40], pos)
        return real_pwrite(fd, data, pos)
    monkeypatch.setattr(writer, "_commit_write", None)
    monkeypatch.setattr(os, "pwrite", pwrite)

    async def main():
        s = Store.open(config(data_dir, segment_bytes=1 << 20))
        got = await s.append([rec("t", "A", i) for i in range(5)])
        assert state["short"] == 1
        assert [r.seq for r in s.read("t", 0, 10)] == list(range(5))
        assert [r.offset for r in s.read("t", 0, 10)] == [a.offset for a in got]
        await s.close()
    run(main())
    assert check_dir(str(data_dir)).ok
