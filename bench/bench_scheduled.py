"""Scheduled delivery benchmark: N messages due at the same second, delivered on time?

    python bench/bench_scheduled.py              # 100,000 due at one second, 1 run
    python bench/bench_scheduled.py --quick      # 5,000, 3 runs (a minute at most)

Each run, against one in-process broker (system clock, fsync as configured):

1. baseline: N plain PUBLISHes through ``AsyncProducer.send_async`` (window 1000),
   rate in msg/s;
2. the same N as scheduled sends (``deliver_at`` = one whole second, chosen so that
   the submits are done before it), submit rate in msg/s;
3. the broker writes them to their topic when due: each record's broker timestamp
   minus the due time is its lateness (ms, min / median / p99 / max) and N over the
   time to the last one is the delivery rate.

Ratios (scheduled submit / plain, delivery / plain) are of figures measured in the
same run; the spread over runs is min / median / max.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info, spread  # noqa: E402

from lockmq.client import AsyncProducer  # noqa: E402
from lockmq.client.sync import new_event_loop  # noqa: E402
from lockmq.testing import BrokerThread, wait_for  # noqa: E402

PAYLOAD = b"r" * 24
WINDOW = 1000


async def _send_all(endpoint: str, topic: str, n: int, deliver_at: float | None) -> float:
    """Send n messages (scheduled when ``deliver_at``); returns msg/s to the last ack."""
    prod = AsyncProducer(endpoint, name="bench", max_in_flight=WINDOW + 1)
    await prod.connect()
    sem = asyncio.Semaphore(WINDOW)
    when = {} if deliver_at is None else {"deliver_at": deliver_at}
    futs = []
    t0 = time.perf_counter()
    for _ in range(n):
        await sem.acquire()
        f = prod.send_async(topic, PAYLOAD, **when)
        f.add_done_callback(lambda _f: sem.release())
        futs.append(f)
    res = await asyncio.gather(*futs)
    secs = time.perf_counter() - t0
    await prod.close()
    assert all(not r.duplicate for r in res)
    return n / secs


def _lateness(b: BrokerThread, topic: str, due_ms: float, n: int) -> list[float]:
    """Every delivered record's broker timestamp minus its due time, in ms."""
    async def read() -> list[float]:
        store = b.broker.core.store
        out: list[float] = []
        q = 0
        while q < n:
            recs = store.read(topic, q, 5000)
            out.extend(r.broker_ts_us / 1000 - due_ms for r in recs)
            q += len(recs)
        return out
    return b.run(read())


def one_run(n: int, data_dir: str) -> dict[str, float]:
    with BrokerThread(data_dir, scheduled={"max_per_principal": n + 1,
                                           "max_total": n + 1}) as b:
        loop = new_event_loop()
        try:
            plain = loop.run_until_complete(_send_all(b.address, "plain", n, None))
            # due at a whole second, after the submits (at 1/2 the plain rate) are done
            due_s = math.ceil(time.time() + 2.0 + 2.0 * n / plain)
            sched = loop.run_until_complete(_send_all(b.address, "sched", n, float(due_s)))
        finally:
            loop.close()
        assert time.time() < due_s, "submits took longer than planned: lateness is invalid"
        sch = b.broker.scheduler
        wait_for(lambda: sch.held == 0, "all scheduled messages delivered",
                 timeout=max(120.0, due_s - time.time() + 60))
        late = sorted(_lateness(b, "sched", due_s * 1000.0, n))
    assert len(late) == n, f"{len(late)} of {n} delivered"
    assert late[0] >= 0, "a message was delivered before its time"
    return {"plain": plain, "submit": sched, "delivery": n / (late[-1] / 1000 or 1e-3),
            "late_min": late[0], "late_median": statistics.median(late),
            "late_p99": late[int(0.99 * (n - 1))], "late_max": late[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", "-n", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="5,000 messages, 3 runs")
    args = ap.parse_args()
    n, runs = (5000, 3) if args.quick else (args.messages, args.runs)
    print(machine_info())
    print(f"{n:,} scheduled messages due at the same second, {runs} run(s)")
    results = []
    for i in range(runs):
        with tempfile.TemporaryDirectory(prefix="lockmq-bench-sched-") as d:
            r = one_run(n, d + "/data")
        results.append(r)
        print(f"run {i + 1}: plain {r['plain']:,.0f} msg/s, scheduled submit "
              f"{r['submit']:,.0f} msg/s, delivery {r['delivery']:,.0f} msg/s; lateness ms "
              f"min {r['late_min']:.1f} median {r['late_median']:.1f} "
              f"p99 {r['late_p99']:.1f} max {r['late_max']:.1f}")

    def col(k: str) -> list[float]:
        return [r[k] for r in results]
    print("summary (min / median / max over runs):")
    print(f"  plain publish           {spread(col('plain'))} msg/s")
    print(f"  scheduled submit        {spread(col('submit'))} msg/s   "
          f"ratio to plain {spread([r['submit'] / r['plain'] for r in results])}")
    print(f"  delivery when due       {spread(col('delivery'))} msg/s   "
          f"ratio to plain {spread([r['delivery'] / r['plain'] for r in results])}")
    for k in ("late_min", "late_median", "late_p99", "late_max"):
        print(f"  lateness {k[5:]:<14} {spread(col(k))} ms")


if __name__ == "__main__":
    main()
