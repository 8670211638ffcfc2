"""The ingest job as a spark-submit application.

    spark-submit --master spark://host:7077 --py-files lockmq-0.1.0-py3-none-any.whl \\
        spark/ingest_job.py /landing/exports --warehouse /warehouse/lockmq [--report]

Also runs as ``python -m lockmq.spark.ingest_job ...`` (local[*]). The master and
resources come from spark-submit; this file only parses its own arguments.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, ingest, optionally run the reports."""
    p = argparse.ArgumentParser(prog="ingest_job", description="lockmq commit logs -> Parquet")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("--warehouse", "-w", required=True)
    p.add_argument("--gateway-id")
    p.add_argument("--report", action="store_true", help="run the reports after ingesting")
    p.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds for another ingest into the warehouse (default: fail at once)")
    p.add_argument("--log-level", default="WARN", help="Spark's log level (WARN: not a line per task)")
    args = p.parse_args(argv)

    from lockmq.spark.ingest import ingest
    from lockmq.spark.reports import run_reports
    from lockmq.spark.session import get_session, session_exists, stop_if_created
    from lockmq.spark.warehouse import WarehouseBusy

    existed = session_exists()
    spark = get_session("lockmq-ingest", datasource=False, short_job=not args.report)
    if not existed:
        spark.sparkContext.setLogLevel(args.log_level)
    try:
        try:
            res = ingest(spark, args.sources, args.warehouse, gateway_id=args.gateway_id, wait=args.wait)
        except WarehouseBusy as exc:
            print(exc, file=sys.stderr)
            return 1
        print(res.summary())
        if args.report:
            run_reports(spark, args.warehouse)
    finally:
        stop_if_created(spark, existed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
