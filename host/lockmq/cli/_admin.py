"""Admin requests from the command line, in one place: connect with the
``add_connection_args`` options, run the op(s), print; a refused or failed request
(or an unreachable broker) prints ``lockmq: why`` and exits 1."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from lockmq.client import Admin, LockmqError
from lockmq.client.cliargs import endpoint_from_args, fail


def with_admin(args: argparse.Namespace, body: Callable[[Admin], int]) -> int:
    """Run ``body(admin)`` on an admin session to the broker of ``args``; its exit
    status, or 1 with the error when the broker cannot be reached or refuses."""
    try:
        with Admin(endpoint_from_args(args), token=args.token) as admin:
            return body(admin)
    except (LockmqError, OSError) as exc:
        return fail(str(exc))


def admin_op(args: argparse.Namespace, op: str, show: Callable[[dict[str, Any]], int],
             **req: Any) -> int:
    """One admin op ``op`` with ``req``: ``show(response)`` prints it and gives the
    exit status."""
    return with_admin(args, lambda admin: show(admin.request(op, **req)))
