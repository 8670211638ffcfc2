"""MQTT QoS 1 publish -> deliver through lockmq's MQTT listener against Mosquitto,
and the lock path with the listener on against off, in one run.

    .venv/bin/python bench/bench_mqtt.py [--messages 20000] [--runs 3] [--window 64]

* ``mqtt`` (the figure): one MQTT 3.1.1 publisher (QoS 1, ``--window`` PUBLISHes in
  flight) and one subscriber (QoS 1, a PUBACK per delivery) on the same topic; rate
  of deliveries (msg/s) and publish -> deliver latency (p50, p99). lockmq stores each
  record (group-committed fsync) before its PUBACK and delivers it as a lease of a
  private cluster; Mosquitto (the floor: the peer the issue names) keeps it in memory
  (``persistence true`` saves on a timer, not per message).
* ``lock path``: bench/loadgen.py's lock publish (100 locks, one record in flight
  each) against a broker with ``[mqtt] enabled`` and one without, runs alternated;
  the ratio on/off should be ~1.

Servers are pinned to ``--server-core``, clients to ``--client-core`` (taskset).
Prints the machine and min / median / max per figure; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import machine_info, spread  # noqa: E402
from peers import command as peer_command, peer_binary  # noqa: E402

from lockmq.mqtt import codec as c  # noqa: E402

PY = sys.executable
TOPIC = "bench/events"
_T = struct.Struct(">d")


def _free_port() -> int:
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _wait_port(port: int, timeout: float = 20.0) -> None:
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def start_lockmq(data_dir: str, core: str, mqtt: bool) -> tuple[subprocess.Popen, int, int]:
    """``lockmq broker`` (auth off, INFO logs) pinned to ``core``; (proc, port, mqtt port)."""
    os.makedirs(data_dir, exist_ok=True)
    conf = os.path.join(data_dir, "broker.toml")
    with open(conf, "w") as fh:
        fh.write(f'[broker]\nhost = "127.0.0.1"\nport = 0\nstatus_port = 0\n'
                 f'data_dir = "{data_dir}"\nauth = "off"\nlog_level = "INFO"\n'
                 f'[store]\nmin_free_bytes = 0\n'
                 f'[mqtt]\nenabled = {"true" if mqtt else "false"}\nport = -1\n')
    lockmq = os.path.join(os.path.dirname(PY), "lockmq")
    proc = subprocess.Popen(["taskset", "-c", core, lockmq, "broker", "--config", conf],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = mport = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if "event=mqtt_started" in line:
            mport = int(re.search(r"\bport=(\d+)", line).group(1))
        if "event=broker_started" in line:
            port = int(re.search(r"\bport=(\d+)", line).group(1))
            break
    # keep draining its output so that the pipe never fills
    import threading
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, port, mport


def start_mosquitto(data_dir: str, core: str) -> tuple[subprocess.Popen, int]:
    os.makedirs(data_dir, exist_ok=True)
    port = _free_port()
    proc = subprocess.Popen(["taskset", "-c", core, *peer_command("mosquitto", port, data_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_port(port)
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


class _Conn(asyncio.Protocol):
    def __init__(self, on_packet) -> None:  # type: ignore[no-untyped-def]
        self.dec = c.Decoder(1 << 20, c.V311)
        self.on_packet = on_packet
        self.transport: asyncio.Transport | None = None
        self.ready = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.dec.feed(data)
        while (p := self.dec.next_packet()) is not None:
            if p.ptype in (c.CONNACK, c.SUBACK) and not self.ready.done():
                self.ready.set_result(p)
            else:
                self.on_packet(p)


async def pubsub(port: int, n: int, window: int) -> dict[str, float]:
    """One QoS 1 publisher and one QoS 1 subscriber: deliveries/s and latency."""
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    done = loop.create_future()
    sub_t: list[asyncio.Transport] = []

    def on_sub(p) -> None:  # type: ignore[no-untyped-def]
        if p.ptype == c.PUBLISH:
            lat.append(time.perf_counter() - _T.unpack_from(p.payload)[0])
            if p.qos:
                sub_t[0].write(c.Ack(c.PUBACK, p.packet_id).encode(c.V311))
            if len(lat) >= n and not done.done():
                done.set_result(None)

    tr, sp = await loop.create_connection(lambda: _Conn(on_sub), "127.0.0.1", port)
    sub_t.append(tr)
    tr.write(c.Connect("bench-sub", c.V311, True, 60).encode())
    await sp.ready
    sp.ready = loop.create_future()
    tr.write(c.Subscribe(1, [c.Subscription(TOPIC, 1)]).encode(c.V311))
    await sp.ready
    sent = [0]
    inflight = [0]
    pad = b"x" * 16

    def publish_more(t: asyncio.Transport) -> None:
        out = bytearray()
        while inflight[0] < window and sent[0] < n:
            sent[0] += 1
            inflight[0] += 1
            pid = sent[0] % 0xFFFF + 1
            out += c.Publish(TOPIC, _T.pack(time.perf_counter()) + pad, 1, False, False,
                             pid).encode(c.V311)
        if out:
            t.write(bytes(out))

    pub_t: list[asyncio.Transport] = []

    def on_pub(p) -> None:  # type: ignore[no-untyped-def]
        if p.ptype == c.PUBACK:
            inflight[0] -= 1
            publish_more(pub_t[0])

    pt, pp = await loop.create_connection(lambda: _Conn(on_pub), "127.0.0.1", port)
    pub_t.append(pt)
    pt.write(c.Connect("bench-pub", c.V311, True, 60).encode())
    await pp.ready
    await asyncio.sleep(0.2)   # (the subscription is in place on both servers)
    t0 = time.perf_counter()
    publish_more(pt)
    await asyncio.wait_for(done, 120)
    elapsed = time.perf_counter() - t0
    pt.close()
    tr.close()
    lat.sort()
    return {"rate": n / elapsed, "p50_ms": lat[len(lat) // 2] * 1000,
            "p99_ms": lat[int(len(lat) * 0.99)] * 1000}


def run_pubsub(core: str, port: int, n: int, window: int) -> dict[str, float]:
    """:func:`pubsub` in a child pinned to ``core``."""
    code = (f"import asyncio, json, sys; sys.path.insert(0, {HERE!r}); "
            f"import bench_mqtt as b; print(json.dumps(asyncio.run(b.pubsub({port}, {n}, "
            f"{window}))))")
    out = subprocess.run(["taskset", "-c", core, PY, "-c", code], capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_lock_path(core: str, port: int, duration: float) -> float:
    out = subprocess.run(["taskset", "-c", core, PY, os.path.join(HERE, "loadgen.py"),
                          "publish", "--port", str(port), "--locks", "100", "--window", "1",
                          "--duration", str(duration)], capture_output=True, text=True,
                         timeout=120)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError((out.stderr or out.stdout).strip().splitlines()[-1:])
    return float(json.loads(lines[-1])["rate"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lock-duration", type=float, default=3.0)
    ap.add_argument("--server-core", default="0")
    ap.add_argument("--client-core", default="1")
    ap.add_argument("--skip-lock-path", action="store_true")
    ap.add_argument("--skip-mqtt", action="store_true", help="only the lock path")
    a = ap.parse_args()
    print(machine_info())
    root = tempfile.mkdtemp(prefix="bench-mqtt-")
    res: dict[str, list[dict[str, float]]] = {"lockmq": [], "mosquitto": []}
    have_mosq = peer_binary("mosquitto") is not None
    for r in range(0 if a.skip_mqtt else a.runs):
        proc, _port, mport = start_lockmq(f"{root}/l{r}", a.server_core, True)
        try:
            res["lockmq"].append(run_pubsub(a.client_core, mport, a.messages, a.window))
        finally:
            stop(proc)
        if have_mosq:
            mproc, mp = start_mosquitto(f"{root}/m{r}", a.server_core)
            try:
                res["mosquitto"].append(run_pubsub(a.client_core, mp, a.messages, a.window))
            finally:
                stop(mproc)
    if not a.skip_mqtt:
        print(f"mqtt QoS 1 publish->deliver, {a.messages} msgs, window {a.window}, "
              f"{a.runs} runs (min / median / max):")
    for name, rows in res.items() if not a.skip_mqtt else ():
        if not rows:
            print(f"  {name:10s} skipped (not installed)")
            continue
        for fig in ("rate", "p50_ms", "p99_ms"):
            print(f"  {name:10s} {fig:7s} {spread([x[fig] for x in rows])}")
    if res["mosquitto"]:
        ratio = statistics.median(x["rate"] for x in res["lockmq"]) / \
            statistics.median(x["rate"] for x in res["mosquitto"])
        print(f"  ratio lockmq/mosquitto (median rate): {ratio:.2f} "
              "(lockmq fsyncs each record before its PUBACK; Mosquitto acks from memory)")
    if not a.skip_lock_path:
        on: list[float] = []
        off: list[float] = []
        for r in range(a.runs):
            for mqtt, sink in ((False, off), (True, on)):
                proc, port, _m = start_lockmq(f"{root}/p{r}{int(mqtt)}", a.server_core, mqtt)
                try:
                    sink.append(run_lock_path(a.client_core, port, a.lock_duration))
                finally:
                    stop(proc)
        print(f"lock path (100 locks, window 1, msg/s; min / median / max):")
        print(f"  mqtt off  {spread(off)}")
        print(f"  mqtt on   {spread(on)}")
        print(f"  ratio on/off (median): {statistics.median(on) / statistics.median(off):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
