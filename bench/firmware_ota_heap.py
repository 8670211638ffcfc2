"""The heap an update over the air costs the 32-bit frozen lock (docs/firmware.md,
"Updates over the air"): against a real ``lockmq broker``, a frozen lock online, its
live heap peak before the update, then during a fetch slowed by the fault proxy to
~2 KB/s (so that the app's once-a-second heap sampler sees the fetch), the verify and
the unpack, until ``I ota staged``; then the smallest heap of a ladder in which a fresh
frozen lock fetches, verifies and stages the same bundle. Also the power-cut runs:
``--cuts N`` power cuts at seeded random instants of each stage of an update (fetch,
verify, switch, trial: ``lockmq.hil.scenario.OTA_STAGES``, as in hil/test_ota.py, many
more runs), each on a fresh 64-bit lock with 3 events queued; a run passes when an app
boots after the cut, the update completes (the new version with a heartbeat) and,
once the lock has drained, its events are stored exactly once.

    .venv/bin/python bench/firmware_ota_heap.py [--cuts 20] [--seed S] [--no-heap]
"""
import argparse
import json
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
from lockmq.hil.scenario import OTA_STAGES, assert_exactly_once_in_order, stored_seqs
from lockmq.testing.micropython import MPY32_FROZEN, get_interpreter

LADDER_KB = (24, 28, 32, 40, 48, 64)

ap = argparse.ArgumentParser()
ap.add_argument("--cuts", type=int, default=0, help="power-cut runs per update stage (64-bit lock)")
ap.add_argument("--no-heap", action="store_true", help="only the power-cut runs")
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
        cut_sns = [f"C{st[:3].upper()}{i}" for st in OTA_STAGES for i in range(args.cuts)]
        sns = ["H0"] + [f"H{kb}" for kb in LADDER_KB] + cut_sns
        keys = broker.provision(sns)
        if not args.no_heap:
            with FaultProxy(broker.address) as proxy:
                lock = bf.new_lock(frozen, work, broker, "H0", keys["H0"], "64K", proxy.address, exe)
                try:
                    lock.wait_ready(); lock.wait_online()
                    bf.throughput(lock, 50, timeout=bf.STEP_TIMEOUT_S)
                    lock.command("mem")
                    before = int(lock.expect(r"I mem peak=(\d+)").group(1))
                    proxy.slow(delay_s=0.0, rate_bps=2000)
                    update(broker, token, "H0", bundle)
                    # the sampler's running peak is logged at `mem` and at heartbeats (30 s
                    # apart, maybe none during the fetch): ask for it every second
                    deadline = time.monotonic() + 300
                    while "I ota staged" not in lock.full_log():
                        assert time.monotonic() < deadline, "no I ota staged within 300 s"
                        lock.command("mem")
                        time.sleep(1)
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
            print(f"power cuts in every update stage, seed {seed}", flush=True)
        template = build(work / "t64", "TEMPLATE", "00" * 32, None)
        runs = {}
        for sn in cut_sns:
            stage = next(st for st in OTA_STAGES if sn.startswith("C" + st[:3].upper()))
            marker, window_s = OTA_STAGES[stage]
            lock = bf.new_lock(template, work / sn, broker, sn, keys[sn], "160K", broker.address)
            ok = False
            try:
                lock.wait_ready(); lock.wait_online()
                lock.events("unlock", 3)
                update(broker, token, sn, bundle)
                lock.expect(marker, timeout=60)
                time.sleep(rnd.uniform(0, window_s))
                lock.power_cut(off_s=rnd.uniform(0, 0.1))
                lock.expect(r"I sys boot fw=", timeout=30)         # an app boots, whichever
                end = time.monotonic() + 120
                while not ok and time.monotonic() < end:
                    devs = json.loads(cli("devices", "online", "--broker", f"{broker.host}:{broker.port}",
                                          "--token", token, "--json"))
                    d = next((d for d in devs if d["sn"] == sn), {})
                    ok = d.get("fw") == "9.9.9-bench" and "uptime_s" in d
                    time.sleep(0.5)
                if ok:
                    lock.wait_drained(timeout=60)
            except Exception as e:  # noqa: BLE001 -- a run that fails anywhere is counted
                print(f"{sn}: {type(e).__name__}: {e}", flush=True)
            finally:
                lock.close()
            runs[sn] = (stage, ok, lock)
            print(f"{stage} cut {sn}: {'updated' if ok else 'FAILED'}", flush=True)
    finally:
        broker.stop()
    for stage in OTA_STAGES:
        mine = [(sn, ok, lock) for sn, (st, ok, lock) in runs.items() if st == stage]
        once = 0
        for sn, ok, lock in mine:
            try:
                assert_exactly_once_in_order(lock, stored_seqs(broker, sn), unlogged_ok=1)
                once += 1
            except AssertionError as e:
                print(f"{sn}: events not stored once: {e}", flush=True)
        if mine:
            print(f"{stage}: {sum(ok for _, ok, _ in mine)} of {len(mine)} updated after the cut, "
                  f"{once} of {len(mine)} with every queued event stored once", flush=True)
