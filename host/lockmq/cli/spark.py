"""``lockmq spark``: run the Spark ingest job and the reports (local or any --master)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = """\
Spark jobs over the broker's commit logs (PySpark >= 4.2 and Java 17 needed):

  lockmq spark ingest SRC [SRC ...] --warehouse DIR
      decode the logs under SRC (data directories, exports, folders of exports),
      drop repeated message ids (sn:seq, also against earlier runs), append to
      DIR/events partitioned by date, move the checkpoint; a rerun adds nothing,
      a moved landing is recognised, a second ingest into DIR meanwhile fails.
  lockmq spark report --warehouse DIR [--out DIR]
      daily activity, failed-attempt bursts, offline periods, clock delay,
      sequence gaps; each a Parquet table plus one printed line.

Runs on local[*] by default; --master (or spark-submit spark/ingest_job.py ...)
for a cluster; --conf k=v passes any Spark setting. See docs/spark.md.
"""


def register(subparsers: Any) -> None:
    """Add the ``spark`` command group."""
    p = subparsers.add_parser("spark", help="Spark ingest job and reports",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="spark_command", metavar="COMMAND")
    ing = sub.add_parser("ingest", help="ingest commit logs into Parquet")
    ing.add_argument("sources", nargs="+", metavar="SRC")
    _common(ing)
    ing.add_argument("--gateway-id", help="gateway id for logs that carry none")
    ing.add_argument("--wait", type=float, default=0.0, metavar="S",
                     help="wait up to S seconds for another ingest into the warehouse (default: fail at once)")
    ing.set_defaults(func=run_ingest)
    rep = sub.add_parser("report", help="compute the operator reports")
    _common(rep)
    rep.add_argument("--out", help="where report tables go (default WAREHOUSE/reports)")
    rep.add_argument("--only", action="append", metavar="NAME", help="run only this report (repeatable)")
    rep.add_argument("--burst-count", type=int, default=5, help="failed attempts that make a burst (5)")
    rep.add_argument("--burst-window", type=float, default=120.0, metavar="S", help="burst window, s (120)")
    rep.add_argument("--offline-after", type=float, default=120.0, metavar="S",
                     help="silence that counts as offline, s (120: the broker's eviction time)")
    rep.add_argument("--clock-tolerance", type=float, default=30.0, metavar="S",
                     help="median lock-to-broker delay above which a lock's clock is off, s (30)")
    rep.add_argument("--seq-block", type=int, default=64, metavar="N",
                     help="the locks' sequence block (firmware seq_block, 64): a jump of at most N "
                          "across a reconnect is a power cut's skip, not lost records (0: count every jump)")
    rep.set_defaults(func=run_report)
    p.set_defaults(func=lambda _args: (p.print_help(), 2)[1])


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warehouse", "-w", required=True, metavar="DIR", help="Parquet warehouse directory")
    p.add_argument("--master", help="Spark master (default local[*], or what spark-submit set)")
    p.add_argument("--conf", action="append", default=[], metavar="K=V",
                   help="a Spark setting, as spark-submit's --conf (repeatable)")


def parse_conf(pairs: list[str]) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{k: v}``; raises ValueError naming a malformed pair."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf wants KEY=VALUE, got {pair!r}")
        out[key.strip()] = value
    return out


def run_ingest(args: argparse.Namespace) -> int:
    """``lockmq spark ingest``."""
    import os

    from lockmq.spark.ingest import ingest
    from lockmq.spark.session import get_session, session_exists, stop_if_created
    from lockmq.spark.warehouse import WarehouseBusy

    missing = [s for s in args.sources if not os.path.isdir(s)]
    if missing:
        print(f"lockmq spark ingest: no such directory: {', '.join(missing)}", file=sys.stderr)
        return 1
    try:
        conf = parse_conf(args.conf)
    except ValueError as exc:
        print(f"lockmq spark ingest: {exc}", file=sys.stderr)
        return 2
    existed = session_exists()
    spark = get_session("lockmq-ingest", master=args.master, conf=conf, datasource=False, short_job=True)
    try:
        res = ingest(spark, args.sources, args.warehouse, gateway_id=args.gateway_id, wait=args.wait)
    except (FileNotFoundError, ValueError, WarehouseBusy) as exc:
        print(f"lockmq spark ingest: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_if_created(spark, existed)
    print(res.summary())
    return 0


def run_report(args: argparse.Namespace) -> int:
    """``lockmq spark report``."""
    from lockmq.spark.reports import ReportSettings, run_reports
    from lockmq.spark.session import get_session, session_exists, stop_if_created

    import os

    settings = ReportSettings(args.burst_count, args.burst_window, args.offline_after, args.clock_tolerance,
                              args.seq_block)
    try:
        settings.validate()
        conf = parse_conf(args.conf)
    except ValueError as exc:
        print(f"lockmq spark report: {exc}", file=sys.stderr)
        return 2
    if not os.path.isdir(os.path.join(args.warehouse, "events")):
        print(f"lockmq spark report: no events table in {args.warehouse} (run `lockmq spark ingest` first)",
              file=sys.stderr)
        return 1
    existed = session_exists()
    spark = get_session("lockmq-report", master=args.master, conf=conf)
    try:
        run_reports(spark, args.warehouse, args.out, settings, args.only)
    except (FileNotFoundError, ValueError) as exc:
        print(f"lockmq spark report: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_if_created(spark, existed)
    return 0
