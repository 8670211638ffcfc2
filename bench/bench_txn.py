"""Transactional publish rate against plain publish, in the same run.

    python bench/bench_txn.py [--messages 2000] [--senders 16] [--runs 3] [--quick]

One ``lockmq broker`` process (auth off, default fsync policy). Each run measures
back to back: ``--senders`` asyncio tasks each awaiting ``AsyncProducer.send`` (a
PUBLISH, acked after the group commit), then the same with
``TransactionProducer.send`` (TXN_PUBLISH acked after its group commit, an empty
local transaction, TXN_END acked after the record and the op record are stored:
three appends per message). The ratio txn/plain of each run is what to compare.
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

from lockmq.client import AsyncProducer, TransactionProducer  # noqa: E402
from lockmq.client.transaction import COMMIT  # noqa: E402
from lockmq.testing import BrokerProcess  # noqa: E402

PAYLOAD = b'{"card": "0a1b2c3d4e5f6071", "lock": "LK-0A1B2C3D"}'


async def _commit(msg: object, arg: object) -> int:
    return COMMIT


async def rate(address: str, n: int, senders: int, txn: bool) -> float:
    per = n // senders
    if txn:
        clients = [TransactionProducer(address, group="bench", local_transaction=_commit,
                                       check=lambda m: COMMIT) for _ in range(senders)]
    else:
        clients = [AsyncProducer(address, name="bench") for _ in range(senders)]
    for c in clients:
        await c.connect()

    async def one(c: object) -> None:
        for _ in range(per):
            await c.send("bench.txn" if txn else "bench.plain", PAYLOAD)   # type: ignore[attr-defined]

    t = time.perf_counter()
    await asyncio.gather(*(one(c) for c in clients))
    elapsed = time.perf_counter() - t
    for c in clients:
        await c.close()
    return per * senders / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--senders", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="500 messages, 3 runs")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.runs = 500, 3
    print(machine_info())
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data", {"broker": {"auth": "off"}})
        try:
            plains, txns, ratios = [], [], []
            for txn in (False, True):   # warm up: imports, first segment, page cache
                asyncio.run(rate(broker.address, 10 * args.senders, args.senders, txn))
            for _ in range(args.runs):
                p = asyncio.run(rate(broker.address, args.messages, args.senders, False))
                t = asyncio.run(rate(broker.address, args.messages, args.senders, True))
                plains.append(p)
                txns.append(t)
                ratios.append(t / p)
        finally:
            broker.stop()
    print(f"{args.messages} messages, {args.senders} concurrent senders, {args.runs} runs "
          "(min / median / max)")
    print(f"plain publish (send, acked):            {spread(plains)} msg/s")
    print(f"transactional (half, local, commit):    {spread(txns)} msg/s")
    print(f"  ratio transactional/plain:            {spread(ratios)}")


if __name__ == "__main__":
    main()
