"""Legitimate locks under attack: throughput and p99 ack latency with and without
a flood of hostile connections (issue 7).

    python bench/bench_attack.py [--locks 100] [--duration 5] [--runs 3]

A real ``lockmq broker`` (auth required, default security limits except
``lock_message_rate = 0`` so the legitimate load is not throttled) runs pinned to
CPU 0. 100 provisioned locks (this process, CPU 1) authenticate with their device
keys and publish 24-byte records synchronously (one in flight each) from source
its own source address (127.0.10.x, one per lock). Each run measures the same load twice: alone ("baseline"), and
while an attacker process (CPU 1 at nice 19, so it takes only what the
lock load generator leaves; from 127.0.1.0/24 and 127.0.2.0/24) hammers
the broker with, bounded in time and count:

* garbage connections: random bytes, then close;
* oversized frames: a header announcing a 2 GiB frame;
* failed handshakes: CONNECT + AUTH with a wrong key for a real or unknown SN;
* silent sockets (slowloris): opened and never written, until the broker closes
  them at its auth timeout.

It prints the machine, min/median/max over the runs of the legitimate locks'
throughput and p50/p99 ack latency in both modes, their ratio, what the attacker
managed (attempts, refusals), and the broker's security counters. 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info, proc_cpu_s, proc_status_mb, spread  # noqa: E402

from lockmq.protocol import AuthMethod, Role  # noqa: E402
from lockmq.testing import AsyncPeer, Refused  # noqa: E402

RUN_BROKER = (
    "import os, sys\n"
    "if os.environ.get('LOCKMQ_BENCH_LOOP') == 'asyncio': sys.modules['uvloop'] = None\n"
    "from lockmq.cli import main\n"
    "sys.exit(main(sys.argv[1:]))   # exactly the `lockmq` command\n"
)


def legit_src(i: int) -> str:
    """Lock ``i``'s own source address (each lock is its own host): 127.0.10.1 ..."""
    return f"127.0.{10 + i // 250}.{i % 250 + 1}"


# -- the broker ---------------------------------------------------------------------------

class Broker:
    """``lockmq broker`` as a child process, pinned to one CPU."""

    def __init__(self, root: str, cpu: int | None, loop: str) -> None:
        self.data = os.path.join(root, "data")
        os.makedirs(self.data, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.status_port = s.getsockname()[1]
        conf = os.path.join(root, "broker.toml")
        with open(conf, "w") as fh:
            fh.write(f"""[broker]
host = "127.0.0.1"
port = 0
status_port = {self.status_port}
data_dir = "{self.data}"
auth = "required"
log_level = "WARNING"
handshake_timeout_s = 2.0
[store]
min_free_bytes = 0
[security]
lock_message_rate = 0
limit_exempt_addresses = []
""")
        cmd = [sys.executable, "-c", RUN_BROKER, "broker", "--config", conf,
               "--log-level", "INFO"]
        if cpu is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", str(cpu)] + cmd
        env = dict(os.environ, LOCKMQ_BENCH_LOOP=loop)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.lines: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()
        if not self._ready.wait(60):
            self.stop()
            raise SystemExit("broker did not start:\n" + "\n".join(self.lines[-20:]))
        line = next(x for x in self.lines if "broker_started" in x)
        self.port = int(re.search(r"\bport=(\d+)", line).group(1))

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if len(self.lines) < 20000:
                self.lines.append(line.rstrip())
            if "broker_started" in line:
                self._ready.set()

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.status_port}/metrics",
                                    timeout=10) as r:
            out = {}
            for line in r.read().decode().splitlines():
                name, _, value = line.rpartition(" ")
                if name and not line.startswith("#"):   # skip # HELP / # TYPE
                    out[name] = float(value)
            return out

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the broker process used so far."""
        return proc_cpu_s(self.proc.pid) or 0.0

    def rss_mb(self) -> float:
        return proc_status_mb(self.proc.pid) or 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# -- a legitimate lock ------------------------------------------------------------------------

class Lock:
    """One provisioned lock: the harness's AsyncPeer from its own source address,
    logged in with its key, then sync publishes."""

    def __init__(self, sn: str, key: bytes, src: str) -> None:
        self.sn, self.key, self.src = sn, key, src
        self.seq = 0
        self.peer: AsyncPeer | None = None

    async def connect(self, port: int) -> None:
        self.peer = await AsyncPeer.open(port, self.sn, timeout=60, source=self.src)
        await self.peer.handshake(Role.LOCK, AuthMethod.DEVICE_HMAC, self.key)

    async def publish_until(self, deadline: float, lat: list[float]) -> int:
        assert self.peer is not None
        errors = 0
        payload = b"r" * 24
        while time.monotonic() < deadline:
            self.seq += 1
            t0 = time.perf_counter()
            try:
                await self.peer.publish("lock.events", self.seq, payload)
            except (ConnectionError, Refused):
                errors += 1
                await asyncio.sleep(0.01)
                continue
            lat.append(time.perf_counter() - t0)
        return errors

    def close(self) -> None:
        if self.peer is not None:
            self.peer.writer.close()


async def legit_phase(locks: list[Lock], port: int, duration: float) -> dict[str, float]:
    await asyncio.gather(*(lk.connect(port) for lk in locks))
    lat: list[float] = []
    t0 = time.monotonic()
    errors = await asyncio.gather(*(lk.publish_until(t0 + duration, lat) for lk in locks))
    elapsed = time.monotonic() - t0
    for lk in locks:
        lk.close()
    await asyncio.sleep(0.2)
    lat.sort()
    q = statistics.quantiles(lat, n=100) if len(lat) > 100 else [0.0] * 99
    return {"msgs": len(lat), "rate": len(lat) / elapsed, "p50_ms": q[49] * 1000,
            "p99_ms": q[98] * 1000, "errors": sum(errors)}


# -- the attacker (a separate process) --------------------------------------------------------

ATTACK_CODE = r'''
import asyncio, json, os, random, struct, sys, time
from lockmq.protocol import Auth, AuthMethod, Connect, Op, Role, encode_frame
port, duration, max_conns, slow, sns = (int(sys.argv[1]), float(sys.argv[2]),
                                        int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(","))
st = {"attempts": 0, "connect_failed": 0, "closed_by_broker": 0, "still_open": 0,
      "bytes_sent": 0, "slowloris_opened": 0, "slowloris_closed_by_broker": 0}
deadline = time.monotonic() + duration
def src():
    return f"127.0.{random.randint(1, 2)}.{random.randint(1, 254)}"
def payload():
    k = random.randrange(4)
    if k == 0:
        return os.urandom(random.randint(16, 2048))
    if k == 1:
        return struct.pack(">BIHB", 1, 2**31, Op.PUBLISH, 0) + os.urandom(64)
    if k == 2:
        sn = random.choice(sns + ["GHOST-%d" % random.randint(0, 9999)])
        return (encode_frame(Op.CONNECT, sn, Connect(Role.LOCK, 30, "x").encode(), 1)
                + encode_frame(Op.AUTH, sn, Auth(AuthMethod.DEVICE_HMAC, os.urandom(16),
                                                 os.urandom(32)).encode(), 2))
    return encode_frame(Op.PUBLISH, "LOCK-0000", os.urandom(random.randint(0, 512)), 1)
async def one():
    st["attempts"] += 1
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port,
                                                              local_addr=(src(), 0)), 2)
    except (OSError, asyncio.TimeoutError):
        st["connect_failed"] += 1
        return
    try:
        data = payload()
        w.write(data)
        st["bytes_sent"] += len(data)
        while await asyncio.wait_for(r.read(65536), 0.5):
            pass
        st["closed_by_broker"] += 1
    except (OSError, asyncio.TimeoutError):
        st["still_open"] += 1
    finally:
        w.close()
async def worker():
    while time.monotonic() < deadline and st["attempts"] < max_conns:
        await one()
async def slowloris():
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port,
                                                              local_addr=(src(), 0)), 10)
    except (OSError, asyncio.TimeoutError):
        return
    st["slowloris_opened"] += 1
    try:
        while await asyncio.wait_for(r.read(65536), max(0.01, deadline - time.monotonic())):
            pass
        st["slowloris_closed_by_broker"] += 1
    except (OSError, asyncio.TimeoutError):
        pass
    finally:
        w.close()
async def main():
    await asyncio.gather(*([worker() for _ in range(64)] + [slowloris() for _ in range(slow)]))
asyncio.run(main())
print(json.dumps(st))
'''


def start_attacker(port: int, duration: float, max_conns: int, slow: int, sns: list[str],
                   cpu: int | None) -> subprocess.Popen:
    cmd = [sys.executable, "-c", ATTACK_CODE, str(port), str(duration), str(max_conns),
           str(slow), ",".join(sns[:5])]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(cpu)] + cmd
    # nice 19: on the shared load CPU the attacker takes only what the legitimate load
    # generator leaves, so the comparison measures the broker, not the generator.
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.nice(19))


# -- main ----------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locks", type=int, default=100)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per measured phase")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--attack-conns", type=int, default=5000,
                    help="most hostile connections per attack phase")
    ap.add_argument("--slowloris", type=int, default=300, help="silent sockets per attack phase")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="event loop of the broker process")
    ap.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    args = ap.parse_args()

    ncpu = os.cpu_count() or 1
    broker_cpu, load_cpu = (None, None) if args.no_pin or ncpu < 2 else (0, 1)
    if load_cpu is not None:
        os.sched_setaffinity(0, {load_cpu})
    print(machine_info())
    print(f"broker on CPU {broker_cpu}, locks and attacker on CPU {load_cpu}; "
          f"{args.locks} locks, {args.duration:g} s per phase, {args.runs} runs, "
          f"broker loop {args.loop}")

    from lockmq.security import DeviceRegistry, SecurityConfig

    root = tempfile.mkdtemp(prefix="lockmq-bench-attack-")
    try:
        reg = DeviceRegistry.open(SecurityConfig(data_dir=os.path.join(root, "data")))
        keys = reg.add_many([f"LOCK-{i:04d}" for i in range(args.locks)], mac=False)
        reg.close()
        broker = Broker(root, broker_cpu, args.loop)
        try:
            return _runs(args, broker, keys, load_cpu)
        finally:
            broker.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _runs(args: argparse.Namespace, broker: Broker, keys: dict[str, bytes],
          load_cpu: int | None) -> int:
    locks = [Lock(sn, k, legit_src(i)) for i, (sn, k) in enumerate(keys.items())]
    results: dict[str, list[dict[str, float]]] = {"baseline": [], "attack": []}
    attacks: list[dict[str, int]] = []
    try:
        import uvloop  # type: ignore[import-not-found]
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    rss_start = broker.rss_mb()
    for run in range(args.runs):
        for mode in ("baseline", "attack"):
            att = None
            if mode == "attack":
                att = start_attacker(broker.port, args.duration + 0.5, args.attack_conns,
                                     args.slowloris, list(keys), load_cpu)
                time.sleep(0.5)   # let the flood start before measuring
            cpu0, t0 = broker.cpu_s(), time.monotonic()
            r = runner(legit_phase(locks, broker.port, args.duration))
            r["broker_cpu"] = (broker.cpu_s() - cpu0) / (time.monotonic() - t0)
            if att is not None:
                out, err = att.communicate(timeout=args.duration + 60)
                try:
                    attacks.append(json.loads(out.strip().splitlines()[-1]))
                except (ValueError, IndexError):
                    print("attacker failed:", err[-2000:], file=sys.stderr)
            results[mode].append(r)
            print(f"run {run + 1} {mode:<8} {r['rate']:>9,.0f} msg/s  p50 {r['p50_ms']:6.2f} ms"
                  f"  p99 {r['p99_ms']:6.2f} ms  errors {r['errors']:.0f}"
                  f"  broker CPU {r['broker_cpu'] * 100:3.0f}%", flush=True)
            time.sleep(2.5)   # the broker closes leftover silent sockets (auth timeout)
    print()
    print("legitimate locks (min / median / max over runs)")
    for key, label in (("rate", "throughput msg/s"), ("p50_ms", "p50 ack ms"),
                       ("p99_ms", "p99 ack ms"), ("broker_cpu", "broker CPU share")):
        b = [r[key] for r in results["baseline"]]
        a = [r[key] for r in results["attack"]]
        ratio = statistics.median(a) / statistics.median(b) if statistics.median(b) else 0
        print(f"  {label:<17} baseline {spread(b):>24}   under attack {spread(a):>24}"
              f"   ratio {ratio:.2f}")
    print(f"  errors seen by legitimate locks: baseline {sum(r['errors'] for r in results['baseline']):.0f}"
          f", under attack {sum(r['errors'] for r in results['attack']):.0f}")
    if attacks:
        print("attacker per phase (median): " + ", ".join(
            f"{k} {statistics.median(a[k] for a in attacks):,.0f}" for k in attacks[0]))
    m = broker.metrics()
    sec = {k: v for k, v in m.items() if k.startswith("lockmq_security_")}
    print("broker security counters (all runs):")
    for k, v in sorted(sec.items()):
        print(f"  {k} {v:,.0f}")
    print(f"broker RSS: {rss_start:.1f} MB at start, {broker.rss_mb():.1f} MB at end; "
          f"open connections now {m.get('lockmq_connections', 0):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
