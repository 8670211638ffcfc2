"""One step of the frozen app's heap cuts (docs/firmware.md "Cuts, step by step"):
the live heap of the 32-bit frozen lock, default ``queue_max``, online with 200 events
durably acked by a real ``lockmq broker`` (two locks), then whether it runs 300 events
(``queue_max`` 400) in a 24K, 28K and 32K heap, each step within
``bench_firmware.STEP_TIMEOUT_S`` (a lock out of memory fails loudly and reboots: the
step fails, it does not hang).

    .venv/bin/python bench/firmware_heap_step.py
"""
import sys, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_firmware as bf
from lockmq.hil.broker import BrokerProcess
from lockmq.hil.firmware import build
from lockmq.testing.micropython import MPY32_FROZEN, get_interpreter

HEAPS_KB = (24, 28, 32)

with tempfile.TemporaryDirectory(prefix="fw32b-") as tmp:
    work = Path(tmp)
    exe = get_interpreter(MPY32_FROZEN).exe
    frozen = build(work / "frozen", "TEMPLATE", "00" * 32, None, "--frozen", "--manifest-dir", str(work / "manifest"))
    broker = BrokerProcess(work / "broker").start()
    sns = ["M0", "M1"] + [f"M{kb}" for kb in HEAPS_KB]
    keys = broker.provision(sns)
    try:
        for sn in sns[:2]:
            lock = bf.new_lock(frozen, work, broker, sn, keys[sn], "96K", broker.address, exe)
            try:
                lock.wait_ready(); lock.wait_online()
                bf.throughput(lock, 200, timeout=bf.STEP_TIMEOUT_S)
                lock.command("mem")
                m = lock.expect(r"I mem peak=(\d+) alloc=(\d+)")
                print("live heap peak", int(m.group(1)), "B, now", int(m.group(2)), "B", flush=True)
            finally:
                lock.close()
        for kb in HEAPS_KB:   # each step bounded (bf.STEP_TIMEOUT_S): fails, never hangs
            passes = bf.smallest_heap(
                lambda kb: bf.new_lock(frozen, work / f"l{kb}", broker, f"M{kb}", keys[f"M{kb}"],
                                       f"{kb}K", broker.address, exe, queue_max=400), (kb,), 300)
            print(f"{kb}K", "passes" if passes else "fails", flush=True)
    finally:
        broker.stop()
