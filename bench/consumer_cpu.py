"""CPU the consumer client library spends per message (issue #14's drain figure).

Four ``lockmq.client.AsyncConsumer`` members with a no-op handler (loadgen's client
cluster, ``bench-client``, rewound to the topic's start first) drain a preloaded
topic of a running broker; prints the wall rate, the client process's CPU time per
message (``time.process_time``: what a busy neighbour on a shared machine moves
least), lost and duplicates. Compare two trees' clients against the same broker by
alternating runs::

    taskset -c 1 .venv/bin/python bench/loadgen.py deliver --messages 200000 --port P
    taskset -c 1 .venv/bin/python bench/consumer_cpu.py --port P --messages 200000
    PYTHONPATH=/tmp/base/host taskset -c 1 .venv/bin/python bench/consumer_cpu.py \\
        --port P --messages 200000
"""

from __future__ import annotations

import argparse
import asyncio
import time

from lockmq.client import AdminError, AsyncAdmin
from lockmq.client.session import Endpoint

from loadgen import _client_cluster  # noqa: E402  (bench/ is on sys.path: run as a script)

#: the cluster loadgen's ``_client_cluster`` consumes as
CLUSTER = "bench-client"


async def rewind(ep: Endpoint) -> None:
    """Move the client cluster back to the topic's start (every run drains it all)."""
    async with AsyncAdmin(ep) as admin:
        try:
            await admin.request("clusters.reset", cluster=CLUSTER, to="earliest")
        except AdminError as exc:
            if "no cluster" not in str(exc):   # a first run: nothing to rewind
                raise


async def drain(port: int, topic: str, total: int, members: int) -> str:
    """One drain of ``total`` messages: the line to print."""
    ep = Endpoint("127.0.0.1", port)
    await rewind(ep)
    c0 = time.process_time()
    got = await _client_cluster(ep, topic, members, total)
    cpu = time.process_time() - c0
    n = max(1, total - got["client_lost"])
    return (f"rate={got['client_rate']:.0f}/s cpu_us_per_msg={cpu / n * 1e6:.2f} "
            f"lost={got['client_lost']} duplicates={got['client_redelivered']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--topic", default="bench.events")
    ap.add_argument("--members", type=int, default=4)
    a = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(asyncio.run(drain(a.port, a.topic, a.messages, a.members)))


if __name__ == "__main__":
    main()
