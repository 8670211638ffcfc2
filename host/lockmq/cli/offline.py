"""``lockmq offline``: the locks that went offline, when each was last seen and why.

Asks a running broker (the ``devices.offline`` admin op): every lock that went
offline since the broker started and has not come back, longest gone first.
``lockmq devices online`` lists the others. A lock that has not connected since
the broker started is in neither list (the ``$devices`` topic holds the history).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from lockmq.cli._admin import admin_op
from lockmq.client.cliargs import add_connection_args, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq offline``."""
    p = sub.add_parser("offline", help="locks offline now, with when they were last seen",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(p)
    p.add_argument("--json", action="store_true", help="print the broker's JSON answer")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq offline``."""
    return admin_op(args, "devices.offline", lambda resp: _show(args, resp))


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _show(args: argparse.Namespace, resp: dict[str, Any]) -> int:
    devices = resp.get("devices", [])
    if args.json:
        print_json(resp)
        return 0
    if not devices:
        print("no lock has gone offline since the broker started")
        return 0
    rows = [{"sn": d["sn"],
             "last_seen": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                        time.gmtime(d["last_seen_ms"] / 1000)),
             "ago": _ago(d["offline_s"]), "reason": d["reason"]} for d in devices]
    print_table(rows, ["sn", "last_seen", "ago", "reason"])
    if resp.get("truncated"):
        print(f"... {resp['count'] - len(devices)} more (--json for the counts)")
    return 0
