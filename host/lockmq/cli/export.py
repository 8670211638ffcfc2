"""``lockmq export``: copy a gateway's closed log segments (plus a manifest) for shipping."""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = """\
Copy the closed commit-log segments of a broker data directory to DEST (a
directory, or an uncompressed archive when DEST ends in .tar), with a
manifest.json holding the broker and gateway identity and a SHA-256 and record
count per segment. Segments already in DEST's manifest are not copied again:
run it from cron, exporting twice exports nothing new. Safe while the broker
runs (segments are only read). DEST reads directly with
`spark.read.format("lockmq").load(DEST)` or `lockmq spark ingest DEST ...`
(extract a .tar first).

--parquet DIR also decodes the newly exported records into Parquet files
partitioned by date, with pyarrow only (for machines without Java).
"""


def register(subparsers: Any) -> None:
    """Add the ``export`` command."""
    p = subparsers.add_parser("export", help="export closed log segments for the data platform",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC_DATA_DIR", help="the broker's data directory (holds message.log/)")
    p.add_argument("dest", metavar="DEST", help="destination directory, or FILE.tar")
    p.add_argument("--gateway-id", help="gateway id written to the manifest (default: the broker's id, "
                                        "else the host name)")
    p.add_argument("--include-active", action="store_true",
                   help="also copy the complete records of the segment the broker is writing")
    p.add_argument("--parquet", metavar="DIR", help="also write the new records as Parquet (pyarrow, no Java)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run one export; exit status 1 with a message on a bad source or destination."""
    from lockmq.export import ExportError, export

    try:
        res = export(args.src, args.dest, gateway_id=args.gateway_id,
                     include_active=args.include_active, parquet=args.parquet)
    except (ExportError, OSError, ValueError) as exc:
        print(f"lockmq export: {exc}", file=sys.stderr)
        return 1
    print(res.summary())
    if res.parquet_files:
        print(f"wrote {len(res.parquet_files)} Parquet file(s) under {args.parquet}")
    return 0
