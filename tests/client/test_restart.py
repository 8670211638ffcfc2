"""Producers and consumers ride through a broker killed with SIGKILL and restarted."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time

from lockmq.client import AsyncConsumer, AsyncProducer, SqliteIdempotency
from lockmq.sim import SimConfig, SimStats, run_sim
from lockmq.client.session import Endpoint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_broker(data_dir: str, port: int, log, *extra: str) -> subprocess.Popen:
    """A broker process on 127.0.0.1:``port`` (``extra``: more `lockmq broker` options)."""
    cmd = [sys.executable, "-c", "import sys, lockmq.cli; sys.exit(lockmq.cli.main())", "broker", "--host", "127.0.0.1",
           "--port", str(port), "--status-port", "0", "--data-dir", data_dir,
           "--auth", "off", "--time-scale", "0.01", "--log-level", "WARNING", *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("broker exited at start")
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("broker did not start listening")


def test_sigkill_mid_stream_loses_no_acknowledged_message(tmp_path):
    port = _free_port()
    data = str(tmp_path / "data")
    log = open(tmp_path / "broker.log", "wb")
    idem = SqliteIdempotency(str(tmp_path / "app.db"), synchronous="NORMAL")
    idem._conn().execute("CREATE TABLE effects (msg_id TEXT)")
    handler = idem.wrap(lambda conn, msg: conn.execute("INSERT INTO effects VALUES (?)",
                                                       (msg.id,)))
    count = 800
    proc = _start_broker(data, port, log)
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
                    nonlocal_proc[0].send_signal(signal.SIGKILL)
                    nonlocal_proc[0].wait(10)
                    await asyncio.sleep(0.3)
                    nonlocal_proc[0] = await asyncio.get_running_loop().run_in_executor(
                        None, _start_broker, data, port, log)
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            deadline = time.monotonic() + 60
            while idem.count() < count and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await consumer.stop()
            await producer.close()
            return acked, producer, consumer

        nonlocal_proc = [proc]
        acked, producer, consumer = asyncio.run(main())
        proc = nonlocal_proc[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
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
        while stats.acked < 200:
            await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, b.stop)
        await asyncio.sleep(0.2)
        await asyncio.get_running_loop().run_in_executor(None, lambda: broker_factory(port=port))
        return await asyncio.wait_for(sim, 60)

    stats = asyncio.run(main())
    assert stats.acked == stats.sent == 600
    assert stats.reconnects >= 20
    assert stats.errors == 0
