"""``lockmq dlq list|replay``: a cluster's dead letters — inspect and send back.

A message lands in the cluster's dead-letter topic after its last retry (the
broker's ``max_retries``), with the reason and delivery count. ``replay`` sends
chosen dead letters back to the cluster as new deliveries (retry count reset).
"""

from __future__ import annotations

import argparse

from lockmq.cli._admin import with_admin
from lockmq.client import Admin
from lockmq.client.cliargs import (add_connection_args, add_group, fail, format_ms, print_json,
                                   print_table, render_payload)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq dlq list`` and ``lockmq dlq replay``."""
    dsub = add_group(sub, "dlq", "dead letters of a consumer cluster: list, replay", __doc__,
                     "dlq_command")
    pl = dsub.add_parser("list", help="list a cluster's dead letters")
    add_connection_args(pl)
    pl.add_argument("cluster")
    pl.add_argument("--offset", type=int, default=0, help="first dead-letter offset")
    pl.add_argument("--limit", type=int, default=100, help="at most this many")
    pl.add_argument("--json", action="store_true", help="print the broker's JSON answer")
    pl.set_defaults(func=run_list)
    pr = dsub.add_parser("replay", help="send dead letters back to their cluster")
    add_connection_args(pr)
    pr.add_argument("cluster")
    which = pr.add_mutually_exclusive_group(required=True)
    which.add_argument("--offsets", type=int, nargs="+", help="dead-letter offsets to replay")
    which.add_argument("--all", action="store_true", help="replay every dead letter listed "
                       "from --offset (at most 1000)")
    pr.add_argument("--offset", type=int, default=0, help="with --all: where to start")
    pr.set_defaults(func=run_replay)


def _unknown_cluster(admin: Admin, cluster: str) -> str | None:
    """The error for a cluster the broker does not know (a typo must not look like
    an empty dead-letter queue), or None when it exists."""
    names = sorted({c["name"] for c in admin.request("clusters").get("clusters", [])})
    if cluster in names:
        return None
    return (f"no cluster named {cluster!r} (clusters: {', '.join(names) or 'none'}; "
            "see `lockmq clusters`)")


def run_list(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq dlq list``."""
    return with_admin(args, lambda admin: _list(args, admin))


def _list(args: argparse.Namespace, admin: Admin) -> int:
    resp = admin.request("dlq.list", cluster=args.cluster, offset=args.offset, limit=args.limit)
    if not resp.get("queue_end"):   # never a dead letter: is it a cluster at all?
        unknown = _unknown_cluster(admin, args.cluster)
        if unknown:
            return fail(unknown)
    if args.json:
        print_json(resp)
        return 0
    msgs = resp.get("messages", [])
    if not msgs:
        print(f"no dead letters for {args.cluster} (dead-letter queue ends at "
              f"{resp.get('queue_end', 0)})")
        return 0
    rows = [{"offset": m["dlq_offset"], "msg_id": m["msg_id"], "topic": m.get("topic"),
             "deliveries": m.get("deliveries"), "dead_at": format_ms(m.get("dead_ms")),
             "reason": (m.get("reason") or "")[:60],
             "payload": render_payload(bytes.fromhex(m.get("payload_hex", "")), "auto")[:50]}
            for m in msgs]
    print_table(rows, ["offset", "msg_id", "topic", "deliveries", "dead_at", "reason", "payload"])
    if resp.get("next_offset", 0) < resp.get("queue_end", 0):
        print(f"... more from --offset {resp['next_offset']}")
    return 0


def run_replay(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq dlq replay``."""
    return with_admin(args, lambda admin: _replay(args, admin))


def _replay(args: argparse.Namespace, admin: Admin) -> int:
    if args.all:
        listed = admin.request("dlq.list", cluster=args.cluster, offset=args.offset, limit=1000)
        offsets = [m["dlq_offset"] for m in listed.get("messages", [])]
        if not offsets:
            unknown = None if listed.get("queue_end") else _unknown_cluster(admin, args.cluster)
            if unknown:
                return fail(unknown)
            print(f"no dead letters for {args.cluster}")
            return 0
    else:
        offsets = args.offsets
    resp = admin.request("dlq.replay", cluster=args.cluster, offsets=offsets)
    print(f"replayed {resp.get('replayed', 0)} dead letters to {args.cluster}: "
          f"offsets {resp.get('offsets')}")
    return 0
