"""``lockmq standby``: promote a standby broker, or show where replication is."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from lockmq.client.cliargs import add_connection_args, print_json


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "standby", help="standby gateway: promote it, show replication status",
        description="A standby broker ([replication] role = \"standby\") follows its "
                    "primary's log. `promote` makes it a primary (after the primary "
                    "died: make sure it is really gone, or two brokers ack at once); "
                    "`status` asks a primary where its standby is.")
    sub = p.add_subparsers(dest="standby_command", metavar="ACTION", required=True)
    pr = sub.add_parser("promote", help="turn the standby on this machine into a primary")
    pr.add_argument("--config", "-c", metavar="FILE", help="the standby's TOML configuration")
    pr.add_argument("--data-dir", help="the standby's data directory (instead of --config)")
    pr.add_argument("--wait", type=float, default=30.0, metavar="S",
                    help="seconds to wait for the promotion (0: do not wait)")
    pr.set_defaults(func=promote)
    st = sub.add_parser("status", help="a primary's view of its standby (replica.status)")
    add_connection_args(st)   # --broker: the primary; --token: an admin token
    st.set_defaults(func=status)


def promote(args: argparse.Namespace) -> int:
    """Drop the promotion request into the data directory and wait for it."""
    from lockmq.replication.standby import is_promoted, request_promotion

    data_dir = args.data_dir
    if not data_dir:
        from lockmq.config import load_config
        try:
            data_dir = load_config(args.config).broker.data_dir
        except (OSError, ValueError) as exc:
            print(f"lockmq standby promote: bad configuration: {exc}", file=sys.stderr)
            return 2
    if is_promoted(data_dir):
        print(f"{data_dir} is already promoted")
        return 0
    request_promotion(data_dir)
    deadline = time.monotonic() + args.wait
    while args.wait and not is_promoted(data_dir):
        if time.monotonic() > deadline:
            print("promotion requested; the standby has not taken it yet (is it running?)",
                  file=sys.stderr)
            return 1
        time.sleep(0.05)
    print("promoted" if args.wait else "promotion requested")
    return 0


def status(args: argparse.Namespace) -> int:
    """Print ``replica.status`` of a primary."""
    from lockmq.cli._admin import admin_op

    return admin_op(args, "replica.status", lambda resp: print_json(resp) or 0)
