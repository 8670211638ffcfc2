"""Firmware figures on a virtual lock (the real firmware in the MicroPython unix port).

    .venv/bin/python bench/bench_firmware.py [--runs 5] [--events 1000] [--heapsize 144K]

Three rows side by side, in one run: the 64-bit unix port with the app as ``.mpy`` in
``lib/`` (``--heapsize``), the 32-bit port (ESP32 object sizes) with the same ``.mpy``
files, and the 32-bit port with the app frozen in as on an ESP32 image (the last two at
``--heapsize32``; skipped with the reason when the 32-bit port cannot be built). For
each: peak heap, the smallest heap (of a ladder) that passes a throughput run,
events/s and event->ack latency.

Measures, against a real ``lockmq broker`` (durable acks, fsync) on 127.0.0.1:

* events/s from one lock: ``event unlock N`` on stdin until the last ``I evt acked``;
* event -> broker ack: one event at a time, from the stdin line to its ``I evt acked``
  line (host clock), next to a floor measured in the same run: the round trip of a
  line through the same pty to a 3-line MicroPython echo script;
* peak heap: the app's ``I mem peak=`` after the load (``-X heapsize`` as given);
* flash bytes per queued event: growth of ``queue.dat`` while the broker is
  unreachable, divided by the events queued;
* TLS (``--tls-runs``, on every interpreter built with ``ssl``: the 64-bit one; the
  32-bit build has none, docs/firmware.md says why): the live heap with a TLS session
  open to a real ``lockmq broker`` TLS port (``lockmq certs`` CA, certificate and name
  verified) and the smallest heap in which a TLS lock connects and gets events acked,
  next to the same two figures over plain TCP (frame MACs) in the same run. On the unix
  port mbedTLS allocates its contexts and record buffers in the MicroPython heap, so
  the difference is the TLS session's cost; the ladder bounds the handshake's
  high-water (a heap below it fails the connect with MemoryError).

Prints the machine, then min / median / max over ``--runs``. The unix port is a
64-bit build running on a desktop CPU: an ESP32 is slower and its heap objects
about half the size; these are figures of the firmware's logic, not of the chip.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

from lockmq.hil import Dut, VirtualBoard
from lockmq.hil.broker import BrokerProcess, free_port, lockmq_cli
from lockmq.hil.firmware import build, make_flash
from lockmq.hil.lock import Lock
from lockmq.hil.virtual import find_micropython

SETTINGS = {"backoff_min_ms": 100, "backoff_max_ms": 1000, "io_timeout_ms": 3000,
            "heartbeat_s": 30}
ECHO = "import sys\nwhile True:\n    print('echo', sys.stdin.readline().strip())\n"


def machine() -> str:
    """One paragraph about where this ran."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mp = find_micropython() or "?"
    mpv = subprocess.run([mp, "-c", "import sys; print(sys.version, sys.implementation.version)"],
                         capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()
    return (f"machine: {platform.node()} {platform.system()} {platform.release()}, {cpu}, "
            f"{os.cpu_count()} cpus, load {load[0]:.2f}\n"
            f"python {platform.python_version()}, micropython {mpv}")


def stats(name: str, values: list[float], unit: str, fmt: str = "{:.1f}") -> None:
    """min / median / max line."""
    f = lambda v: fmt.format(v)  # noqa: E731
    print(f"  {name:34s} min {f(min(values)):>10s}  median {f(statistics.median(values)):>10s}  "
          f"max {f(max(values)):>10s}  {unit}")


def new_lock(template: Path, work: Path, broker: BrokerProcess, sn: str, key: str,
             heapsize: str, address: tuple[str, int], micropython: str | None = None,
             **settings: object) -> Lock:
    flash = make_flash(template, work / sn, sn, key, [address], **{**SETTINGS, **settings})
    dut = Dut(VirtualBoard(flash, heapsize=heapsize, name=sn, micropython=micropython),
              log_path=work / f"{sn}.log", default_timeout=60)
    return Lock(dut, sn, key, flash)


ROOT = Path(__file__).resolve().parents[1]

#: Heaps tried for "smallest heap that passes the throughput run", smallest first.
LADDER_KB = (24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)
#: s a ladder step may take: its run is well under a second on this machine, a lock
#: that cannot do it fails (MemoryError at boot) or reboots (``E sys fatal``) at once.
STEP_TIMEOUT_S = 60


def smallest_heap(make: Callable[[int], Lock], ladder: Iterable[int], events: int) -> int | None:
    """The smallest heap of ``ladder`` (KiB) in which the lock ``make(kb)`` boots,
    connects and gets ``events`` events durably acked without running out of memory
    on the way (an out-of-memory reboot, ``E sys fatal``, fails the step); None if
    none does. Every step ends within STEP_TIMEOUT_S."""
    for kb in ladder:
        lock = make(kb)
        try:
            lock.dut.default_timeout = 15
            # a heap too small fails at boot (a traceback, then the REPL): no need to
            # wait out the connect timeout for it
            if lock.expect(r"I net connected|Traceback|E sys fatal").group(0) != b"I net connected":
                continue
            throughput(lock, events, timeout=STEP_TIMEOUT_S)
            if "E sys fatal" in lock.full_log():
                continue  # got there only through a reboot with a fresh heap
            return kb
        except AssertionError:
            continue  # MemoryError at boot or mid-run: the lock never gets there
        finally:
            lock.close()
    return None


def measure_row(template: Path, work: Path, broker: BrokerProcess, sns: list[str], keys: dict,
                heapsize: str, micropython: str | None, args: argparse.Namespace) -> dict:
    """events/s, latency and peak heap over ``args.runs`` locks, and the smallest heap."""
    tput: list[float] = []
    lat: list[float] = []
    peaks: list[float] = []
    for r in range(args.runs):
        sn = sns[r]
        lock = new_lock(template, work, broker, sn, keys[sn], heapsize, broker.address, micropython,
                        queue_max=args.events + 100)
        try:
            lock.wait_ready()
            lock.wait_online()
            tput.append(throughput(lock, args.events))
            lat.extend(latencies(lock, args.latency_samples))
            lock.command("mem")
            peaks.append(int(lock.expect(r"I mem peak=(\d+)").group(1)) / 1024)
        finally:
            lock.close()
    sn = sns[args.runs]
    least = smallest_heap(
        lambda kb: new_lock(template, work / f"ladder{kb}", broker, sn, keys[sn], f"{kb}K",
                            broker.address, micropython, queue_max=args.ladder_events + 100),
        LADDER_KB, args.ladder_events)
    return {"tput": tput, "lat": lat, "peaks": peaks, "least": least}


def throughput(lock: Lock, n: int, timeout: float = 300) -> float:
    """events/s: queued, sent and durably acked (within ``timeout`` s)."""
    lock.skip_pending()
    t0 = time.perf_counter()
    lock.events("unlock", n)
    first = int(lock.expect(r"I evt queued seq=(\d+)").group(1))
    lock.expect(rf"I evt acked seq={first + n - 1}\b", timeout=timeout)
    return n / (time.perf_counter() - t0)


def latencies(lock: Lock, n: int) -> list[float]:
    """ms from the stdin line to the broker's ack, one event at a time."""
    out = []
    for _ in range(n):
        lock.skip_pending()
        t0 = time.perf_counter()
        lock.events("unlock", 1)
        seq = int(lock.expect(r"I evt queued seq=(\d+)").group(1))
        lock.expect(rf"I evt acked seq={seq}\b")
        out.append((time.perf_counter() - t0) * 1000)
    return out


def pty_floor(work: Path, n: int) -> list[float]:
    """ms for a line to go through the pty to MicroPython and back."""
    folder = work / "echo"
    folder.mkdir(exist_ok=True)
    (folder / "main.py").write_text(ECHO)
    with Dut(VirtualBoard(folder, heapsize="64K")) as dut:
        dut.writeline("warm")
        dut.expect("echo warm")
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            dut.writeline(f"x{i}")
            dut.expect(rf"echo x{i}\b")
            out.append((time.perf_counter() - t0) * 1000)
    return out


def flash_per_event(lock: Lock, n: int) -> float:
    """queue.dat bytes per event queued while the broker cannot be reached."""
    assert lock.flash is not None
    q = lock.flash / "queue.dat"
    lock.wait_ready()
    lock.expect(r"W net down", timeout=30)
    lock.skip_pending()
    before = q.stat().st_size if q.exists() else 0
    lock.events("tamper", n)
    for _ in range(n):
        lock.expect(r"I evt queued seq=\d+")
    st = lock.status()
    assert st["q"] >= n, st
    return (q.stat().st_size - before) / n


TLS_HOST = "gw.lock.test"


def tls_broker(work: Path) -> tuple[BrokerProcess, Path]:
    """A ``lockmq broker`` with a TLS port and the ``lockmq certs`` folder of its CA."""
    tls = work / "tls"
    subprocess.run([*lockmq_cli(), "certs", "init", str(tls), "--host", TLS_HOST,
                    "--ip", "127.0.0.1"], check=True, capture_output=True, timeout=120)
    broker = BrokerProcess(work / "tlsbroker", tables={"security": {
        "tls_cert": str(tls / "server.pem"), "tls_key": str(tls / "server.key"),
        "tls_port": free_port()}})
    return broker.start(), tls


def tls_lock(template: Path, work: Path, broker: BrokerProcess, ca: Path, sn: str, key: str,
             heapsize: str, micropython: str | None, **settings: object) -> Lock:
    """A lock that connects to ``broker``'s TLS port and verifies it against ``ca``."""
    port = broker.tables["security"]["tls_port"]
    lock = new_lock(template, work, broker, sn, key, heapsize, ("127.0.0.1", port), micropython,
                    tls={"enabled": True, "ca": "ca.der", "server_hostname": TLS_HOST}, **settings)
    assert lock.flash is not None
    shutil.copy(ca, lock.flash / "ca.der")
    return lock


def session_peak(lock: Lock) -> float:
    """KiB: the lock's live-heap peak once online with 20 events acked."""
    lock.wait_online()
    throughput(lock, 20)
    lock.command("mem")
    return int(lock.expect(r"I mem peak=(\d+)").group(1)) / 1024


def measure_tls(template: Path, work: Path, plain: BrokerProcess, plain_key: str,
                start_kb: int | None, args: argparse.Namespace) -> dict:
    """The live heap with a TLS session open and with a plain-TCP one (frame MACs), the
    same procedure and queue size; and the smallest heap of LADDER_KB, from
    ``start_kb`` (the plain row's) up, in which a TLS lock connects and gets
    ``args.ladder_events`` acked."""
    broker, tls = tls_broker(work)
    qmax = args.events + 100
    try:
        ladder = [kb for kb in LADDER_KB if kb >= (start_kb or 0)]
        sns = [f"TLS{i:02d}" for i in range(args.tls_runs + len(ladder))]
        keys = broker.provision(sns)
        peaks: list[float] = []
        plain_peaks: list[float] = []
        for r in range(args.tls_runs):
            lock = tls_lock(template, work / f"tls{r}", broker, tls / "ca.der", sns[r], keys[sns[r]],
                            args.heapsize, None, queue_max=qmax)
            try:
                peaks.append(session_peak(lock))
            finally:
                lock.close()
            lock = new_lock(template, work / f"plain{r}", plain, "PLAIN00", plain_key, args.heapsize,
                            plain.address, None, queue_max=qmax)
            try:
                plain_peaks.append(session_peak(lock))
            finally:
                lock.close()
        ladder_sn = dict(zip(ladder, sns[args.tls_runs:]))
        least = smallest_heap(
            lambda kb: tls_lock(template, work / f"tlsladder{kb}", broker, tls / "ca.der",
                                ladder_sn[kb], keys[ladder_sn[kb]], f"{kb}K", None,
                                queue_max=args.ladder_events + 100),
            ladder, args.ladder_events)
        return {"peaks": peaks, "plain": plain_peaks, "least": least}
    finally:
        broker.stop()


def rows(work: Path, args: argparse.Namespace) -> list[tuple[str, Path, str, str | None]]:
    """(label, flash template, heap, interpreter) per row; a row that cannot run here
    is reported with the reason and left out."""
    from lockmq.testing.micropython import MPY32_FROZEN, get_interpreter, interpreter_unavailable

    mpy = build(work / "template")
    out: list[tuple[str, Path, str, str | None]] = [("64-bit, .mpy in lib/", mpy, args.heapsize, None)]
    why = interpreter_unavailable(MPY32_FROZEN)
    if why:
        print(f"32-bit rows skipped: {why}")
        return out
    exe = get_interpreter(MPY32_FROZEN).exe  # lib/ comes first on its path: .mpy shadows frozen
    frozen = build(work / "frozen", "TEMPLATE", "00" * 32, None,
                   "--frozen", "--manifest-dir", str(work / "manifest"))
    out.append(("32-bit, .mpy in lib/", mpy, args.heapsize32, exe))
    out.append(("32-bit, frozen", frozen, args.heapsize32, exe))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--events", type=int, default=1000, help="events per throughput run")
    ap.add_argument("--latency-samples", type=int, default=50)
    ap.add_argument("--heapsize", default="144K", help="64-bit row's heap (lockmq.testing.lock.HEAP)")
    ap.add_argument("--heapsize32", default="96K", help="32-bit rows' heap (.mpy boots in 96K)")
    ap.add_argument("--ladder-events", type=int, default=300,
                    help="events of the throughput run that decides the smallest heap")
    ap.add_argument("--flash-runs", type=int, default=0, help="also measure flash per queued event")
    ap.add_argument("--tls-runs", type=int, default=1,
                    help="locks measured over TLS on the 64-bit port (0: skip TLS)")
    ap.add_argument("--docs", action="store_true",
                    help="write the heap table into the docs' generated blocks (DOC_BLOCKS)")
    args = ap.parse_args()

    print(machine())
    print(f"runs {args.runs}, {args.events} events per throughput run, "
          f"{args.latency_samples} latency samples per run, smallest heap: {args.ladder_events} "
          f"events from {LADDER_KB[0]}K up; broker: lockmq broker, durable acks (fsync), auth "
          "required; frame MACs on (the default)")
    results: list[tuple[str, str, dict]] = []
    floor: list[float] = []
    per_event: list[float] = []
    tls_res: dict | None = None
    with tempfile.TemporaryDirectory(prefix="bench-fw-") as tmp:
        work = Path(tmp)
        broker = BrokerProcess(work / "broker").start()
        sns = [f"BENCH{i:02d}" for i in range(args.runs + 2)]
        keys = broker.provision(sns + ["PLAIN00"])
        try:
            for i, (label, template, heap, exe) in enumerate(rows(work, args)):
                results.append((label, heap, measure_row(template, work / f"row{i}", broker, sns, keys,
                                                         heap, exe, args)))
            floor.extend(pty_floor(work, args.latency_samples))
            if args.tls_runs:
                tls_res = measure_tls(work / "template", work / "tlsrow", broker, keys["PLAIN00"],
                                      results[0][2]["least"], args)
            dead = ("127.0.0.1", free_port())  # flash cost: nothing listens at the lock's broker
            sn = sns[-1]
            for r in range(args.flash_runs):
                lock = new_lock(work / "template", work / f"offline{r}", broker, sn, keys[sn],
                                args.heapsize, dead, queue_max=400)
                try:
                    per_event.append(flash_per_event(lock, 200))
                finally:
                    lock.close()
        finally:
            broker.stop()
    print("results (min / median / max):")
    for label, heap, res in results:
        print(f"{label} (-X heapsize={heap}):")
        stats("peak heap", res["peaks"], "KiB")
        least = f"{res['least']}K" if res["least"] else f"none up to {LADDER_KB[-1]}K"
        print(f"  {'smallest heap passing the run':34s} {least}")
        stats("events/s, one lock (to durable ack)", res["tput"], "events/s")
        stats("event -> broker ack", res["lat"], "ms", "{:.2f}")
        print(f"  {'ratio ack latency / pty floor':34s} median "
              f"{statistics.median(res['lat']) / statistics.median(floor):.1f}x")
    stats("floor: line round trip on the pty", floor, "ms", "{:.2f}")
    if tls_res is not None:
        plain = results[0][2]
        print(f"TLS, 64-bit, .mpy in lib/ (-X heapsize={args.heapsize}; plain TCP figures of the "
              "same run beside):")
        stats("live heap, TLS session open", tls_res["peaks"], "KiB")
        stats("live heap, plain TCP (frame MACs)", tls_res["plain"], "KiB")
        least = f"{tls_res['least']}K" if tls_res["least"] else f"none up to {LADDER_KB[-1]}K"
        print(f"  {'smallest heap, TLS connect + run':34s} {least}  (plain TCP: {plain['least']}K)")
        print("  32-bit rows: no TLS figure (that build has no ssl module: docs/firmware.md)")
    if per_event:
        stats("flash per queued event (queue.dat)", per_event, "bytes")
    if args.docs:
        table = heap_table(results, args)
        for doc in DOC_BLOCKS:
            write_block(doc, table)
            print(f"wrote the heap table into {doc}")
    return 0


#: The docs whose heap figures this bench writes (between the BLOCK markers); one
#: table, the same in each (tests/firmware/test_doc_figures.py holds them equal).
DOC_BLOCKS = (ROOT / "docs" / "hil.md", ROOT / "firmware" / "README.md", ROOT / "docs" / "firmware.md")
BLOCK = ("<!-- generated by bench/bench_firmware.py --docs: heap -->",
         "<!-- end of generated heap table -->")


def heap_table(results: list[tuple[str, str, dict]], args: argparse.Namespace) -> str:
    """The markdown heap table of a run (median peak, smallest heap passing the run)."""
    lines = [f"Measured {time.strftime('%Y-%m-%d')} with `.venv/bin/python bench/bench_firmware.py "
             f"--runs {args.runs} --events {args.events} --tls-runs {args.tls_runs} --docs` "
             "(a real broker, frame MACs on, the bench's queue of events + 100):", "",
             "| interpreter | heap given | live heap peak (median) | smallest heap passing the run |",
             "|---|---|---|---|"]
    for label, heap, res in results:
        least = f"{res['least']}K" if res["least"] else f"none up to {LADDER_KB[-1]}K"
        lines.append(f"| {label} | {heap} | {statistics.median(res['peaks']):.1f} KiB | {least} |")
    return "\n".join(lines)


def write_block(doc: Path, table: str) -> None:
    """Replace the generated block of ``doc`` with ``table``."""
    text = doc.read_text()
    start, end = text.index(BLOCK[0]), text.index(BLOCK[1])
    doc.write_text(text[:start] + BLOCK[0] + "\n" + table + "\n" + text[end:])


if __name__ == "__main__":
    sys.exit(main())
