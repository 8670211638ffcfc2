"""The broker's batching of store work (issue #14): system records of one loop
iteration go to the store in one group commit, and one bad record does not cost the
others; the publish path answers through the store's callback (no task)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from lockmq.broker.core import BROKER_SN, BrokerCore
from lockmq.broker.logs import EventLog, Stats
from lockmq.broker.publish import PublishPath, PublishRefused
from lockmq.config import config_from_dict
from lockmq.store import Appended, InvalidRecord, NewRecord
from lockmq.testing import wait_for_async


def _core(tmp_path: Any) -> tuple[BrokerCore, io.StringIO]:
    out = io.StringIO()
    cfg = config_from_dict({"broker": {"data_dir": str(tmp_path / "data")}})
    core = BrokerCore(cfg, EventLog("DEBUG", stream=out), Stats())
    core.open()
    return core, out


async def _settle(core: BrokerCore) -> None:
    """Until the background system writes are done (no sleeping for luck)."""
    while core._tasks:
        await asyncio.wait(list(core._tasks))
    # system records go to the store (on a timer, or with a client append) through a
    # callback, not a task
    await wait_for_async(lambda: core.system_idle, "system records stored")


def test_system_records_of_one_loop_iteration_share_one_group_commit(tmp_path) -> None:
    async def run() -> None:
        core, _ = _core(tmp_path)
        assert core.store is not None
        batches = core.store.stats["batches"]
        for i in range(50):
            core.publish_system("$devices", b'{"n":%d}' % i)
        await _settle(core)
        assert core.store.stats["batches"] == batches + 1
        got = core.store.read("$devices", 0, 100)
        assert [r.payload for r in got] == [b'{"n":%d}' % i for i in range(50)]
        assert {r.sn for r in got} == {BROKER_SN}
        assert len({r.seq for r in got}) == 50
        await core.close()

    asyncio.run(run())


def test_system_records_ride_the_next_client_append_in_its_group_commit(tmp_path) -> None:
    """A storm: each lock's ``online`` event and its first PUBLISH cost one group
    commit, not two -- the waiting system records go to the store with the client
    append, ahead of it, and the timer then finds nothing to store."""
    async def run() -> None:
        core, _ = _core(tmp_path)
        assert core.store is not None
        batches = core.store.stats["batches"]
        core.publish_system("$devices", b'{"event":"online"}')
        answered: list = []
        core.append_then([NewRecord("t", "lock-a", 1, 1, b"a1")],
                         lambda res, exc: answered.append((res, exc)))
        assert core.system_pending == 1 and not core._sys_batch   # handed over with it
        await wait_for_async(lambda: answered and core.system_idle, "both stored")
        assert answered[0][1] is None and not answered[0][0][0].duplicate
        assert core.store.stats["batches"] == batches + 1
        devices = core.store.read("$devices", 0, 10)
        assert [r.payload for r in devices] == [b'{"event":"online"}']
        assert devices[0].offset < core.store.read("t", 0, 10)[0].offset   # ahead of it
        # the flush timer armed by publish_system fires on an empty batch: wait until
        # it fired (it clears its handle) and anything it stored is answered (pending
        # counts from the timer's own call), then check it stored nothing
        await wait_for_async(lambda: core._sys_timer is None and core.system_idle,
                             "the flush timer fired")
        assert core.store.stats["batches"] == batches + 1
        await core.close()

    asyncio.run(run())


def test_a_waiting_system_record_is_stored_ahead_of_an_awaited_append(tmp_path) -> None:
    async def run() -> None:
        core, _ = _core(tmp_path)
        assert core.store is not None
        core.publish_system("$devices", b'{"event":"online"}')
        (stored,) = await core.append([NewRecord("t", "lock-a", 1, 1, b"a1")])
        await wait_for_async(lambda: core.system_idle, "system record stored")
        assert core.store.read("$devices", 0, 10)[0].offset < stored.offset
        await core.close()

    asyncio.run(run())


def test_a_bad_waiting_system_record_costs_neither_the_client_append_nor_the_others(
        tmp_path) -> None:
    async def run() -> None:
        core, out = _core(tmp_path)
        assert core.store is not None
        core.publish_system("bad topic with spaces", b"refused")
        core.publish_system("$devices", b"ok")
        answered: list = []
        core.append_then([NewRecord("t", "lock-a", 1, 1, b"a1")],
                         lambda res, exc: answered.append((res, exc)))
        await wait_for_async(lambda: answered and core.system_idle, "both stored")
        assert answered[0][1] is None and len(answered[0][0]) == 1
        assert [r.payload for r in core.store.read("t", 0, 10)] == [b"a1"]
        assert [r.payload for r in core.store.read("$devices", 0, 10)] == [b"ok"]
        assert "system_publish_failed" in out.getvalue()
        await core.close()

    asyncio.run(run())


def test_a_bad_system_record_does_not_cost_the_others_of_its_batch(tmp_path) -> None:
    async def run() -> None:
        core, out = _core(tmp_path)
        assert core.store is not None
        core.publish_system("$devices", b"first")
        core.publish_system("bad topic with spaces", b"refused")
        core.publish_system("$devices", b"last")
        await _settle(core)
        got = core.store.read("$devices", 0, 10)
        assert [r.payload for r in got] == [b"first", b"last"]
        assert "system_publish_failed" in out.getvalue()
        # numbered once, as a batch: stored alone, the others keep their numbers
        assert [r.seq for r in got] == [0, 2]
        assert core.stats.c["system_records"] == 3
        await core.close()

    asyncio.run(run())


class _Sink:
    """A sink that answers like the store, counting its calls."""

    def __init__(self, core: BrokerCore) -> None:
        self.core = core
        self.calls = 0

    async def append(self, records: list[NewRecord]) -> list[Appended]:
        return await self.core.append(records)

    def append_then(self, records: list[NewRecord], then: Any) -> None:
        self.calls += 1
        self.core.append_then(records, then)


def test_publish_path_answers_every_submitter_and_refuses_only_the_bad_record(tmp_path) -> None:
    async def run() -> None:
        core, out = _core(tmp_path)
        sink = _Sink(core)
        path = PublishPath(sink, Stats(), EventLog("DEBUG", stream=out), max_batch=1000)
        answers: dict[str, list] = {}
        done = asyncio.Event()

        def answer(name: str):  # type: ignore[no-untyped-def]
            def got(results: list) -> None:
                answers[name] = results
                if len(answers) == 3:
                    done.set()
            return got

        path.submit([NewRecord("t", "lock-a", 1, 1, b"a1"), NewRecord("t", "lock-a", 2, 1, b"a2")],
                    answer("a"))
        path.submit([NewRecord("t", "lock-b", 1, 1, b"b1")], answer("b"))
        path.submit([NewRecord("t", "lock-a", 2, 1, b"again")], answer("dup"))
        await asyncio.wait_for(done.wait(), 10)
        assert sink.calls == 1   # three submitters, one group commit
        assert [a.duplicate for a in answers["a"] + answers["b"]] == [False] * 3
        assert answers["dup"][0].duplicate

        # a batch with an invalid record: stored one by one, only that one refused
        answers.clear()
        done.clear()
        path.submit([NewRecord("t", "lock-c", 1, 1, b"c1")], answer("c"))
        path.submit([NewRecord("no spaces allowed", "lock-c", 2, 1, b"x")], answer("bad"))
        path.submit([NewRecord("t", "lock-c", 3, 1, b"c3")], answer("c3"))
        await asyncio.wait_for(done.wait(), 10)
        assert isinstance(answers["bad"][0], InvalidRecord)
        assert not answers["c"][0].duplicate and not answers["c3"][0].duplicate
        assert [r.payload for r in core.store.read("t", 0, 10)] == [b"a1", b"a2", b"b1", b"c1",
                                                                   b"c3"]
        await core.close()

        # the store closed: the submitter is refused (SHUTTING_DOWN), never acked
        answers.clear()
        done.clear()
        path.submit([NewRecord("t", "lock-d", 1, 1, b"d")], answer("closed"))
        await wait_for_async(lambda: "closed" in answers, "the submitter answered")
        assert isinstance(answers["closed"][0], PublishRefused)

    asyncio.run(run())


@pytest.mark.parametrize("stale", ["api", "missing"])
def test_a_stale_compiled_core_runs_the_whole_process_in_pure_python(stale: str) -> None:
    """``lockmq._core`` is a build product a tree can keep from before a pull. One of
    another interface version, or one that lacks a function this tree calls, is not
    used at all (``lockmq.accel``'s one check at import): every layer then runs pure
    Python, never a mix (before issue #38 each call site took what it found, function
    by function, and one process could run any mix)."""
    import subprocess
    import sys

    from lockmq import accel

    if not accel.COMPILED:
        pytest.skip(f"needs the compiled core ({accel.DESCRIPTION})")
    code = (
        "import sys, types\n"
        "import lockmq, lockmq._core as built\n"
        "older = types.ModuleType('lockmq._core')\n"
        "older.__dict__.update({k: v for k, v in vars(built).items() if not k.startswith('__')})\n"
        f"if {stale!r} == 'api':\n"
        "    older.API = built.API + 1\n"
        "else:\n"
        "    del older.queue_run\n"
        "sys.modules['lockmq._core'] = lockmq._core = older\n"
        "from lockmq import accel\n"
        "from lockmq.broker import connection, intake, lane\n"
        "from lockmq.protocol import batch\n"
        "from lockmq.store import reads, writer\n"
        "assert not accel.COMPILED and 'stale build' in accel.DESCRIPTION, accel.DESCRIPTION\n"
        "assert connection._scan_publishes is None and intake._queue_run is batch.queue_run\n"
        "assert writer._plan_run is None and reads._read_run is None and lane.LANE_TYPE is None\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
