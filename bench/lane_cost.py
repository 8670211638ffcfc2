"""The compiled lane's own time per record: plain frames against sealed ones.

One socketpair in a ``lockmq._core.Lane``; ``--records`` PUBLISH frames of one
lock written to it, then timed: one ``poll`` (read, checks, records made) and one
``answer`` (acks packed and sent), as the broker's loop makes them per group commit.
No broker, no store: what a record costs the loop thread in the lane's compiled
code, and what a frame MAC adds to it -- each PUBLISH's tag checked, each ack sealed
(with the SHA-256 ``sha2`` picked for this CPU), each kind in a fresh interpreter.
Min / median / max over ``--runs`` runs of the best of ``--rounds``::

    taskset -c 1 .venv/bin/python bench/lane_cost.py
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time

from machine import machine_info

KEY = bytes(range(32))
SN = "BENCH-000001"
TOPIC = "lock.bench"
KINDS = ("plain", "sealed")


def best_us_per_record(sealed: bool, records: int, rounds: int) -> float:
    """The best of ``rounds`` poll + answer calls over ``records`` frames, µs a record."""
    from lockmq import accel
    from lockmq.broker.lane import LANE_TYPE
    from lockmq.protocol import Op, Publish
    from lockmq.store import Appended, NewRecord
    from sessions import established_pair

    if LANE_TYPE is None:
        raise SystemExit(f"no compiled lane here: {accel.DESCRIPTION}")
    lock, broker = established_pair(sealed, SN, KEY)   # (the lane takes over the broker's)
    results = [Appended(i, TOPIC, i, False) for i in range(records)]

    class Conn:   # (the lane sets last_seen on the connection it names)
        last_seen = 0.0

    best = float("inf")
    for _ in range(rounds):
        frames = b"".join(lock.seal(Op.PUBLISH, SN, Publish(TOPIC, i, 0, b"p" * 24).encode(), i)
                          for i in range(records))
        lane = LANE_TYPE(NewRecord, 1 << 20)
        mine, peer = socket.socketpair()
        mine.setblocking(False)
        sealing = ((accel.speedups.mac_pads(lock.mac_key), lock.tx - records, broker.tx)
                   if sealed else ())
        lane.adopt(mine.fileno(), Conn(), SN, {TOPIC}, -1, 1 << 30, *sealing)
        peer.sendall(frames)
        t0 = time.perf_counter()
        got, plan, bails, _, _ = lane.poll(records)
        lane.answer(plan, results)
        spent = time.perf_counter() - t0
        assert len(got) == records and not bails, "the lane did not take every frame"
        best = min(best, spent)
        lane.close()
        mine.close()
        peer.close()
    return best / records * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200, help="frames per poll (one read)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)   # (a child's kind)
    a = ap.parse_args()
    if a.one:
        print(best_us_per_record(a.one != "plain", a.records, a.rounds))
        return
    print(machine_info())
    figures: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(a.runs):   # (the kinds alternate, so drift hits each alike)
        for kind in KINDS:
            out = subprocess.run([sys.executable, __file__, "--one", kind, "--records",
                                  str(a.records), "--rounds", str(a.rounds)],
                                 capture_output=True, text=True, check=True).stdout
            figures[kind].append(float(out))
    from lockmq import accel
    print(f"lane poll + answer, {a.records} records a read, µs per record "
          f"(min / median / max of {a.runs} runs; {accel.DESCRIPTION}):")
    plain = statistics.median(figures["plain"])
    for kind in KINDS:
        v = figures[kind]
        print(f"  {kind:16} {min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f}"
              f"   x plain {statistics.median(v) / plain:.2f}")


if __name__ == "__main__":
    main()
