"""What one simulated lock costs the load generator in Python, per protocol.

The sync figures of ``bench_broker.py`` are the load generator's when its core is
busy, so its lockmq lock (``loadgen.LeanLock``) must not cost it more per record than
its MQTT client (``peers.LeanMqtt``) does, or the ratio to Mosquitto would measure
the generator. This times the steady state of each, without sockets: an ack read
(``data_received``), the next record built, the write handed over -- over ``--locks``
locks in turn, so the objects of many locks compete for the cache as they do in a
run. Best of ``--rounds`` rounds; µs per record::

    taskset -c 1 .venv/bin/python bench/gen_lock_cost.py
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loadgen  # noqa: E402  (bench/ on sys.path: run as a script)
import peers  # noqa: E402
from machine import machine_info  # noqa: E402

from lockmq.protocol import PublishAck  # noqa: E402
from lockmq.protocol.batch import publish_ack_frame  # noqa: E402


class NullTransport:
    """A transport that takes every write and keeps nothing."""

    def write(self, data: bytes) -> None:
        pass


def make_locks(kind: str, n: int, stats: dict) -> list:
    """``n`` started locks of ``kind`` (one record in flight each)."""
    payload = loadgen.record(random.Random(1))
    topic = "lock.events"
    tp = struct.pack(">B", len(topic)) + topic.encode()
    locks = []
    for j in range(n):
        sn = f"BENCH-{j:06d}"
        if kind == "lockmq":
            lock = loadgen.LeanLock(sn, tp, payload, 1, stats, [], 1 << 30, None)
        else:
            lock = peers.LeanMqtt(sn, payload, 1, stats, [], 1 << 30, None)
        lock.connection_made(NullTransport())   # (its CONNECT goes nowhere)
        lock.start()
        locks.append(lock)
    return locks


def ack_of(kind: str, lock) -> bytes:  # type: ignore[no-untyped-def]
    """The server's ack of the record ``lock`` has in flight."""
    key = next(iter(lock.sent_at))
    if kind == "lockmq":
        return publish_ack_frame(PublishAck.STORED, 0, key)
    return b"\x40\x02" + struct.pack(">H", key)


def per_record_us(kind: str, n: int, rounds: int) -> float:
    """Best µs per record over ``rounds`` rounds of one ack to each of ``n`` locks."""
    stats = {"busy": 0, "errors": 0, "lost_in_flight": 0}
    locks = make_locks(kind, n, stats)
    best = float("inf")
    for _ in range(rounds):
        acks = [ack_of(kind, lock) for lock in locks]
        t0 = time.perf_counter()
        for lock, ack in zip(locks, acks):
            lock.data_received(ack)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    if stats["errors"]:
        raise SystemExit(f"{kind}: {stats['errors']} acks not matched: the bench is wrong")
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--locks", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    print(machine_info())
    print("µs per record in the load generator's Python (ack read, next record, write)")
    for n in args.locks:
        lockmq = per_record_us("lockmq", n, args.rounds)
        mqtt = per_record_us("mqtt", n, args.rounds)
        print(f"{n:6d} locks: lockmq {lockmq:.3f}  MQTT {mqtt:.3f}  lockmq/MQTT {lockmq / mqtt:.2f}")


if __name__ == "__main__":
    main()
