"""Firmware figures on this machine: live heap, events/s, event-to-ack time, flash
bytes per queued event. The real firmware (unix port) against the test broker.

    .venv/bin/python -m tests.firmware.measure [--heap 128K] [--events 500]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from lockmq.firmware_tools.build import DeviceConfig, build_folder
from lockmq.testing import Lock, set_config
from lockmq.testing.lock import KEY, SN

from .minibroker import MiniBroker


def _mem(lk: Lock) -> tuple[int, int]:
    lk.send("mem")
    m = lk.expect(r"^I mem peak=(\d+) alloc=(\d+) free=(\d+)$")
    return int(m.group(1)), int(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heap", default="128K")
    ap.add_argument("--events", type=int, default=500)
    ap.add_argument("--samples", type=int, default=30)
    a = ap.parse_args()
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"micropython unix port, -X heapsize={a.heap}")
    tmp = Path(tempfile.mkdtemp(prefix="fwmeasure-"))
    try:
        tpl = build_folder(tmp / "tpl", DeviceConfig(sn=SN, key=KEY.hex(), brokers=[("127.0.0.1", 9)], hw="sim"))
        # 1. flash bytes per queued event (broker down), and per acked event
        board = tmp / "offline"
        shutil.copytree(tpl, board)
        dead = MiniBroker({SN: KEY})
        port = dead.port
        dead.stop()
        set_config(board, brokers=[["127.0.0.1", port]], backoff_min_ms=100, backoff_max_ms=200,
                   frame_mac=False)
        lk = Lock(board, a.heap)
        lk.expect(r"^I sys ready")
        idle_peak, idle_live = _mem(lk)
        lk.send("event unlock 100")
        lk.expect(r"^I evt queued seq=100 ")
        queued_bytes = (board / "queue.dat").stat().st_size
        dead.start()
        lk.expect(r"^I evt acked seq=100$", timeout=60)
        lk.close()
        dead.close()
        print(f"flash per queued event: {queued_bytes / 100:.1f} bytes (100 unlock events, card-less)")
        print("flash per ack: one 16-byte head record per ack (the file is compacted once "
              "4 KiB of it is dead)")
        # 2. throughput, latency, heap under load
        board = tmp / "online"
        shutil.copytree(tpl, board)
        b = MiniBroker({SN: KEY})
        set_config(board, brokers=[["127.0.0.1", b.port]], frame_mac=False)
        lk = Lock(board, a.heap)
        lk.expect(r"^I net connected")
        lat = []
        for i in range(1, a.samples + 1):
            t0 = time.perf_counter()
            lk.send("event tamper")
            lk.expect(rf"^I evt acked seq={i}$")
            lat.append((time.perf_counter() - t0) * 1000)
        n0 = a.samples
        t0 = time.perf_counter()
        lk.send(f"event unlock {a.events}")
        lk.expect(rf"^I evt acked seq={n0 + a.events}$", timeout=300)
        dt = time.perf_counter() - t0
        peak, live = _mem(lk)
        want = list(range(1, n0 + a.events + 1))
        got = b.seqs(SN)
        assert got == want, (len(got), sorted(set(want) - set(got))[:10], got[:5], got[-5:])
        lk.close()
        b.close()
        print(f"event -> broker ack (stdin in, ack line out; {a.samples} samples): "
              f"min {min(lat):.1f} ms, median {statistics.median(lat):.1f} ms, max {max(lat):.1f} ms")
        print(f"events/s, one lock, {a.events} produced and sent (window 1): {a.events / dt:.0f}")
        print(f"live heap (after gc.collect): idle {idle_live} B, peak in service {peak} B "
              f"of {a.heap}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
