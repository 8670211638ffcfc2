"""Producers and consumers ride through a broker killed with SIGKILL and restarted."""

from __future__ import annotations

import asyncio

from lockmq.client import AsyncConsumer, AsyncProducer, SqliteIdempotency
from lockmq.sim import SimConfig, SimStats, run_sim
from lockmq.client.session import Endpoint
from lockmq.testing import BrokerProcess, wait_for_async


def test_sigkill_mid_stream_loses_no_acknowledged_message(tmp_path):
    idem = SqliteIdempotency(str(tmp_path / "app.db"), synchronous="NORMAL")
    idem._conn().execute("CREATE TABLE effects (msg_id TEXT)")
    handler = idem.wrap(lambda conn, msg: conn.execute("INSERT INTO effects VALUES (?)",
                                                       (msg.id,)))
    count = 800
    broker = BrokerProcess(tmp_path / "data", {"broker": {"auth": "off"},
                                               "consumers": {"time_scale": 0.01}})
    port = broker.port
    try:
        async def main():
            producer = AsyncProducer(f"127.0.0.1:{port}", producer_id="restart-test",
                                     send_timeout_s=60)
            await producer.connect()
            consumer = AsyncConsumer(f"127.0.0.1:{port}", topic="doors", cluster="log",
                                     handler=handler, max_workers=4)
            await consumer.start()
            acked: list[str] = []

            async def publish(i):
                r = await producer.send("doors", b"event-%d" % i)
                acked.append(r.message_id)

            tasks = []
            for i in range(count):
                tasks.append(asyncio.ensure_future(publish(i)))
                if i % 20 == 0:
                    await asyncio.sleep(0.01)
                if i == count // 2:
                    broker.kill()
                    await asyncio.sleep(0.3)                    # down for a moment
                    await asyncio.get_running_loop().run_in_executor(None, broker.start)
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            await wait_for_async(lambda: idem.count() >= count, "every message consumed", 60)
            await consumer.stop()
            await producer.close()
            return acked, producer, consumer

        acked, producer, consumer = asyncio.run(main())
    finally:
        broker.stop()
    assert len(acked) == count and len(set(acked)) == count
    assert producer.reconnects >= 1 and consumer.reconnects >= 1
    rows = idem._conn().execute("SELECT msg_id, count(*) FROM effects GROUP BY msg_id").fetchall()
    assert {r[0] for r in rows} == set(acked), "an acknowledged message was never consumed"
    assert all(n == 1 for _, n in rows), "a redelivered message had a second effect"
    idem.close()


def test_simulated_locks_reconnect_and_retransmit_after_restart(broker_factory):
    b = broker_factory()
    port = b.port

    async def main():
        stats = SimStats()
        cfg = SimConfig(locks=20, events_per_lock=30, rate_per_lock=50, ack_timeout_s=10)
        sim = asyncio.ensure_future(run_sim(cfg, Endpoint("127.0.0.1", port), stats=stats))
        await wait_for_async(lambda: stats.acked >= 200, "200 acked events")
        await asyncio.get_running_loop().run_in_executor(None, b.stop)
        await asyncio.sleep(0.2)
        await asyncio.get_running_loop().run_in_executor(None, lambda: broker_factory(port=port))
        return await asyncio.wait_for(sim, 60)

    stats = asyncio.run(main())
    assert stats.acked == stats.sent == 600
    assert stats.reconnects >= 20
    assert stats.errors == 0
