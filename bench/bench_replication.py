"""What synchronous replication costs, and how long a failover takes.

    .venv/bin/python bench/bench_replication.py --quick   # ~1 min

Rounds alternate, in one run on one machine: a primary alone (the baseline) and a
sync primary with its standby (``[replication] sync = true``: an ack waits for the
standby's fsync). Each round: ``--producers`` lock peers, each with ``--window``
pipelined publishes, for ``--seconds``. Reported: acked publishes/s, min / median /
max over rounds, and sync as a ratio of the baseline median.

Failover: a sync primary under load is SIGKILLed; the standby is promoted at once
(what ``lockmq standby promote`` does, as an operator's script would) and a producer
with the broker list ``primary,standby`` gets its first ack from the promoted
standby. Reported: SIGKILL -> that ack, min / median / max over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import machine_info, spread  # noqa: E402

from lockmq.protocol import Op, Publish, Role, encode_frame  # noqa: E402
from lockmq.replication.standby import is_promoted, request_promotion  # noqa: E402
from lockmq.testing import BrokerProcess, free_port, open_peer, wait_for  # noqa: E402


def _primary(root: str, sync: bool) -> BrokerProcess:
    return BrokerProcess(os.path.join(root, "p", "data"), {
        "broker": {"auth": "off"}, "replication": {"sync": sync}})


def _standby(root: str, primary: BrokerProcess) -> BrokerProcess:
    return BrokerProcess(os.path.join(root, "s", "data"), {
        "broker": {"auth": "off", "port": free_port()},
        "replication": {"role": "standby", "primary": primary.address}},
        start=False).start(ready=r"standby_following")


def _in_sync(port: int) -> bool:
    p = open_peer(port, role=Role.ADMIN)
    try:
        return bool(p.admin("replica.status")["in_sync"])
    finally:
        p.close()


def _load(port: int, sn: str, window: int, until: float, counts: list[int]) -> None:
    """Pipelined publishes, ``window`` in flight; counts acks."""
    try:
        p = open_peer(port, sn=sn, role=Role.LOCK)
        seq = 0
        while time.monotonic() < until:
            ops = []
            frames = []
            for _ in range(window):
                op = p.next_opaque()
                ops.append(op)
                frames.append(encode_frame(Op.PUBLISH, sn,
                                           Publish("ev", seq, 0, b"r" * 64).encode(), op))
                seq += 1
            p.raw(b"".join(frames))
            for op in ops:
                if p.wait(op, timeout=30).opcode == Op.PUBLISH_ACK:
                    counts[0] += 1
        p.close()
    except (OSError, ConnectionError, TimeoutError):
        return


def rate(port: int, producers: int, window: int, seconds: float) -> float:
    """Acked publishes per second over ``seconds``."""
    counts = [[0] for _ in range(producers)]
    t0 = time.monotonic()
    until = t0 + seconds
    threads = [threading.Thread(target=_load, args=(port, f"LOCK-{i}-{t0}", window, until,
                                                    counts[i])) for i in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(c[0] for c in counts) / (time.monotonic() - t0)


def one_rate_round(sync: bool, a: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-repl-") as root:
        primary = _primary(root, sync)
        standby = _standby(root, primary) if sync else None
        try:
            if standby is not None:
                wait_for(lambda: _in_sync(primary.port), "standby in sync")
            return rate(primary.port, a.producers, a.window, a.seconds)
        finally:
            if standby is not None:
                standby.stop()
            primary.stop()


def one_failover(a: argparse.Namespace) -> float:
    """Seconds from the primary's SIGKILL to the first ack from the promoted standby."""
    from lockmq.client import AsyncProducer

    with tempfile.TemporaryDirectory(prefix="bench-failover-") as root:
        primary = _primary(root, True)
        standby = _standby(root, primary)
        try:
            wait_for(lambda: _in_sync(primary.port), "standby in sync")
            killed = threading.Event()
            out: list[float] = []
            t_kill = [0.0]

            async def produce() -> None:
                async with AsyncProducer(f"{primary.address},{standby.address}",
                                         producer_id="bench", send_timeout_s=60) as prod:
                    prod.backoff.cap_s = 0.05
                    prod.backoff.base_s = 0.01
                    while not killed.is_set():
                        await prod.send("ev", b"x" * 64)
                    while True:   # first ack after the kill: from the standby
                        await prod.send("ev", b"x" * 64)
                        if is_promoted(standby.data_dir):
                            out.append(time.monotonic() - t_kill[0])
                            return

            th = threading.Thread(target=asyncio.run, args=(produce(),))
            th.start()
            time.sleep(a.seconds / 2)   # load on the primary
            t_kill[0] = time.monotonic()
            primary.kill()
            killed.set()
            request_promotion(standby.data_dir)
            th.join(120)
            return out[0]
        finally:
            primary.kill()
            standby.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short rounds (~1 min)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--window", type=int, default=32)
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.seconds = 3, 2.0
    print("lockmq replication benchmark")
    print(machine_info())
    print(f"{a.rounds} rounds, {a.producers} producers x {a.window} in flight, "
          f"{a.seconds:g} s each\n", flush=True)
    base: list[float] = []
    sync: list[float] = []
    for r in range(a.rounds):
        base.append(one_rate_round(False, a))
        sync.append(one_rate_round(True, a))
        print(f"  round {r + 1}: alone {base[-1]:,.0f}/s   sync+standby {sync[-1]:,.0f}/s",
              flush=True)
    fail = [one_failover(a) for _ in range(a.rounds)]
    print("\nsummary (min / median / max)")
    print(f"  publish, primary alone     {spread(base)} acked/s")
    print(f"  publish, sync replication  {spread(sync)} acked/s   "
          f"= {statistics.median(sync) / statistics.median(base):.2f} x alone")
    print(f"  failover (SIGKILL -> first ack from the promoted standby)  "
          f"{spread(fail)} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
