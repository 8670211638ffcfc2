"""Producer and consumer against the real broker over TCP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from lockmq.client import (
    Admin,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    PostgresIdempotency,
    Producer,
    SqliteIdempotency,
)
from lockmq.testing import wait_for

PG_DSN = os.environ.get("LOCKMQ_TEST_PG_DSN")


async def _wait_for(pred, timeout: float = 30.0, step: float = 0.02) -> bool:
    """Poll ``pred`` until true or ``timeout`` (bounded waits, not timed asserts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(step)
    return pred()


def test_three_send_modes_reach_a_consumer(broker):
    async def main():
        async with AsyncProducer(broker.address, name="modes") as p:
            r = await p.send("orders", b"sync-0")
            assert r.message_id == f"{p.producer_id}:0" and not r.duplicate
            futs = [p.send_async("orders", b"async-%d" % i) for i in range(200)]
            callbacks = []
            futs.append(p.send_async("orders", b"async-cb", callback=callbacks.append))
            results = await asyncio.gather(*futs)
            assert sorted(x.seq for x in results) == list(range(1, 202))
            assert len(callbacks) == 1 and callbacks[0].result().seq == 201
            for i in range(5):
                p.send_oneway("orders", b"oneway-%d" % i)
            # a sync send after the oneways: the broker handles one connection in order
            await p.send("orders", b"sync-last")
        seen: list[bytes] = []

        async def handler(msg):
            seen.append(msg.payload)

        c = AsyncConsumer(broker.address, topic="orders", cluster="audit", handler=handler)
        await c.start()
        assert await _wait_for(lambda: len(seen) >= 208)
        await c.stop()
        assert len(seen) == 208 and len(set(seen)) == 208
        assert seen.count(b"sync-last") == 1
        assert c.stats["acked"] == 208 and c.stats["nacked"] == 0

    asyncio.run(main())


def test_blocking_producer_and_consumer(broker):
    with Producer(broker.address) as p:
        assert p.send_sync("t.blocking", b"one").seq == 0
        futs = [p.send_async("t.blocking", b"n%d" % i) for i in range(50)]
        assert [f.result(10).seq for f in futs] == list(range(1, 51))
        p.send_oneway("t.blocking", b"last")
        p.flush(10)
    got: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def handler(msg):
        with lock:
            got.append(msg.id)
            if len(got) >= 52:
                done.set()

    c = Consumer(broker.address, topic="t.blocking", cluster="blk", handler=handler,
                 max_workers=4)
    c.start()
    done.wait(30)
    c.stop()
    assert len(got) == 52 and len(set(got)) == 52


def _effects_db(path: str) -> SqliteIdempotency:
    idem = SqliteIdempotency(path, scope="billing", synchronous="NORMAL")
    idem._conn().execute("CREATE TABLE IF NOT EXISTS effects (msg_id TEXT, amount INTEGER)")
    return idem


def _exactly_once_run(broker, idem, count: int, effects_sql: str, count_sql: str):
    """Publish ``count`` messages while consumers join and leave; check one effect each."""
    calls: list[str] = []
    calls_lock = threading.Lock()

    def work(conn, msg):
        with calls_lock:
            calls.append(msg.id)
        conn.execute(effects_sql, (msg.id, 1))
        time.sleep(0.0005)

    handler = idem.wrap(work)

    async def main():
        producer = AsyncProducer(broker.address, name="stream")
        await producer.connect()
        # The stream comes in three parts, each released by a membership change, so
        # every member is in the cluster while messages still arrive (a producer that
        # raced ahead left nothing for the member that joined last).
        released = [asyncio.Event(), asyncio.Event(), asyncio.Event()]

        async def publish():
            for part in range(3):
                await released[part].wait()
                for i in range(part * count // 3, (part + 1) * count // 3):
                    await producer.send("payments", b"pay-%d" % i)
                    if i % 50 == 0:
                        await asyncio.sleep(0.005)

        pub = asyncio.ensure_future(publish())

        def member(n):
            return AsyncConsumer(broker.address, topic="payments", cluster="billing",
                                 handler=handler, min_workers=2, max_workers=4, batch=8,
                                 consumer_id=f"member-{n}")

        a = member(1)
        await a.start()
        released[0].set()
        await _wait_for(lambda: len(calls) >= count // 5)
        b = member(2)
        await b.start()                      # joins mid-stream
        released[1].set()
        await _wait_for(lambda: len(calls) >= count // 2)
        await a.stop(drain_timeout_s=5)      # leaves mid-stream
        c = member(3)
        await c.start()                      # joins before the last part is published
        released[2].set()
        await pub
        await producer.close()
        ok = await _wait_for(lambda: idem.count() >= count, timeout=60)
        for m in (b, c):
            await m.stop()
        return ok, a, b, c

    ok, a, b, c = asyncio.run(main())
    assert ok, f"processed {idem.count()} of {count}"
    rows = idem._conn().execute(count_sql).fetchall()
    if hasattr(idem._conn(), "rollback"):
        try:
            idem._conn().rollback()
        except Exception:
            pass
    assert len(rows) == count
    assert all(n == 1 for _, n in rows), "a message had a second effect"
    # every member did some of the work
    assert a.stats["acked"] > 0 and b.stats["acked"] > 0 and c.stats["acked"] > 0
    return calls


def test_members_join_and_leave_every_message_once_sqlite(broker, tmp_path):
    idem = _effects_db(str(tmp_path / "app.db"))
    calls = _exactly_once_run(
        broker, idem, 1500,
        "INSERT INTO effects VALUES (?, ?)",
        "SELECT msg_id, count(*) FROM effects GROUP BY msg_id")
    assert len(set(calls)) == 1500
    idem.close()


@pytest.mark.skipif(not PG_DSN, reason="set LOCKMQ_TEST_PG_DSN to test PostgreSQL")
def test_members_join_and_leave_every_message_once_postgres(broker):
    import uuid

    table = "e2e_" + uuid.uuid4().hex[:8]
    idem = PostgresIdempotency(PG_DSN, table=table + "_processed", scope="billing")
    conn = idem._conn()
    conn.execute(f"CREATE TABLE {table} (msg_id TEXT, amount INTEGER)")
    conn.commit()
    try:
        _exactly_once_run(
            broker, idem, 600,
            f"INSERT INTO {table} VALUES (%s, %s)",
            f"SELECT msg_id, count(*) FROM {table} GROUP BY msg_id")
    finally:
        conn = idem._conn()
        conn.rollback()
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"DROP TABLE IF EXISTS {table}_processed")
        conn.commit()
        idem.close()


def test_handler_exception_nacks_retries_then_dead_letters(broker):
    attempts: dict[str, int] = {}

    async def handler(msg):
        attempts[msg.id] = attempts.get(msg.id, 0) + 1
        if msg.payload == b"poison":
            raise ValueError("cannot parse")
        if msg.payload == b"flaky" and msg.delivery < 2:
            raise RuntimeError("database down")

    async def main():
        async with AsyncProducer(broker.address, producer_id="retry-test") as p:
            for body in (b"fine", b"flaky", b"poison"):
                await p.send("jobs", body)
        c = AsyncConsumer(broker.address, topic="jobs", cluster="workers", handler=handler)
        await c.start()
        # max_retries = 2: the poison message is tried 3 times, then dead-lettered
        ok = await _wait_for(lambda: attempts.get("retry-test:2", 0) >= 3 and
                             attempts.get("retry-test:1", 0) >= 2, timeout=30)
        await asyncio.sleep(0.3)
        await c.stop()
        return ok, c

    ok, c = asyncio.run(main())
    assert ok, attempts
    assert attempts["retry-test:0"] == 1
    assert attempts["retry-test:1"] == 2
    assert attempts["retry-test:2"] == 3
    with Admin(broker.address) as admin:
        dead = wait_for(lambda: admin.request("dlq.list", cluster="workers")["messages"],
                        "a dead letter")
        assert [m["msg_id"] for m in dead] == ["retry-test:2"]
        assert "cannot parse" in dead[0]["reason"]


def test_worker_pool_grows_with_backlog_and_shrinks_when_idle(broker):
    async def main():
        async with AsyncProducer(broker.address) as p:
            await asyncio.gather(*[p.send_async("slow", b"x") for _ in range(400)])
        peak = 0
        done = []

        async def handler(msg):
            await asyncio.sleep(0.01)
            done.append(msg.id)

        c = AsyncConsumer(broker.address, topic="slow", cluster="scaled", handler=handler,
                          min_workers=1, max_workers=8, target_per_worker=20,
                          idle_shrink_s=0.2, batch=16)
        await c.start()
        while len(done) < 400:
            peak = max(peak, c.workers)
            await asyncio.sleep(0.02)
        assert await _wait_for(lambda: c.workers == 1, timeout=20)
        await c.stop()
        return peak

    assert asyncio.run(main()) == 8
