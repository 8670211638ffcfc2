"""Registry op cost, against the broker's own admin ``ping`` in the same run.

A campus of G gateways heartbeats G/30 times a second and every CampusConsumer looks
up once per ``lookup_every_s``; this measures how many heartbeats and lookups one
registry answers per second over one session, as a ratio of the cheapest broker
admin op (``ping``) measured the same way, in the same process, on this machine.

    python bench/bench_registry.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine_info, spread  # noqa: E402

from lockmq.broker.server import Broker  # noqa: E402
from lockmq.client.admin import AsyncAdmin  # noqa: E402
from lockmq.config import config_from_dict  # noqa: E402
from lockmq.registry.server import RegistryServer  # noqa: E402


async def rate(admin: AsyncAdmin, n: int, op: str, **args: object) -> float:
    """Sequential round trips per second of ``op``."""
    t0 = time.perf_counter()
    for _ in range(n):
        await admin.request(op, **args)
    return n / (time.perf_counter() - t0)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker(config_from_dict({"broker": {"port": 0, "auth": "off", "data_dir": tmp,
                                                     "log_level": "WARNING"}}))
        await broker.start()
        registry = RegistryServer(tokens=[b"bench.token"])
        registry.log.level = 30
        await registry.start()
        for g in range(args.gateways):   # a campus: G gateways of 20 topics, 1 shared
            registry.table.register({"name": f"gw-{g}", "addresses": [f"10.0.{g // 250}.{g % 250}:6800"],
                                     "topics": ["lock.events", *(f"t{g}.{i}" for i in range(19))]})
        b = AsyncAdmin(f"127.0.0.1:{broker.port}")
        r = AsyncAdmin(f"127.0.0.1:{registry.port}", token="bench.token")
        await b.connect()
        await r.connect()
        figures: dict[str, list[float]] = {"broker ping": [], "registry.heartbeat": [],
                                           "registry.lookup (1 topic)": [],
                                           "registry.lookup (all)": []}
        for _ in range(args.rounds):
            figures["broker ping"].append(await rate(b, args.n, "ping"))
            figures["registry.heartbeat"].append(await rate(r, args.n, "registry.heartbeat",
                                                            name="gw-0"))
            figures["registry.lookup (1 topic)"].append(
                await rate(r, args.n, "registry.lookup", topic="t7.3"))
            figures["registry.lookup (all)"].append(
                await rate(r, max(1, args.n // 10), "registry.lookup", topic="lock.events"))
        await b.close()
        await r.close()
        await registry.stop()
        await broker.stop()
    print(machine_info())
    print(f"{args.gateways} gateways x 20 topics; {args.rounds} rounds of {args.n} sequential "
          "round trips over one session (lookup of all: n/10)")
    base = sorted(figures["broker ping"])[len(figures["broker ping"]) // 2]
    for name, values in figures.items():
        med = sorted(values)[len(values) // 2]
        print(f"  {name:28s} {spread(values)} ops/s  (median {med / base:.2f}x broker ping)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="3 rounds of 300")
    p.add_argument("--gateways", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=1000)
    a = p.parse_args()
    if a.quick:
        a.rounds, a.n = 3, 300
    asyncio.run(main(a))
