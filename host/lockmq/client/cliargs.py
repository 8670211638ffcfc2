"""Pieces shared by the client-side commands (produce, consume, topics, clusters, dlq,
sim, demo): the broker address and token options, and human-readable output."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from typing import Any, Callable

from typing import TYPE_CHECKING

from lockmq.protocol import LockEvent
from lockmq.protocol import table

if TYPE_CHECKING:
    from lockmq.client.session import Endpoint

DEFAULT_BROKER = "127.0.0.1:6800"
_TRUE = ("1", "true", "yes", "on")


def add_group(sub: argparse._SubParsersAction, name: str, help: str, doc: str | None,
              dest: str) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    """``lockmq NAME ACTION``: a command group's parser (``doc`` as its description; its
    help and exit 2 without an ACTION); returns where its actions are added."""
    p = sub.add_parser(name, help=help, description=doc,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest=dest, metavar="ACTION")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
    return actions


def add_connection_args(p: argparse.ArgumentParser) -> None:
    """The options of every command that talks to a broker, each also from the environment:
    ``--broker HOST:PORT``, ``--token``, ``--tls-ca FILE``, ``--tls``,
    ``--tls-server-name NAME``, ``--insecure`` and ``--connect-retry SECONDS``. Build
    the endpoint with
    :func:`endpoint_from_args`."""
    env = os.environ.get
    p.add_argument("--broker", "-b", default=env("LOCKMQ_BROKER", DEFAULT_BROKER),
                   metavar="HOST:PORT[,HOST:PORT]",
                   help="broker address, or a primary,standby list tried in turn "
                        "(env LOCKMQ_BROKER; default %(default)s)")
    p.add_argument("--token", default=env("LOCKMQ_TOKEN"),
                   help="service/admin token (env LOCKMQ_TOKEN; not needed when the "
                        "broker runs with auth = \"off\")")
    p.add_argument("--tls-ca", default=env("LOCKMQ_TLS_CA") or None, metavar="FILE",
                   help="connect with TLS and verify the broker against this CA "
                        "(PEM or DER; env LOCKMQ_TLS_CA)")
    p.add_argument("--tls", action="store_true", default=env("LOCKMQ_TLS", "").lower() in _TRUE,
                   help="connect with TLS verified by the system's CAs (env LOCKMQ_TLS=1; "
                        "implied by --tls-ca)")
    p.add_argument("--tls-server-name", default=env("LOCKMQ_TLS_SERVER_NAME") or None,
                   metavar="NAME",
                   help="name to verify in the broker's certificate when it differs from "
                        "the --broker host (env LOCKMQ_TLS_SERVER_NAME)")
    p.add_argument("--insecure", action="store_true",
                   default=env("LOCKMQ_INSECURE", "").lower() in _TRUE,
                   help="allow sending the token over plain TCP to a non-loopback host "
                        "(env LOCKMQ_INSECURE=1); anyone on the path can then read it")
    p.add_argument("--connect-retry", type=float, metavar="SECONDS",
                   default=float(env("LOCKMQ_CONNECT_RETRY") or 30),
                   help="keep retrying a broker that is not up yet for this long, with "
                        "backoff (env LOCKMQ_CONNECT_RETRY; default %(default)g; 0 = once)")


def endpoint_from_args(args: argparse.Namespace) -> "Endpoint | list[Endpoint]":
    """The broker the options of :func:`add_connection_args` describe: one
    :class:`Endpoint`, or a list of them for ``--broker host1:port,host2:port`` (a
    primary and its standby: the clients try them in turn).

    Raises :class:`~lockmq.client.LockmqError` for a bad address or an unreadable CA.
    The cleartext rule (no token in clear to a remote host) is enforced when the
    session opens, before any connect.
    """
    from lockmq.client.errors import LockmqError
    from lockmq.client.session import parse_endpoints

    try:
        endpoints = parse_endpoints(args.broker)
    except ValueError:
        raise LockmqError(f"bad broker address {args.broker!r} "
                          "(want HOST:PORT or HOST:PORT,HOST:PORT)") from None
    retry = getattr(args, "connect_retry", None)
    if retry is not None and retry < 0:
        raise LockmqError(f"--connect-retry {retry:g}: must be >= 0 seconds")
    ca = getattr(args, "tls_ca", None)
    ctx = None
    if ca or getattr(args, "tls", False):
        from lockmq.security.tls import client_context

        try:
            ctx = client_context(ca)   # PEM or DER
        except (OSError, ValueError) as exc:   # ssl.SSLError is an OSError
            raise LockmqError(f"--tls-ca {ca}: cannot load the CA: {exc}") from None
    for endpoint in endpoints:
        endpoint.insecure = bool(getattr(args, "insecure", False))
        if retry is not None:
            endpoint.connect_retry_s = retry
        if ctx is not None:
            endpoint.ssl = ctx
            endpoint.server_hostname = getattr(args, "tls_server_name", None) or None
    return endpoints[0] if len(endpoints) == 1 else endpoints


# The one text name of each code (protocol/table.py): what the lock logs, Spark and
# the CLI say.
EVENT_NAMES = table.names(table.EVENT_TYPES)
METHOD_NAMES = table.names(table.METHODS)
RESULT_NAMES = table.names(table.RESULTS)
COMMAND_KINDS = {name: code for code, name in table.names(table.COMMAND_KINDS).items()}


def describe_event(payload: bytes) -> str | None:
    """A one-line description of a LockEvent payload, or None if it is not one."""
    try:
        ev = LockEvent.decode(payload)
    except Exception:  # noqa: BLE001 - any payload may arrive
        return None
    return (f"{EVENT_NAMES.get(ev.event_type, ev.event_type)} "
            f"method={METHOD_NAMES.get(ev.method, ev.method)} "
            f"result={RESULT_NAMES.get(ev.result, ev.result)} value={ev.value} "
            f"ts_ms={ev.ts_ms} credential={ev.credential.hex()}")


def render_payload(payload: bytes, fmt: str) -> str:
    """``fmt``: text, hex, event, or auto (event when it decodes, text when printable)."""
    if fmt == "hex":
        return payload.hex()
    if fmt in ("event", "auto"):
        d = describe_event(payload)
        if d is not None:
            return d
        if fmt == "event":
            return "(not a lock event) " + payload.hex()
    try:
        text = payload.decode()
        if text.isprintable():
            return text
    except UnicodeError:
        pass
    return payload.hex()


def print_json(obj: Any) -> None:
    """Pretty JSON on stdout."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """A plain aligned table (column names as headers)."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c)
              for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


def format_ms(ms: object, millis: bool = False) -> str:
    """A broker time in epoch milliseconds as UTC ``YYYY-MM-DD HH:MM:SS`` (with ``millis``:
    ``.mmmZ`` appended); ``-`` when there is none (missing, zero or not an int)."""
    if not isinstance(ms, int) or ms <= 0:
        return "-"
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    if millis:
        return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    return when.strftime("%Y-%m-%d %H:%M:%S")


#: How every time option reads a time, for its help text (see :func:`parse_time_ms`).
TIME_FORMS = "ISO 8601, no zone = UTC like every time lockmq prints"


def parse_time_ms(text: str, option: str = "time", numbers: str = "ms") -> int:
    """Epoch milliseconds from a number or an ISO 8601 time, for every CLI time option.

    A naive ISO time (no zone) is UTC: every time lockmq prints (``store dump``,
    ``scheduled list``, logs) is UTC, so a time copied from them means the same
    instant, whatever the operator's machine's zone. ``numbers``: the unit of a bare
    number, ``"ms"`` or ``"s"`` since the epoch. ``ValueError`` naming ``option`` and
    the forms otherwise."""
    try:
        if numbers != "s":
            return int(text)
        seconds = float(text)
        if math.isfinite(seconds):
            return int(seconds * 1000)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        example = "1795316400" if numbers == "s" else "1795316400000"
        raise ValueError(f"{option} {text!r} is neither ISO 8601 nor epoch "
                         f"{'seconds' if numbers == 's' else 'milliseconds'} "
                         f"(e.g. 2026-11-22T03:00:00Z or {example})") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return int(when.timestamp() * 1000)


def time_arg(option: str, numbers: str = "ms") -> "Callable[[str], int]":
    """The argparse ``type=`` of a time option (``--at``, ``--since``, ``--to-time``):
    epoch milliseconds by :func:`parse_time_ms`; a bad time is a usage error naming
    ``option``, before anything connects (not a traceback out of the command)."""
    def parse(text: str) -> int:
        try:
            return parse_time_ms(text, option, numbers)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def fail(message: str, code: int = 1) -> int:
    """Print ``lockmq: message`` on stderr and return ``code``."""
    print(f"lockmq: {message}", file=sys.stderr)
    return code
