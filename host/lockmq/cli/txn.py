"""``lockmq txn list|resolve``: undecided transactional messages — inspect and decide.

A transaction is undecided between its half message and the producer's commit or
rollback (or the answer to a check-back). ``list`` shows them oldest first with the
check-backs sent so far; ``resolve`` commits (delivers) or rolls back (drops) one
by hand, e.g. for a producer group that is gone for good.
"""

from __future__ import annotations

import argparse

from typing import Any

from lockmq.cli._admin import admin_op
from lockmq.client.cliargs import add_connection_args, add_group, format_ms, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq txn list`` and ``lockmq txn resolve``."""
    tsub = add_group(sub, "txn", "undecided transactional messages: list, resolve", __doc__,
                     "txn_command")
    pl = tsub.add_parser("list", help="list undecided transactions")
    add_connection_args(pl)
    pl.add_argument("--limit", type=int, default=100, help="at most this many (oldest first)")
    pl.add_argument("--json", action="store_true", help="print the broker's JSON answer")
    pl.set_defaults(func=run_list)
    pr = tsub.add_parser("resolve", help="commit or roll back one transaction by hand")
    add_connection_args(pr)
    pr.add_argument("txn_id", type=int, help="the transaction id (see `lockmq txn list`)")
    pr.add_argument("outcome", choices=("commit", "rollback"))
    pr.set_defaults(func=run_resolve)


def run_list(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq txn list``."""
    return admin_op(args, "txn.list", lambda resp: _show_list(args, resp), limit=args.limit)


def _show_list(args: argparse.Namespace, resp: dict[str, Any]) -> int:
    if args.json:
        print_json(resp)
        return 0
    items = resp.get("transactions", [])
    if not items:
        print("no undecided transactions")
        return 0
    rows = [{**t, "stored": format_ms(t.get("stored_ms"))} for t in items]
    print_table(rows, ["txn_id", "msg_id", "topic", "group", "principal", "stored", "checks",
                       "bytes"])
    if resp.get("count", 0) > len(items):
        print(f"... {resp['count'] - len(items)} more (--limit)")
    return 0


def run_resolve(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq txn resolve``."""
    def show(resp: dict[str, Any]) -> int:
        print(f"transaction {args.txn_id}: {args.outcome}")
        return 0

    return admin_op(args, "txn.resolve", show, txn_id=args.txn_id, outcome=args.outcome)
