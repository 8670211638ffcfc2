"""``lockmq clusters``: consumer clusters with members, in-flight, backlog/lag, dead letters.

``lockmq clusters NAME --delete`` (admin) forgets a cluster -- position, owner, topic --
so that its name is free again; no member may be connected.
"""

from __future__ import annotations

import argparse
import time

from lockmq.client import Admin, LockmqError
from lockmq.client.cliargs import add_connection_args, endpoint_from_args, fail, print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq clusters``."""
    p = sub.add_parser("clusters", help="consumer clusters: members, in-flight, backlog/lag",
                       description=__doc__)
    add_connection_args(p)
    p.add_argument("cluster", nargs="?", help="show only this cluster, with its members")
    p.add_argument("--json", action="store_true", help="print the broker's JSON answer")
    p.add_argument("--watch", type=float, default=0, metavar="SECONDS",
                   help="repeat every SECONDS until interrupted")
    p.add_argument("--delete", action="store_true",
                   help="forget CLUSTER (position, owner, topic binding); no members "
                        "may be connected")
    p.set_defaults(func=run)


def _show(resp: dict, args: argparse.Namespace) -> None:
    clusters = resp.get("clusters", [])
    if args.json:
        print_json(clusters)
        return
    if not clusters:
        print("no consumer clusters yet")
        return
    rows = []
    for c in clusters:
        rows.append({
            "cluster": c["name"], "topic": c["topic"],
            "members": len(c.get("members", [])) if c.get("live", True) else "offline",
            "inflight": c.get("inflight", 0), "backlog": c.get("backlog", 0),
            "unread": c.get("unread", c.get("backlog", 0)),
            "retrying": c.get("retry_scheduled", 0), "dlq": c.get("dlq_size", 0),
            "ordered": "yes" if c.get("ordered") else "no", "owner": c.get("owner", ""),
            "capped": "CAPPED" if c.get("cluster_capped") else "",
        })
    print_table(rows, ["cluster", "topic", "members", "inflight", "backlog", "unread",
                       "retrying", "dlq", "ordered", "owner", "capped"])
    if args.cluster:
        for c in clusters:
            members = c.get("members", [])
            if members:
                print(f"\nmembers of {c['name']}:")
                print_table(members, ["id", "name", "peer", "inflight", "delivered", "acked",
                                      "nacked", "idle"])


def run(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq clusters``."""
    if args.delete and not args.cluster:
        return fail("--delete needs a CLUSTER")
    try:
        with Admin(endpoint_from_args(args), token=args.token) as admin:
            if args.delete:
                resp = admin.request("clusters.delete", cluster=args.cluster)
                print(f"cluster {resp['cluster']} deleted (was owned by "
                      f"{resp.get('owner') or 'nobody'})")
                return 0
            while True:
                req = {"cluster": args.cluster} if args.cluster else {}
                _show(admin.request("clusters", **req), args)
                if not args.watch:
                    return 0
                time.sleep(args.watch)
                print()
    except (LockmqError, OSError) as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 0
