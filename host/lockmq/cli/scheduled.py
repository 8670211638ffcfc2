"""``lockmq scheduled list|cancel``: scheduled messages and commands waiting in the broker.

A message sent with ``lockmq produce TOPIC TEXT --at 2026-11-24T08:00Z`` (UTC; or
``--delay 300``, or ``--level 9`` for RocketMQ's 5-minute level) and a command sent
with ``lockmq command SN unlock --at ...`` wait in the broker, durably, until their
time. ``list`` shows them (earliest first) and the last scheduled commands' results;
``result ID`` shows what became of a scheduled command (``--wait S``: until the lock
answered; the broker does not push it); ``cancel ID`` drops one (admin token):

    lockmq scheduled list
    lockmq scheduled result 17 --wait 120
    lockmq scheduled cancel 17
"""

from __future__ import annotations

import argparse
from typing import Any

from lockmq.cli._admin import admin_op, with_admin
from lockmq.client import Admin
from lockmq.client.cliargs import (add_connection_args, add_group, fail, format_ms, time_arg,
                                   print_json, print_table, TIME_FORMS)
from lockmq.client.scheduled import DELAY_LEVELS_S


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq scheduled list`` and ``lockmq scheduled cancel``."""
    ssub = add_group(sub, "scheduled", "scheduled messages and commands: list, cancel",
                     __doc__, "scheduled_command")
    pl = ssub.add_parser("list", help="waiting scheduled items, earliest first")
    add_connection_args(pl)
    pl.add_argument("--owner", default=None, help="only this token's (or lock's) items")
    pl.add_argument("--limit", type=int, default=100, help="at most this many (max 1000)")
    pl.add_argument("--json", action="store_true", help="print the broker's JSON answer")
    pl.set_defaults(func=run_list)
    pr = ssub.add_parser("result", help="what became of a scheduled command")
    add_connection_args(pr)
    pr.add_argument("id", type=int, help="the schedule id (from `list` or the send)")
    pr.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                    help="wait up to this long for the lock's answer (exit 1 unless ok)")
    pr.add_argument("--json", action="store_true", help="print the broker's JSON answer")
    pr.set_defaults(func=run_result)
    pc = ssub.add_parser("cancel", help="cancel a waiting scheduled item")
    add_connection_args(pc)
    pc.add_argument("id", type=int, help="the schedule id (from `list` or the send)")
    pc.set_defaults(func=run_cancel)


def add_when_args(p: argparse.ArgumentParser) -> None:
    """``--at`` / ``--delay`` / ``--level`` on ``produce`` and ``command``."""
    g = p.add_mutually_exclusive_group()
    # (epoch ms, naive ISO = UTC: the one parser of every time option)
    g.add_argument("--at", type=time_arg("--at", numbers="s"), default=None, metavar="TIME",
                   help=f"deliver at TIME: {TIME_FORMS} (2026-11-24T08:00Z, "
                        "2026-11-24T09:00+01:00), or seconds since the epoch")
    g.add_argument("--delay", type=float, default=None, metavar="SECONDS",
                   help="deliver after this many seconds")
    g.add_argument("--level", type=int, default=None, choices=range(1, len(DELAY_LEVELS_S) + 1),
                   metavar="N", help="RocketMQ delay level 1..18 (1s 5s 10s 30s 1m ... 1h 2h)")


def when_kwargs(args: argparse.Namespace, at_name: str = "deliver_at") -> dict[str, Any]:
    """The producer keyword arguments of ``--at``/``--delay``/``--level`` (empty: now)."""
    if getattr(args, "at", None) is not None:
        return {at_name: args.at / 1000}   # the producer takes epoch seconds
    if getattr(args, "delay", None) is not None:
        return {"delay": args.delay}
    if getattr(args, "level", None) is not None:
        return {"level": args.level}
    return {}


def run_list(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq scheduled list``."""
    req: dict[str, Any] = {"limit": args.limit}
    if args.owner:
        req["owner"] = args.owner
    return admin_op(args, "scheduled.list", lambda resp: _show_list(args, resp), **req)


def _show_list(args: argparse.Namespace, resp: dict[str, Any]) -> int:
    if args.json:
        print_json(resp)
        return 0
    items = resp.get("items", [])
    print(f"{resp.get('waiting', 0)} scheduled items waiting ({resp.get('bytes', 0)} bytes)")
    if items:
        print_table([{"id": i["id"], "kind": i["kind"],
                      "to": i.get("topic") or i.get("target"), "at_utc": format_ms(i["at_ms"], millis=True),
                      "owner": i["owner"], "bytes": i["bytes"]} for i in items],
                    ["id", "kind", "to", "at_utc", "owner", "bytes"])
    recent = resp.get("recent_command_results", [])
    if recent:
        print("recent scheduled command results:")
        print_table(recent[-20:], ["id", "target", "status", "detail"])
    return 0


def run_result(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq scheduled result``: the state now, or with ``--wait``
    the command's result (polled: ``Admin.scheduled_result``)."""
    def body(admin: Admin) -> int:
        if args.wait <= 0:
            resp = admin.request("scheduled.result", id=args.id)
            if args.json:
                print_json(resp)
            else:
                res = resp.get("result") or {}
                print(f"scheduled item {args.id}: {resp['state']}"
                      + (f" status={res['status']} {res.get('detail', '')}".rstrip()
                         if res else ""))
            return 0
        try:
            res = admin.scheduled_result(args.id, timeout_s=args.wait)
        except TimeoutError as exc:
            return fail(str(exc))
        if args.json:
            print_json(res)
        else:
            print(f"scheduled item {args.id}: status={res['status']} {res['detail']}".rstrip())
        return 0 if res["status"] == 0 else 1

    return with_admin(args, body)


def run_cancel(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq scheduled cancel``."""
    def show(resp: dict[str, Any]) -> int:
        print(f"cancelled scheduled item {resp.get('cancelled', args.id)}")
        return 0

    return admin_op(args, "scheduled.cancel", show, id=args.id)
