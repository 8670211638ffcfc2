"""``lockmq clusters``: consumer clusters and their life cycle.

::

    lockmq clusters [NAME]                  every cluster (or one, with its members):
                                            members or "offline", lag, last activity
    lockmq clusters describe NAME           everything the broker knows about one cluster
    lockmq clusters reset NAME --to-earliest | --to-latest | --to-time ISO8601|MS
                               | --to-offset N | --shift-by N  [--dry-run]
                                            move its position (no member may be connected);
                                            N of --to-offset is a queue offset of the
                                            cluster's topic, as `clusters describe`
                                            (committed) and the broker's log lines and
                                            errors name them
    lockmq clusters delete NAME             forget it: position, owner, topic binding
    lockmq clusters NAME --delete           (the same, kept for old scripts)

Admin ops behind them: ``clusters``, ``clusters.reset``, ``clusters.delete``
(docs/operators.md). Clusters nobody uses expire by themselves after ``[clusters]
offsets_retention_ms``; one that fell behind retention skipped forward (SKIPPED).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from lockmq.cli._admin import with_admin
from lockmq.client import Admin
from lockmq.client.cliargs import add_connection_args, fail, print_json, time_arg, print_table, TIME_FORMS

ACTIONS = ("describe", "reset", "delete")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq clusters``."""
    p = sub.add_parser("clusters", help="consumer clusters: list, describe, reset, delete",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(p)
    p.add_argument("words", nargs="*", metavar="[ACTION] NAME",
                   help=f"a cluster name, or an action ({', '.join(ACTIONS)}) and a name")
    p.add_argument("--json", action="store_true", help="print the broker's JSON answer")
    p.add_argument("--watch", type=float, default=0, metavar="SECONDS",
                   help="repeat the list every SECONDS until interrupted")
    p.add_argument("--delete", action="store_true",
                   help="forget CLUSTER (same as `clusters delete NAME`)")
    to = p.add_mutually_exclusive_group()
    to.add_argument("--to-earliest", action="store_true",
                    help="reset: to the oldest retained message (replay)")
    to.add_argument("--to-latest", action="store_true",
                    help="reset: past the newest message (skip the backlog)")
    to.add_argument("--to-time", metavar="ISO8601|MS", type=time_arg("--to-time"),
                    help="reset: to the first message stored at or after this time "
                         f"({TIME_FORMS}: 2025-01-31T08:00:00Z; or ms since the epoch)")
    to.add_argument("--to-offset", metavar="N", type=_queue_offset,
                    help="reset: to queue offset N of the cluster's topic (the numbers "
                         "`clusters describe` shows as committed and queue_end; clamped "
                         "to the retained range)")
    to.add_argument("--shift-by", metavar="N", type=int,
                    help="reset: N messages forward (or back, negative) from the position")
    p.add_argument("--dry-run", action="store_true",
                   help="reset: print the position it would move to, change nothing")
    p.set_defaults(func=run)


def _queue_offset(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"--to-offset needs a queue offset (an integer "
                                         f">= 0), not {text!r}")
    return n


def _ago(ms: Any) -> str:
    """``last_active_ms`` for people: ``3h ago``."""
    if not isinstance(ms, int):
        return "-"
    s = max(0, time.time() - ms / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit} ago"
    return f"{int(s)}s ago"


def _show(resp: dict, args: argparse.Namespace, name: str | None) -> None:
    clusters = resp.get("clusters", [])
    if args.json:
        print_json(clusters)
        return
    if not clusters:
        print(f"no cluster {name!r}" if name else "no consumer clusters yet")
        return
    rows = []
    for c in clusters:
        rows.append({
            "cluster": c["name"], "topic": c["topic"],
            "members": len(c.get("members", [])) or "offline",
            "inflight": c.get("inflight", 0), "backlog": c.get("backlog", 0),
            "unread": c.get("unread", c.get("backlog", 0)),
            "retrying": c.get("retry_scheduled", 0), "dlq": c.get("dlq_size", 0),
            "skipped": c.get("skipped", 0), "last_active": _ago(c.get("last_active_ms")),
            "ordered": "yes" if c.get("ordered") else "no", "owner": c.get("owner", ""),
            "capped": "CAPPED" if c.get("cluster_capped") else "",
        })
    print_table(rows, ["cluster", "topic", "members", "inflight", "backlog", "unread",
                       "retrying", "dlq", "skipped", "last_active", "ordered", "owner",
                       "capped"])
    if name:
        _members(clusters)


def _members(clusters: list[dict]) -> None:
    for c in clusters:
        members = c.get("members", [])
        if members:
            print(f"\nmembers of {c['name']}:")
            print_table(members, ["id", "name", "peer", "inflight", "delivered", "acked",
                                  "nacked", "idle"])


def _describe(resp: dict, args: argparse.Namespace, name: str) -> int:
    clusters = resp.get("clusters", [])
    if not clusters:
        return fail(f"no cluster {name!r}")
    if args.json:
        print_json(clusters[0])
        return 0
    c = clusters[0]
    shown = dict(c, live="yes" if c.get("live", True) else "no (no member connected)",
                 last_active=f"{c.get('last_active_ms')} ({_ago(c.get('last_active_ms'))})")
    for key in ("name", "topic", "owner", "live", "last_active", "committed", "queue_end",
                "backlog", "unread", "inflight", "retry_scheduled", "dlq_size", "skipped",
                "ordered"):
        if key in shown:
            print(f"{key:16} {shown[key]}")
    for key, value in sorted(c.get("stats", {}).items()):
        print(f"{key:16} {value}")
    _members(clusters)
    return 0


def _reset_args(args: argparse.Namespace) -> dict[str, Any]:
    if args.dry_run:
        return {**_reset_args(argparse.Namespace(**{**vars(args), "dry_run": False})),
                "dry_run": True}
    if args.shift_by is not None:
        return {"shift_by": args.shift_by}
    if args.to_earliest:
        return {"to": "earliest"}
    if args.to_latest:
        return {"to": "latest"}
    if args.to_time is not None:
        return {"time_ms": args.to_time}
    if args.to_offset is not None:
        return {"to": args.to_offset}
    raise ValueError("reset needs --to-earliest, --to-latest, --to-time, --to-offset or "
                     "--shift-by")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq clusters``."""
    words = list(args.words)
    action = words.pop(0) if words and words[0] in ACTIONS and len(words) > 1 else ""
    if len(words) > 1:
        return fail(f"one cluster name expected, not {' '.join(words)!r}")
    name = words[0] if words else None
    if args.delete:
        if not name or action:
            return fail("--delete needs a CLUSTER (or use `clusters delete NAME`)")
        action = "delete"
    try:
        reset = _reset_args(args) if action == "reset" else {}
    except ValueError as exc:
        return fail(str(exc))
    try:
        return with_admin(args, lambda admin: _run_action(admin, args, action, name, reset))
    except KeyboardInterrupt:
        return 0


def _run_action(admin: Admin, args: argparse.Namespace, action: str, name: str | None,
                reset: dict[str, Any]) -> int:
    if action == "delete":
        resp = admin.request("clusters.delete", cluster=name)
        print(f"cluster {resp['cluster']} deleted (was owned by "
              f"{resp.get('owner') or 'nobody'})")
        return 0
    if action == "reset":
        resp = admin.request("clusters.reset", cluster=name, **reset)
        note = " (dry run: nothing changed)" if resp.get("dry_run") else ""
        print(f"cluster {resp['cluster']} on {resp['topic']}: position "
              f"{resp['before']} -> {resp['after']}{note}")
        return 0
    req = {"cluster": name} if name else {}
    if action == "describe":
        return _describe(admin.request("clusters", **req), args, name or "")
    while True:
        _show(admin.request("clusters", **req), args, name)
        if not args.watch:
            return 0
        time.sleep(args.watch)
        print()
