"""Benchmark: the lockmq Spark ingest against a plain pyarrow script, and the data source.

    .venv/bin/python bench/bench_spark.py [--records 2000000] [--runs 3] [--cores 2] [--cluster] [--quick]

Generates N lock-event records with the real storage engine (``lockmq.store``),
exports them with ``lockmq export --include-active`` to a landing (what the
ingest reads in production), then measures, alternating, each ``--runs`` times:

- baseline: the plain script a user would write instead -- decode the landing with
  lockmq's decoder, keep the earliest copy of every ``message_id`` with pyarrow,
  write the same date-partitioned Parquet with ``pyarrow.parquet.write_to_dataset``
  (one process, no Spark); its rows are checked equal to the ingest's;
- ingest job: :func:`lockmq.spark.ingest.ingest` in a warm local[cores] session;
- CLI ingest: ``lockmq spark ingest LANDING --master local[cores]`` as a new
  process, its own job time (summary line) and the wall time (JVM start included);
- spark-submit: docs/spark.md's ``spark-submit ... spark/ingest_job.py`` recipe on
  ``local[cores]``, wall time, and its ratio to the CLI's (target <= 1.2);
- start-up: a new process that only starts the same session and runs
  ``spark.range(1).count()`` (what bounds the CLI's wall time on small inputs);
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

With ``--quick`` only the baseline and the two ingest lines run. Prints the
machine, min/median/max records/s and each median as a ratio of the baseline's.
Target: the ingest job on local[2] at >= 0.5x the baseline's rate.
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


def baseline(landing: str, out: str) -> int:
    """The plain pyarrow ingest (see the module docstring); returns the rows written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from lockmq.spark.decoder import decode_file
    from lockmq.spark.layout import find_logs

    batches = []
    for log in find_logs(landing):
        segs = log.segments()
        for i, seg in enumerate(segs):
            batches += decode_file(seg.path, seg.base, log.gateway_id, closed=i + 1 < len(segs))
    t = pa.Table.from_batches(batches)
    t = t.filter(pc.is_null(t["error"])).drop_columns(["error"])
    t = t.take(pc.sort_indices(t, [("broker_ts", "ascending"), ("gateway_id", "ascending"), ("offset", "ascending")]))
    first = (t.select(["message_id"]).append_column("_i", pa.array(np.arange(t.num_rows)))
             .group_by("message_id", use_threads=False).aggregate([("_i", "min")]))
    t = t.take(np.sort(first["_i_min"].to_numpy()))
    t = t.append_column("date", pc.cast(t["broker_ts"], pa.date32()))
    pq.write_to_dataset(t, out, partition_cols=["date"])
    return t.num_rows


def same_rows(a: str, b: str) -> bool:
    """Both tables hold the same ``(message_id, broker_ts)`` set, one row per id."""
    import pyarrow.parquet as pq

    def ids(path: str) -> list:
        t = pq.read_table(path, columns=["message_id", "broker_ts"]).sort_by("message_id")
        return list(zip(t["message_id"].to_pylist(), t["broker_ts"].to_pylist()))

    x, y = ids(a), ids(b)
    return x == y and len({m for m, _ in x}) == len(x)


def cli_ingest(landing: str, wh: str, cores: int) -> tuple[float, float, int]:
    """``lockmq spark ingest`` as a new process: (job seconds, wall seconds, new rows)."""
    import re
    import subprocess

    lockmq = os.path.join(os.path.dirname(sys.executable), "lockmq")
    t = time.perf_counter()
    done = subprocess.run([lockmq, "spark", "ingest", landing, "--warehouse", wh, "--master", f"local[{cores}]"],
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t
    m = re.search(r"(\d+) new.*, ([\d.]+) s$", done.stdout.strip().splitlines()[-1])
    assert m, done.stdout + done.stderr
    return float(m[2]), wall, int(m[1])


def submit_ingest(landing: str, wh: str, cores: int) -> tuple[float, float, int]:
    """docs/spark.md's ``spark-submit`` recipe on ``local[cores]``: (job s, wall s, new rows)."""
    import re
    import subprocess

    from lockmq.spark import ingest_job
    from lockmq.spark.session import SHORT_JOB_JAVA_OPTIONS
    from lockmq.testing.spark_cluster import spark_home

    t = time.perf_counter()
    done = subprocess.run([os.path.join(spark_home(), "bin", "spark-submit"), "--master", f"local[{cores}]",
                           f"--driver-java-options={SHORT_JOB_JAVA_OPTIONS}",
                           "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false",
                           ingest_job.__file__, landing, "--warehouse", wh],
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t
    m = re.search(r"(\d+) new.*, ([\d.]+) s$", done.stdout.strip().splitlines()[-1])
    assert m, done.stdout + done.stderr
    return float(m[2]), wall, int(m[1])


def startup(cores: int) -> float:
    """Wall seconds of a new process that only starts the CLI's Spark session and runs
    ``spark.range(1).count()``: the part of ``lockmq spark ingest`` no ingest can remove."""
    import subprocess

    code = ("from lockmq.spark.session import get_session\n"
            f"s = get_session('startup', master='local[{cores}]', datasource=False, short_job=True)\n"
            "s.range(1).count()\ns.stop()\n")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    return time.perf_counter() - t


def cluster_runs(args: argparse.Namespace, src: str, work: str, res: dict[str, list[float]]) -> None:
    """spark-submit the ingest job ``args.runs`` times to a fresh standalone cluster."""
    import re

    from lockmq.spark import ingest_job
    from lockmq.spark.session import SHORT_JOB_JAVA_OPTIONS
    from lockmq.testing.spark_cluster import SparkCluster

    res["cluster ingest (job)"], res["cluster spark-submit"] = [], []
    with SparkCluster(os.path.join(work, "cluster"), workers=args.workers, cores=1,
                      memory=args.worker_memory) as cluster:
        for run in range(args.runs):
            wh = os.path.join(work, f"cwh{run}")
            t = time.perf_counter()
            done = cluster.submit([ingest_job.__file__, src, "--warehouse", wh],
                                  conf={"spark.driver.extraJavaOptions": SHORT_JOB_JAVA_OPTIONS})
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
    p.add_argument("--quick", action="store_true", help="only the baseline and the ingest lines")
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

        from lockmq.export import export

        landing = os.path.join(work, "landing")
        t = time.perf_counter()
        exp = export(src, os.path.join(landing, "gw-bench"), gateway_id="gw-bench", include_active=True)
        assert exp.records == args.records, exp.summary()
        print(f"exported to {landing} in {time.perf_counter() - t:.1f} s", flush=True)

        spark = get_session("lockmq-bench", master=f"local[{args.cores}]")
        spark.sparkContext.setLogLevel("ERROR")
        # warm up: start the Python workers on a tiny log
        tiny = os.path.join(work, "tiny")
        generate.write_log(tiny, generate.bulk(1000, 10))
        spark.read.format("lockmq").load(tiny).count()

        res: dict[str, list[float]] = {"baseline (plain pyarrow)": [], "ingest job": [],
                                       "CLI ingest (job)": [], "CLI ingest (wall)": [],
                                       "spark-submit (wall)": []}
        starts: list[float] = []
        submit_vs_cli: list[float] = []
        if not args.quick:
            res.update({"floor (1 thread numpy)": [], "source->parquet": [], "reports": []})
        ratios: list[float] = []
        for run in range(args.runs):
            out = os.path.join(work, f"base{run}")
            t = time.perf_counter()
            n = baseline(landing, out)
            res["baseline (plain pyarrow)"].append(n / (time.perf_counter() - t))
            assert n == args.records, (n, args.records)

            wh = os.path.join(work, f"wh{run}")
            t = time.perf_counter()
            r = ingest(spark, [landing], wh)
            res["ingest job"].append(args.records / (time.perf_counter() - t))
            assert r.new == args.records, r
            print("  ingest steps: " + ", ".join(f"{k} {v:.2f} s" for k, v in r.steps.items())
                  + f"; baseline {args.records / res['baseline (plain pyarrow)'][-1]:.2f} s", flush=True)
            ratios.append(res["ingest job"][-1] / res["baseline (plain pyarrow)"][-1])
            if run == 0:
                assert same_rows(out, os.path.join(wh, "events")), "the ingest and the baseline differ"
            shutil.rmtree(out, ignore_errors=True)

            cwh = os.path.join(work, f"cwh{run}")
            job, wall, new = cli_ingest(landing, cwh, args.cores)
            assert new == args.records
            res["CLI ingest (job)"].append(args.records / job)
            res["CLI ingest (wall)"].append(args.records / wall)
            shutil.rmtree(cwh, ignore_errors=True)
            starts.append(startup(args.cores))
            _, swall, new = submit_ingest(landing, cwh, args.cores)
            assert new == args.records
            res["spark-submit (wall)"].append(args.records / swall)
            submit_vs_cli.append(swall / wall)
            shutil.rmtree(cwh, ignore_errors=True)

            if not args.quick:
                t = time.perf_counter()
                n = floor(src)
                res["floor (1 thread numpy)"].append(n / (time.perf_counter() - t))
                out = os.path.join(work, f"pq{run}")
                t = time.perf_counter()
                (spark.read.format("lockmq").option("minPartitions", args.cores).load(src)
                 .write.mode("overwrite").parquet(out))
                res["source->parquet"].append(args.records / (time.perf_counter() - t))
                shutil.rmtree(out, ignore_errors=True)
                t = time.perf_counter()
                run_reports(spark, wh, echo=lambda s: None)
                res["reports"].append(args.records / (time.perf_counter() - t))
            shutil.rmtree(wh, ignore_errors=True)
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1] / 1e6:.2f}M/s" for k, v in res.items()),
                  flush=True)
        spark.stop()
        if args.cluster:
            cluster_runs(args, landing, work, res)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)

    base = statistics.median(res["baseline (plain pyarrow)"])
    print(f"\n{'records/s':26s} {'min':>10s} {'median':>10s} {'max':>10s} {'x base':>7s}")
    for k, v in res.items():
        med = statistics.median(v)
        print(f"{k:26s} {min(v):10.0f} {med:10.0f} {max(v):10.0f} {med / base:7.2f}")
    print(f"\nSpark start-up alone (new process: session + spark.range(1).count()), s: min {min(starts):.1f}, "
          f"median {statistics.median(starts):.1f}, max {max(starts):.1f}; baseline median "
          f"{args.records / base:.1f} s: the CLI's wall time is at most "
          f"{(args.records / base) / statistics.median(starts):.2f}x the baseline's at this size")
    print(f"spark-submit recipe wall / lockmq spark ingest wall, per round: "
          f"{', '.join(f'{r:.2f}' for r in submit_vs_cli)} (target <= 1.2)")
    ratio = statistics.median(ratios)
    print(f"\ningest job / baseline, per round: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"target: ingest job on local[{args.cores}] >= 0.5x the baseline: "
          f"{'met' if ratio >= 0.5 else 'NOT met'} ({ratio:.2f}x, median of the rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
