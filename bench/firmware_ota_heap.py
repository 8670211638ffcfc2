"""The heap an update over the air costs the 32-bit frozen lock (docs/firmware.md,
"Updates over the air"): against a real ``lockmq broker``, a frozen lock online, its
live heap peak before the update, then during a fetch slowed by the fault proxy to
~2 KB/s (so that the app's once-a-second heap sampler sees the fetch), the verify and
the unpack, until ``I ota staged``; then the smallest heap of a ladder in which a fresh
frozen lock fetches, verifies and stages the same bundle. Also the power-cut runs:
``--cuts N`` power cuts at seeded random instants of a fetch, each followed by the
update completing (many more runs than the suite's).

    .venv/bin/python bench/firmware_ota_heap.py [--cuts 20] [--seed S]
"""
import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_firmware as bf
from lockmq.hil.broker import BrokerProcess, lockmq_cli
from lockmq.hil.firmware import build
from lockmq.hil.proxy import FaultProxy
from lockmq.testing.micropython import MPY32_FROZEN, get_interpreter

LADDER_KB = (24, 28, 32, 40, 48, 64)

ap = argparse.ArgumentParser()
ap.add_argument("--cuts", type=int, default=0, help="power-cut runs during a fetch (64-bit lock)")
ap.add_argument("--seed", type=int, default=None)
args = ap.parse_args()


def cli(*a):
    p = subprocess.run([*lockmq_cli(), *a], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def update(broker, token, sn, bundle):
    cli("command", "--broker", f"{broker.host}:{broker.port}", "--token", token, sn, "fw-update",
        *bundle, "--expires", "60")


with tempfile.TemporaryDirectory(prefix="ota-heap-") as tmp:
    work = Path(tmp)
    exe = get_interpreter(MPY32_FROZEN).exe
    frozen = build(work / "frozen", "TEMPLATE", "00" * 32, None, "--frozen", "--manifest-dir",
                   str(work / "manifest"))
    broker = BrokerProcess(work / "broker").start()
    try:
        token = broker.service_token("bench", "--admin")
        out = cli("firmware", "release", "--broker", f"{broker.host}:{broker.port}", "--token", token,
                  "--version", "9.9.9-bench")
        bundle = out.split("\n")[0].split()[1:4]
        print("bundle", bundle[0], bundle[1], "bytes", flush=True)
        sns = ["H0"] + [f"H{kb}" for kb in LADDER_KB] + [f"C{i}" for i in range(args.cuts)]
        keys = broker.provision(sns)
        with FaultProxy(broker.address) as proxy:
            lock = bf.new_lock(frozen, work, broker, "H0", keys["H0"], "64K", proxy.address, exe)
            try:
                lock.wait_ready(); lock.wait_online()
                bf.throughput(lock, 50, timeout=bf.STEP_TIMEOUT_S)
                lock.command("mem")
                before = int(lock.expect(r"I mem peak=(\d+)").group(1))
                proxy.slow(delay_s=0.0, rate_bps=2000)
                update(broker, token, "H0", bundle)
                lock.expect(r"I ota staged", timeout=300)
                peak = max(int(m) for m in __import__("re").findall(r"I mem peak=(\d+)", lock.full_log()))
                print(f"32-bit frozen, 64K heap: live heap peak {before} B online before the update, "
                      f"{peak} B through fetch, verify and unpack (+{peak - before} B)", flush=True)
            finally:
                lock.close()
        for kb in LADDER_KB:
            sn = f"H{kb}"
            lock = bf.new_lock(frozen, work / sn, broker, sn, keys[sn], f"{kb}K", broker.address, exe)
            try:
                lock.dut.default_timeout = 30
                ok = False
                try:
                    lock.wait_ready(); lock.wait_online()
                    update(broker, token, sn, bundle)
                    lock.expect(r"I ota staged|E sys fatal|E ota refused", timeout=bf.STEP_TIMEOUT_S)
                    ok = "I ota staged" in lock.full_log() and "E sys fatal" not in lock.full_log()
                except Exception as e:  # noqa: BLE001 -- a heap too small fails anywhere
                    print(f"{kb}K: {type(e).__name__}", flush=True)
                print(f"{kb}K", "stages the update" if ok else "fails", flush=True)
                if ok:
                    break
            finally:
                lock.close()
        seed = args.seed if args.seed is not None else random.randrange(1 << 30)
        rnd = random.Random(seed)
        if args.cuts:
            print(f"power cuts during fetches, seed {seed}", flush=True)
        template = build(work / "t64", "TEMPLATE", "00" * 32, None)
        for i in range(args.cuts):
            sn = f"C{i}"
            lock = bf.new_lock(template, work / sn, broker, sn, keys[sn], "160K", broker.address)
            try:
                lock.wait_ready(); lock.wait_online()
                lock.events("unlock", 3)
                update(broker, token, sn, bundle)
                lock.expect(r"I ota fetch", timeout=60)
                time.sleep(rnd.uniform(0, 0.15))
                lock.power_cut(off_s=rnd.uniform(0, 0.1))
                lock.expect(r"I ota confirmed v=9\.9\.9-bench|E ota", timeout=120)
                ok = "I ota confirmed" in lock.full_log()
                print(f"cut {i}: {'updated' if ok else 'FAILED'}", flush=True)
            finally:
                lock.close()
    finally:
        broker.stop()
