"""CPU the consumer client library spends per message (issue #14's drain figure).

Four ``lockmq.client.AsyncConsumer`` members of a fresh cluster, no-op handler,
drain a preloaded topic of a running broker; prints the wall rate, the client
process's CPU time per message (``time.process_time``: what a busy neighbour on a
shared machine moves least), lost and duplicates. Compare two trees' clients
against the same broker by alternating runs::

    taskset -c 1 .venv/bin/python bench/loadgen.py deliver --messages 200000 --port P
    taskset -c 1 .venv/bin/python bench/consumer_cpu.py --port P --messages 200000 --cluster a1
    PYTHONPATH=/tmp/base/host taskset -c 1 .venv/bin/python bench/consumer_cpu.py \\
        --port P --messages 200000 --cluster b1
"""

from __future__ import annotations

import argparse
import asyncio
import time

from lockmq.client import AsyncConsumer


async def drain(port: int, total: int, cluster: str, members: int) -> str:
    seen: set = set()
    dup = 0
    done = asyncio.Event()

    async def handler(msg) -> None:  # type: ignore[no-untyped-def]
        nonlocal dup
        key = (msg.sn, msg.seq)
        dup += key in seen
        seen.add(key)
        if len(seen) >= total:
            done.set()

    cs = [AsyncConsumer(f"127.0.0.1:{port}", topic="bench.events", cluster=cluster,
                        handler=handler, min_workers=4, max_workers=4, batch=500,
                        backlog_poll_s=0, consumer_id=f"{cluster}-{k}") for k in range(members)]
    t0, c0 = time.monotonic(), time.process_time()
    for c in cs:
        await c.start()
    try:
        await asyncio.wait_for(done.wait(), 120)
    except asyncio.TimeoutError:
        pass
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    for c in cs:
        await c.stop()
    n = max(1, len(seen))
    return (f"rate={len(seen) / wall:.0f}/s cpu_us_per_msg={cpu / n * 1e6:.2f} "
            f"lost={total - len(seen)} duplicates={dup}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--cluster", default="cpu-probe", help="a cluster name not used before")
    ap.add_argument("--members", type=int, default=4)
    a = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(asyncio.run(drain(a.port, a.messages, a.cluster, a.members)))


if __name__ == "__main__":
    main()
