"""``lockmq topics``: every topic on the broker, its queue range and its clusters."""

from __future__ import annotations

import argparse

from typing import Any

from lockmq.cli._admin import admin_op
from lockmq.client.cliargs import add_connection_args, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq topics``."""
    p = sub.add_parser("topics", help="list topics (queue range, clusters)",
                       description=__doc__)
    add_connection_args(p)
    p.add_argument("--system", action="store_true",
                   help="include system topics ($devices, $retry.*, $dlq.*)")
    p.add_argument("--json", action="store_true", help="print the broker's JSON answer")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq topics``."""
    return admin_op(args, "topics", lambda resp: _show(args, resp))


def _show(args: argparse.Namespace, resp: dict[str, Any]) -> int:
    topics = [t for t in resp.get("topics", []) if args.system or not t.get("system")]
    if args.json:
        print_json(topics)
        return 0
    rows = [{"topic": t["topic"], "messages": t["queue_end"] - t["queue_start"],
             "first": t["queue_start"], "end": t["queue_end"],
             "clusters": ",".join(t.get("clusters", [])) or "-"} for t in topics]
    if not rows:
        print("no topics yet")
        return 0
    print_table(rows, ["topic", "messages", "first", "end", "clusters"])
    return 0
