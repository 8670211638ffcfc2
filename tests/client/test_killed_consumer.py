"""A consumer process killed with SIGKILL while holding leases: others get its messages."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time

from lockmq.client import AsyncConsumer, AsyncProducer

HOLDER = textwrap.dedent("""
    import asyncio, sys
    from lockmq.client import AsyncConsumer

    async def main(addr):
        held = []
        async def handler(msg):          # never returns: keeps the lease
            held.append(msg.id)
            if len(held) == 4:
                print("holding", flush=True)
            await asyncio.Event().wait()
        c = AsyncConsumer(addr, topic="held", cluster="workers", handler=handler,
                          min_workers=4, max_workers=4, batch=4, prefetch=0,
                          backlog_poll_s=0)
        await c.start()
        await asyncio.Event().wait()

    asyncio.run(main(sys.argv[1]))
""")


def test_killed_member_leases_go_to_the_others_at_once(broker_factory):
    # A 60 s visibility timeout: if the held messages come back within the test's
    # 20 s, the broker released them because the connection died, not by timeout.
    broker = broker_factory(consumers={"visibility_timeout_ms": 60_000})

    async def main():
        async with AsyncProducer(broker.address, producer_id="held-test") as p:
            await asyncio.gather(*[p.send_async("held", b"m%d" % i) for i in range(20)])
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, broker.address],
                                stdout=subprocess.PIPE, text=True)
        try:
            line = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline), 30)
            assert line.strip() == "holding"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            proc.stdout.close()
        seen: dict[str, int] = {}

        async def handler(msg):
            seen[msg.id] = msg.delivery

        c = AsyncConsumer(broker.address, topic="held", cluster="workers", handler=handler)
        await c.start()
        deadline = time.monotonic() + 20
        while len(seen) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await c.stop()
        return seen

    seen = asyncio.run(main())
    assert sorted(seen) == sorted(f"held-test:{i}" for i in range(20))
    redelivered = [mid for mid, d in seen.items() if d > 1]
    assert len(redelivered) >= 4     # the held ones, delivered a second time
