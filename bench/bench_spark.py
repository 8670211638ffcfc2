"""Benchmark: the lockmq Spark data source and reports against a single-thread numpy floor.

    .venv/bin/python bench/bench_spark.py [--records 2000000] [--runs 3] [--cores 2] [--cluster]

Generates N lock-event records with the real storage engine (``lockmq.store``),
then measures, each ``--runs`` times:

- floor: plain single-threaded Python + numpy decoding the same segment files
  (``lockmq.spark.decoder``, the decoder the data source runs, no Spark);
- source->parquet: ``spark.read.format("lockmq").load(dir).write.parquet(...)`` on local[cores];
- ingest: the full ingest job (dedup by message id, date partitions, checkpoint);
- reports: all reports over the ingested table (records of the table per second);
- with ``--cluster``: the same ingest job ``spark-submit``-ted to a Spark standalone
  cluster on this machine (a master and ``--workers`` workers of one core each, from
  PySpark's ``bin/spark-class``; :mod:`lockmq.testing.spark_cluster`), timed twice:
  the job's own ingest time (its summary line) and the whole ``spark-submit``
  (driver JVM, executors and Python workers starting included).

Prints the machine, min/median/max records/s and each median as a ratio of the floor's.
Target: source->parquet on local[2] at least matches the floor (ratio >= 1.0).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402


def versions() -> str:
    """The libraries the figures depend on (the machine line is :func:`machine_info`)."""
    import numpy
    import pyarrow
    import pyspark

    return f"pyspark {pyspark.__version__}, pyarrow {pyarrow.__version__}, numpy {numpy.__version__}"


def floor(src: str) -> int:
    """Decode every segment single-threaded; returns the number of good records."""
    from lockmq.spark.decoder import decode_file
    from lockmq.spark.layout import list_segments

    n = 0
    for seg in list_segments(src):
        for b in decode_file(seg.path, seg.base, "gw", closed=False):
            n += b.num_rows
    return n


def cluster_runs(args: argparse.Namespace, src: str, work: str, res: dict[str, list[float]]) -> None:
    """spark-submit the ingest job ``args.runs`` times to a fresh standalone cluster."""
    import re

    from lockmq.spark import ingest_job
    from lockmq.testing.spark_cluster import SparkCluster

    res["cluster ingest (job)"], res["cluster spark-submit"] = [], []
    with SparkCluster(os.path.join(work, "cluster"), workers=args.workers, cores=1,
                      memory=args.worker_memory) as cluster:
        for run in range(args.runs):
            wh = os.path.join(work, f"cwh{run}")
            t = time.perf_counter()
            done = cluster.submit([ingest_job.__file__, src, "--warehouse", wh])
            total = time.perf_counter() - t
            m = re.search(r"read (\d+) records, (\d+) new.*, ([\d.]+) s$", done.stdout.strip().splitlines()[-1])
            assert m and int(m[2]) == args.records, done.stdout
            res["cluster ingest (job)"].append(args.records / float(m[3]))
            res["cluster spark-submit"].append(args.records / total)
            shutil.rmtree(wh, ignore_errors=True)
            print(f"cluster run {run + 1}/{args.runs}: job {args.records / float(m[3]) / 1e6:.2f}M/s, "
                  f"spark-submit {args.records / total / 1e6:.2f}M/s", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--locks", type=int, default=2000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--segment-mib", type=int, default=128, help="segment size of the generated log (store default)")
    p.add_argument("--writer", choices=("store", "format"), default="store",
                   help="write with the real engine (default) or the FORMAT.md test writer (faster)")
    p.add_argument("--cluster", action="store_true",
                   help="also ingest on a standalone cluster (master + --workers workers) via spark-submit")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-memory", default="1g", help="executor memory per worker on --cluster")
    p.add_argument("--dir", help="work directory (default: a temporary one, deleted after)")
    args = p.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_AUTH_SOCKET_TIMEOUT", "120")
    from lockmq.spark import generate
    from lockmq.spark.ingest import ingest
    from lockmq.spark.reports import run_reports
    from lockmq.spark.session import get_session

    work = args.dir or tempfile.mkdtemp(prefix="lockmq-bench-spark-")
    src = os.path.join(work, "data")
    print(machine_info())
    print(versions())
    try:
        t = time.perf_counter()
        recs = generate.bulk(args.records, args.locks)
        if args.writer == "store":
            generate.write_store(src, recs, batch=5000, segment_bytes=args.segment_mib << 20, flush="async")
        else:
            generate.write_log(src, recs, segment_bytes=args.segment_mib << 20)
        size = sum(e.stat().st_size for e in os.scandir(os.path.join(src, "message.log")))
        print(f"generated {args.records} records, {size / 2**20:.0f} MiB, in {time.perf_counter() - t:.1f} s "
              f"({args.writer} writer, {args.segment_mib} MiB segments)")

        spark = get_session("lockmq-bench", master=f"local[{args.cores}]")
        spark.sparkContext.setLogLevel("ERROR")
        # warm up: start the Python workers on a tiny log
        tiny = os.path.join(work, "tiny")
        generate.write_log(tiny, generate.bulk(1000, 10))
        spark.read.format("lockmq").load(tiny).count()

        res: dict[str, list[float]] = {"floor (1 thread numpy)": [], "source->parquet": [],
                                       "ingest job": [], "reports": []}
        for run in range(args.runs):
            t = time.perf_counter()
            n = floor(src)
            res["floor (1 thread numpy)"].append(n / (time.perf_counter() - t))
            assert n == args.records, (n, args.records)

            out = os.path.join(work, f"pq{run}")
            t = time.perf_counter()
            (spark.read.format("lockmq").option("minPartitions", args.cores).load(src)
             .write.mode("overwrite").parquet(out))
            res["source->parquet"].append(args.records / (time.perf_counter() - t))
            shutil.rmtree(out, ignore_errors=True)

            wh = os.path.join(work, f"wh{run}")
            t = time.perf_counter()
            r = ingest(spark, [src], wh)
            res["ingest job"].append(args.records / (time.perf_counter() - t))
            assert r.new == args.records, r

            t = time.perf_counter()
            run_reports(spark, wh, echo=lambda s: None)
            res["reports"].append(args.records / (time.perf_counter() - t))
            shutil.rmtree(wh, ignore_errors=True)
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1] / 1e6:.2f}M/s" for k, v in res.items()),
                  flush=True)
        spark.stop()
        if args.cluster:
            cluster_runs(args, src, work, res)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)

    base = statistics.median(res["floor (1 thread numpy)"])
    print(f"\n{'records/s':24s} {'min':>10s} {'median':>10s} {'max':>10s} {'x floor':>8s}")
    for k, v in res.items():
        med = statistics.median(v)
        print(f"{k:24s} {min(v):10.0f} {med:10.0f} {max(v):10.0f} {med / base:8.2f}")
    ratio = statistics.median(res["source->parquet"]) / base
    print(f"\ntarget: source->parquet on local[{args.cores}] >= floor: "
          f"{'met' if ratio >= 1 else 'NOT met'} ({ratio:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
