"""Benchmark of the storage engine (lockmq.store): one command, prints everything.

    .venv/bin/python bench/bench_store.py                 # full run (1 GiB recovery log)
    .venv/bin/python bench/bench_store.py --recovery-bytes 64M --runs 3 --seconds 2
    .venv/bin/python bench/bench_store.py --compare --baseline /tmp/base --pure \
        --writers 100 --batched-writers 10 --async-writers '' --runs 3 --seconds 1

Measures, with 24-byte payloads (the paper's unlock record):
  * appends/s and MB/s at flush=sync with 1, 100 and 1000 concurrent writers
    (asyncio tasks each awaiting one one-record append at a time), and at flush=async;
  * the broker's batched path: a few writers each appending --batch records per call
    (--batched-writers, at sync);
  * in the same run, the floor: a plain loop that writes the same bytes with the same
    fsync cadence as the store did (same bytes per write, same writes per fdatasync),
    and the naive floor: one write+fdatasync per record;
  * start-up time of a store holding a --recovery-bytes log: clean restart, and after
    a crash that left --tail-bytes of log behind the last checkpoint (and with
    --full-rebuild, after losing the checkpoint).
Prints machine info and min/median/max over --runs runs, ratios against the floor,
and the process CPU time per stored record (both threads, the benchmark's own writer
tasks included): on a shared machine whose disk speed swings from run to run, that is
the steadier measure of the store's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from lockmq.store import NewRecord, Store, StoreConfig
from lockmq.store.records import encode_record

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_facts  # noqa: E402

PAYLOAD = bytes(range(24))


def size_arg(text: str) -> int:
    """'1G', '64M', '512k' or a plain number of bytes."""
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("ib")
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)


def int_list(text: str) -> list[int]:
    """'1,100,1000' -> [1, 100, 1000]; '' -> [] (skip those cases)."""
    return [int(x) for x in text.split(",") if x.strip()]


def stats3(xs: list[float]) -> str:
    return f"min {min(xs):>10,.0f}  median {statistics.median(xs):>10,.0f}  max {max(xs):>10,.0f}"


def ratio3(xs: list[float]) -> str:
    return f"min {min(xs):.2f}  median {statistics.median(xs):.2f}  max {max(xs):.2f}"


async def store_run(path: str, flush: str, writers: int, seconds: float,
                    per_call: int = 1) -> dict:
    """Run ``writers`` concurrent appenders, each appending ``per_call`` records per
    call, for ``seconds``; return counters."""
    s = Store.open(StoreConfig(data_dir=path, flush=flush, min_free_bytes=0))
    stop = False
    count = 0

    async def writer(w: int) -> None:
        nonlocal count
        sn = f"LOCK{w:06d}"
        seq = 0
        append = s.append
        while not stop:
            await append([NewRecord("locks", sn, seq + k, 1_700_000_000_000, PAYLOAD)
                          for k in range(per_call)])
            seq += per_call
            count += per_call

    tasks = [asyncio.ensure_future(writer(w)) for w in range(writers)]
    await asyncio.sleep(0.2)  # warm up
    c0, b0, f0, n0 = count, s.stats["bytes"], s.stats["fsyncs"], s.stats["batches"]
    t0, cpu0, w0 = time.perf_counter(), time.process_time(), writer_thread_cpu()
    await asyncio.sleep(seconds)
    c1, b1, f1, n1 = count, s.stats["bytes"], s.stats["fsyncs"], s.stats["batches"]
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    wcpu = writer_thread_cpu() - w0
    stop = True
    await asyncio.gather(*tasks)
    await s.close()
    return {"records": c1 - c0, "bytes": b1 - b0, "fsyncs": f1 - f0, "batches": n1 - n0,
            "seconds": dt, "cpu_seconds": cpu, "writer_cpu_seconds": wcpu}


def writer_thread_cpu() -> float:
    """CPU seconds (user + system) of the store's writer thread so far (0 if none)."""
    for t in threading.enumerate():
        if t.name == "lockmq-store-writer" and t.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    return 0.0


def floor_run(path: str, record: bytes, write_bytes: int, writes_per_fsync: float,
              seconds: float) -> float:
    """Plain loop: write ``write_bytes`` of records per write(), fdatasync every
    ``writes_per_fsync`` writes. Returns records/s."""
    per_write = max(1, round(write_bytes / len(record)))
    chunk = record * per_write
    fd = os.open(os.path.join(path, "floor.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        every = max(1, round(writes_per_fsync))
        n = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while True:
            os.write(fd, chunk)
            n += 1
            if n % every == 0:
                os.fdatasync(fd)
                if time.perf_counter() >= end:
                    break
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(os.path.join(path, "floor.log"))
    return n * per_write / dt


def throughput(args, bench_dir: str, loop_name: str) -> dict:
    record = encode_record(NewRecord("locks", "LOCK000000", 0, 1_700_000_000_000, PAYLOAD),
                           time.time_ns() // 1000, 1 << 20)
    cases = ([("sync", w, 1) for w in args.writers]
             + [("sync", w, args.batch) for w in args.batched_writers]
             + [("async", w, 1) for w in args.async_writers])
    out = {}
    print(f"\nappends, 24-byte payloads ({len(record)}-byte records), {args.seconds}s per run, "
          f"{args.runs} runs, event loop: {loop_name}")
    naive = []
    for _ in range(args.runs):
        naive.append(floor_run(bench_dir, record, len(record), 1, min(1.0, args.seconds)))
    print(f"  naive floor (write+fdatasync per record)        rec/s {stats3(naive)}")
    out["naive_floor_rec_s"] = naive
    for flush, writers, per_call in cases:
        rates, floors, ratios, mbs, batch, cpu_us = [], [], [], [], [], []
        for _ in range(args.runs):
            d = tempfile.mkdtemp(dir=bench_dir)
            try:
                r = asyncio.run(store_run(d, flush, writers, args.seconds, per_call))
            finally:
                shutil.rmtree(d, ignore_errors=True)
            rate = r["records"] / r["seconds"]
            write_bytes = r["bytes"] / max(1, r["batches"])
            wpf = r["batches"] / max(1, r["fsyncs"])
            fl = floor_run(bench_dir, record, int(write_bytes), wpf, min(1.0, args.seconds))
            rates.append(rate)
            floors.append(fl)
            ratios.append(rate / fl)
            mbs.append(r["bytes"] / r["seconds"] / 1e6)
            batch.append(r["records"] / max(1, r["batches"]))
            cpu_us.append(r["cpu_seconds"] / max(1, r["records"]) * 1e6)
        calls = f" x{per_call}" if per_call > 1 else ""  # records per append call
        label = f"{flush:5} {writers:5} writers{calls}"
        print(f"  {label:24}  rec/s {stats3(rates)}   MB/s median {statistics.median(mbs):.2f}"
              f"   records/batch median {statistics.median(batch):.0f}"
              f"   CPU us/record median {statistics.median(cpu_us):.1f}")
        print(f"  {'':24}  floor {stats3(floors)}   store/floor {ratio3(ratios)}")
        out[f"{flush}_{writers}{calls.strip()}"] = {
            "rec_s": rates, "floor_rec_s": floors, "ratio": ratios, "mb_s": mbs,
            "records_per_batch": batch, "cpu_us_per_record": cpu_us}
    return out


def one_case(args) -> None:
    """--one-case FLUSH,WRITERS,PER_CALL: one store_run, printed as JSON (a
    --compare subprocess, which may run another tree's lockmq)."""
    flush, writers, per_call = args.one_case.split(",")
    d = tempfile.mkdtemp(dir=args.dir or os.getcwd())
    try:
        r = asyncio.run(store_run(d, flush, int(writers), args.seconds, int(per_call)))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(r))


def compare(args, bench_dir: str) -> dict:
    """This tree ("after") against --baseline TREE ("before") and/or itself with
    LOCKMQ_PURE_PYTHON=1 ("pure"): each case's variants run alternately, one fresh
    process each, so a busy machine slows all of them alike. Prints rates, process
    and writer-thread CPU per record (min/median/max) and per-run ratios to "after"."""
    variants = {"after": {}}
    if args.baseline:
        variants["before"] = {"PYTHONPATH": os.path.join(os.path.abspath(args.baseline), "host")}
    if args.pure:
        variants["pure"] = {"LOCKMQ_PURE_PYTHON": "1"}
    cases = ([f"sync,{w},1" for w in args.writers]
             + [f"sync,{w},{args.batch}" for w in args.batched_writers]
             + [f"async,{w},1" for w in args.async_writers])
    out: dict = {}
    for case in cases:
        got: dict[str, list[dict]] = {v: [] for v in variants}
        for _ in range(args.runs):
            for name, env in variants.items():
                res = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--one-case", case,
                     "--seconds", str(args.seconds), "--dir", bench_dir]
                    + (["--no-uvloop"] if args.no_uvloop else []),
                    env={**os.environ, **env}, capture_output=True, text=True, check=True)
                got[name].append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(f"\n  case {case} (flush, writers, records per call)")
        out[case] = {}
        for name, runs in got.items():
            n = [max(1, r["records"]) for r in runs]
            fig = {"rec_s": [r["records"] / r["seconds"] for r in runs],
                   "cpu_us": [r["cpu_seconds"] / k * 1e6 for r, k in zip(runs, n)],
                   "writer_cpu_us": [r["writer_cpu_seconds"] / k * 1e6 for r, k in zip(runs, n)],
                   "records_per_batch": [r["records"] / max(1, r["batches"]) for r in runs]}
            out[case][name] = fig
            print(f"    {name:7} rec/s {stats3(fig['rec_s'])}   records/batch median "
                  f"{statistics.median(fig['records_per_batch']):.0f}")
            for key in ("cpu_us", "writer_cpu_us"):
                xs = fig[key]
                line = (f"    {'':7} {key:14} min {min(xs):.2f}  median "
                        f"{statistics.median(xs):.2f}  max {max(xs):.2f}")
                if name != "after":
                    rs = [a / b for a, b in zip(out[case]["after"][key], xs)]
                    line += f"   after/{name} {ratio3(rs)}"
                print(line)
    return out


async def inline_run(path: str, writers: int, per_call: int, rounds: int) -> int:
    """The append path without the writer thread and without disk I/O: each loop
    turn plans and completes what is queued, on the loop. Deterministic, so its
    instruction count (``valgrind --tool=callgrind``) compares code versions on a
    busy machine. Returns the records stored."""
    s = Store.open(StoreConfig(data_dir=path, flush="sync", min_free_bytes=0))
    loop = asyncio.get_running_loop()

    def drain() -> None:
        with s._lock:
            batch = s._take_batch()
        if batch:
            s._process(batch)
        loop.call_soon(drain)

    s._loop, s._thread = loop, threading.current_thread()  # no writer thread
    s._write = lambda plan: None  # type: ignore[method-assign]
    loop.call_soon(drain)

    async def writer(w: int) -> None:
        sn = f"LOCK{w:06d}"
        for r in range(rounds):
            await s.append([NewRecord("locks", sn, r * per_call + k, 1_700_000_000_000,
                                      PAYLOAD) for k in range(per_call)])

    await asyncio.gather(*(writer(w) for w in range(writers)))
    s._thread = None
    s.close_sync()
    return s.stats["records"]


def inline_path(args) -> None:
    writers, per_call = (int(x) for x in args.inline_case.lower().split("x"))
    d = tempfile.mkdtemp()
    try:
        t0 = time.thread_time()
        n = asyncio.run(inline_run(d, writers, per_call, args.inline_rounds))
        dt = time.thread_time() - t0
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"inline path, {writers} writers x{per_call}: {n} records, "
          f"{dt / max(1, n) * 1e6:.2f} CPU us/record (store opening included)")


TAIL_CHILD = r"""
import asyncio, os, sys
from lockmq.store import NewRecord, Store, StoreConfig
async def main():
    s = Store.open(StoreConfig(data_dir=sys.argv[1], flush="async", min_free_bytes=0,
                               checkpoint_interval_ms=10**9, checkpoint_bytes=1 << 62))
    want, seq, payload = int(sys.argv[2]), 0, bytes(range(24))
    while s.log_end - s.recovery.log_end < want:
        await s.append([NewRecord("locks", "TAIL", seq + k, 0, payload) for k in range(5000)])
        seq += 5000
    os._exit(0)  # a crash: no close, no checkpoint
asyncio.run(main())
"""


async def build_log(path: str, nbytes: int) -> None:
    s = Store.open(StoreConfig(data_dir=path, flush="async", min_free_bytes=0))
    seq = 0
    sns = [f"LOCK{i:06d}" for i in range(1000)]
    while s.log_end < nbytes:  # 1000 locks, each with its own in-order sequence
        await s.append([NewRecord("locks", sns[k % 1000], (seq + k) // 1000,
                                  1_700_000_000_000, PAYLOAD) for k in range(5000)])
        seq += 5000
    await s.close()


def recovery(args, bench_dir: str) -> dict:
    path = os.path.join(bench_dir, "recovery")
    print(f"\nstart-up recovery, log of {args.recovery_bytes / (1 << 20):,.0f} MiB "
          f"(building it...)", flush=True)
    t0 = time.perf_counter()
    asyncio.run(build_log(path, args.recovery_bytes))
    print(f"  built in {time.perf_counter() - t0:.1f}s", flush=True)
    out = {}

    def timed_open() -> tuple[float, Store]:
        t = time.perf_counter()
        s = Store.open(StoreConfig(data_dir=path, min_free_bytes=0))
        return time.perf_counter() - t, s

    clean = []
    for _ in range(args.runs):
        dt, s = timed_open()
        s.close_sync()
        clean.append(dt)
    print(f"  clean restart                       seconds min {min(clean):.3f}  "
          f"median {statistics.median(clean):.3f}  max {max(clean):.3f}")
    out["clean_s"] = clean

    # crash with a tail behind the checkpoint
    subprocess.run([sys.executable, "-c", TAIL_CHILD, path, str(args.tail_bytes)], check=True)
    cp = os.path.join(path, "checkpoint")
    with open(cp, "rb") as f:
        cp_blob = f.read()
    crash, scanned = [], 0
    for _ in range(args.runs):
        with open(cp, "wb") as f:  # put back the pre-crash checkpoint each run
            f.write(cp_blob)
        dt, s = timed_open()
        scanned = s.recovery.scanned_bytes
        total = s.log_end - s.log_start
        s.close_sync()
        crash.append(dt)
    print(f"  after a crash, {scanned / (1 << 20):.1f} MiB tail of {total / (1 << 20):,.0f} MiB"
          f"  seconds min {min(crash):.3f}  median {statistics.median(crash):.3f}  "
          f"max {max(crash):.3f}")
    out["crash_s"] = crash
    out["crash_tail_bytes"] = scanned
    if args.full_rebuild:
        full = []
        for _ in range(max(1, args.runs // 2)):
            os.unlink(cp)
            dt, s = timed_open()
            s.close_sync()
            full.append(dt)
        print(f"  no checkpoint (reads everything)    seconds min {min(full):.3f}  "
              f"median {statistics.median(full):.3f}  max {max(full):.3f}")
        out["full_rebuild_s"] = full
    shutil.rmtree(path, ignore_errors=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=None,
                   help="where to write (default: a temp dir under the current directory; "
                        "use a real disk, not tmpfs)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="measured seconds per run")
    p.add_argument("--writers", type=int_list,
                   default=[1, 100, 1000], help="sync writer counts (default 1,100,1000)")
    p.add_argument("--batched-writers", type=int_list,
                   default=[10], help="sync writers appending --batch records per call "
                                      "(default 10; empty skips)")
    p.add_argument("--batch", type=int, default=100,
                   help="records per append call for --batched-writers (default 100)")
    p.add_argument("--async-writers", type=int_list,
                   default=[1000], help="async writer counts (default 1000)")
    p.add_argument("--recovery-bytes", type=size_arg, default=1 << 30,
                   help="log size for the start-up test (default 1G; 0 skips it)")
    p.add_argument("--tail-bytes", type=size_arg, default=16 << 20,
                   help="log written after the last checkpoint before the crash "
                        "(default 16M, the default checkpoint_bytes bound)")
    p.add_argument("--full-rebuild", action="store_true",
                   help="also time start-up without a checkpoint (reads the whole log)")
    p.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    p.add_argument("--inline-rounds", type=int, default=0,
                   help="only run the append path inline (no writer thread, no disk I/O) "
                        "for this many appends per writer, for instruction counts: run "
                        "under valgrind --tool=callgrind with 1 and 11, divide the "
                        "difference by the extra records (10 x writers x records per call)")
    p.add_argument("--inline-case", default="1000x1",
                   help="WRITERSxRECORDS_PER_CALL for --inline-rounds (default 1000x1; "
                        "the broker's batched path: 10x100)")
    p.add_argument("--compare", action="store_true",
                   help="only the append cases, this tree against --baseline and/or --pure, "
                        "alternating fresh processes; reports writer-thread CPU per record")
    p.add_argument("--baseline", default=None, metavar="TREE",
                   help="with --compare: another source tree (git archive main | tar -x -C TREE)")
    p.add_argument("--pure", action="store_true",
                   help="with --compare: also this tree with LOCKMQ_PURE_PYTHON=1")
    p.add_argument("--one-case", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    loop_name = "asyncio"
    if not args.no_uvloop:
        try:
            import uvloop
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            loop_name = f"uvloop {uvloop.__version__}"
        except ImportError:
            pass
    if args.inline_rounds:
        inline_path(args)
        return 0
    if args.one_case:
        one_case(args)
        return 0
    if args.compare:
        bench_dir = tempfile.mkdtemp(prefix="lockmq-bench-", dir=args.dir or os.getcwd())
        try:
            info = machine_facts(bench_dir)
            print("machine: " + json.dumps(info))
            result = {"machine": info, "compare": compare(args, bench_dir)}
            print("\njson: " + json.dumps(result))
        finally:
            shutil.rmtree(bench_dir, ignore_errors=True)
        return 0
    bench_dir = tempfile.mkdtemp(prefix="lockmq-bench-", dir=args.dir or os.getcwd())
    try:
        info = machine_facts(bench_dir)
        print("machine: " + json.dumps(info))
        result = {"machine": info, "throughput": throughput(args, bench_dir, loop_name)}
        if args.recovery_bytes:
            result["recovery"] = recovery(args, bench_dir)
        print("\njson: " + json.dumps(result))
    finally:
        shutil.rmtree(bench_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
