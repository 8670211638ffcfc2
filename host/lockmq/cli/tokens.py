"""``lockmq tokens``: tokens of backend services and admin tools.

A token is shown once, at creation; the registry keeps only its hash. Each token has
permissions and an expiry (default 90 days)::

    lockmq tokens create billing --consume 'lock.*:billing' --ttl 30d
    lockmq tokens create opener  --command 'unlock:LOCK-*'
    lockmq tokens create cardsync --command 'cards:LOCK-*'
    lockmq tokens create fleet   --command 'config,reboot:LOCK-*'
    lockmq tokens create netops  --command 'config.network:LOCK-0001' --ttl 1h
    lockmq tokens create ops     --admin --ttl 12h
    lockmq tokens create alarms  --system '$alerts'     # a $ system topic (warns)
    lockmq tokens list
    lockmq tokens revoke <id or name>

Patterns are shell globs. ``--consume TOPIC:CLUSTER`` (a bare TOPIC means any cluster).
``--command KINDS:SN_GLOB``: kinds ``unlock``, ``cards``, ``config``, ``reboot``,
``fw-update`` (the command kinds of protocol/table.py; ``*`` = all of these), and ``config.network`` -- changing a lock's
broker list or TLS settings, never implied by ``*`` or ``config``. A bare SN_GLOB
means ``unlock,cards`` (what command tokens were for before rights per kind).
``$`` system topics are written only with ``--system`` (never through ``--publish``
patterns such as ``*`` or ``$*``, nor ``--admin``); the broker-internal ones
(``$retry.*``, ``$dlq.*``, ``$devices``, ``$heartbeats``) by no token at all.
Over plain TCP a token is accepted only from the addresses in ``[security]
allow_plain_tokens_from`` (loopback by default); elsewhere use TLS.
"""

from __future__ import annotations

import argparse
import json
import sys
from fnmatch import fnmatchcase

from lockmq.client.cliargs import add_group
from lockmq.security import Permissions, TokenStore
from lockmq.security.principal import COMMAND_KINDS, NETWORK_RIGHT
from lockmq.security.tokens import parse_duration

from ._security_common import add_registry_options, print_rows, security_config, when


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``lockmq tokens`` and its sub-commands."""
    tsub = add_group(sub, "tokens", "service/admin tokens: create, list, revoke", __doc__,
                     "tokens_cmd")

    c = tsub.add_parser("create", help="create a token (printed once)")
    c.add_argument("name", help="who uses it (service name)")
    c.add_argument("--publish", action="append", default=[], metavar="TOPIC_GLOB")
    c.add_argument("--consume", action="append", default=[], metavar="TOPIC_GLOB[:CLUSTER_GLOB]")
    c.add_argument("--command", action="append", default=[], metavar="KINDS:SN_GLOB",
                   help=f"downlink commands it may send: kinds ({', '.join(COMMAND_KINDS)}, "
                        f"* = those {len(COMMAND_KINDS)}, config.network = repoint a lock) and the "
                        "locks, e.g. 'unlock,cards:LOCK-*'")
    c.add_argument("--admin", action="store_true",
                   help="every right, admin operations too (not --system)")
    c.add_argument("--replicate", action="store_true",
                   help="a standby's right: the replica.* admin ops (reads the whole log)")
    c.add_argument("--system", action="append", default=[], metavar="SYSTEM_TOPIC_GLOB",
                   help="$ system topics it may publish to (explicit only; warns)")
    c.add_argument("--ttl", default="90d", help="lifetime: 30m, 12h, 90d, 1w or never")
    c.add_argument("--json", action="store_true")
    add_registry_options(c)
    c.set_defaults(func=cmd_create)

    ls = tsub.add_parser("list", help="list tokens (never their secrets)")
    ls.add_argument("--json", action="store_true", help="JSON lines output")
    ls.add_argument("--all", action="store_true", help="include revoked and expired tokens")
    add_registry_options(ls)
    ls.set_defaults(func=cmd_list)

    r = tsub.add_parser("revoke", help="revoke a token by id, or every token of a name")
    r.add_argument("id", help="token id (16 hex digits) or name")
    add_registry_options(r)
    r.set_defaults(func=cmd_revoke)


def _store(args: argparse.Namespace) -> TokenStore:
    return TokenStore(security_config(args).registry_path)


def cmd_create(args: argparse.Namespace) -> int:
    """Create a token and print it."""
    command = []
    for right in args.command:
        if ":" not in right:   # the pre-kinds form: stored explicitly, with what it means
            print(f"warning: --command {right!r} names no kinds: it allows unlock and cards "
                  f"only (stored as 'unlock,cards:{right}'); name the kinds, e.g. "
                  f"--command 'unlock,cards:{right}'", file=sys.stderr)
            right = f"unlock,cards:{right}"
        command.append(right)
    perms = Permissions(publish=tuple(args.publish), consume=tuple(args.consume),
                        command=tuple(command), admin=args.admin,
                        system=tuple(args.system), replicate=args.replicate)
    if perms == Permissions():
        print("error: give at least one of --publish --consume --command --admin --system "
              "--replicate",
              file=sys.stderr)
        return 2
    bad = [p for p in perms.system if not p.startswith("$")]
    if bad:
        print(f"error: --system {','.join(bad)}: system topic patterns start with '$'",
              file=sys.stderr)
        return 2
    if perms.system:
        internal = [p for p in perms.system
                    if any(fnmatchcase(t, p) for t in _INTERNAL_EXAMPLES)]
        print(f"warning: --system {','.join(perms.system)} grants writing $ system topics: "
              "consumers take records there for the broker's own. Grant it only to a "
              "service you trust like the broker." + (
                  f" ({','.join(internal)} also matches broker-internal topics -- $retry.*, "
                  "$dlq.*, $devices, $heartbeats -- which stay refused to every token.)"
                  if internal else ""), file=sys.stderr)
    dollar = [p for p in perms.publish if p.startswith("$")]
    if dollar:
        print(f"warning: --publish {','.join(dollar)} never reaches $ system topics; "
              "use --system for those", file=sys.stderr)
    try:
        perms.validate()
    except ValueError as exc:
        print(f"error: --command: {exc}", file=sys.stderr)
        return 2
    network = [r for r in perms.command if NETWORK_RIGHT in r.rpartition(":")[0].split(",")]
    if network:
        print(f"warning: --command {','.join(network)} grants {NETWORK_RIGHT}: this token can "
              "repoint those locks to another broker (their broker list and TLS settings); "
              "every such change is logged at warning level. Keep it short-lived.",
              file=sys.stderr)
    try:
        ttl = parse_duration(args.ttl)
    except ValueError as exc:
        print(f"error: --ttl: {exc}", file=sys.stderr)
        return 2
    cfg = security_config(args)
    lockish = [p for p in perms.publish
               if any(fnmatchcase(t, p) for t in _lock_topic_examples(cfg.lock_topics))]
    if lockish:
        print(f"warning: --publish {','.join(lockish)} covers the locks' own topics: this "
              "service could write records there under any producer id that is not a "
              "registered lock (see docs/security.md)", file=sys.stderr)
    store = TokenStore(cfg.registry_path)
    try:
        token, info = store.create(args.name, perms, ttl_s=ttl)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    if args.json:
        print(json.dumps({"token": token, **info.to_dict()}))
    else:
        print(token)
        print(f"# id={info.id} name={info.name} rights: {perms.describe()} "
              f"expires={when(info.expires_at)} — shown once; store it in a secret store",
              file=sys.stderr)
    return 0


#: Broker-internal topics, for the --system warning.
_INTERNAL_EXAMPLES = ("$retry.billing.0", "$dlq.billing", "$devices", "$heartbeats")


def _lock_topic_examples(patterns: list[str]) -> list[str]:
    """Concrete topics a lock may publish to, for overlap warnings."""
    return [p.replace("{sn}", "LOCK-X").replace("*", "events") for p in patterns]


def cmd_list(args: argparse.Namespace) -> int:
    """List tokens."""
    store = _store(args)
    try:
        rows = [t for t in store.list() if args.all or t.state() == "active"]
    finally:
        store.close()
    return print_rows(
        rows, args.json, f"{'ID':<16}  {'NAME':<20} {'STATE':<8} {'EXPIRES (UTC)':<16}  RIGHTS",
        lambda t: (f"{t.id:<16}  {t.name:<20} {t.state():<8} {when(t.expires_at):<16}  "
                   f"{t.permissions.describe()}"),
        "token")


def cmd_revoke(args: argparse.Namespace) -> int:
    """Revoke a token."""
    store = _store(args)
    try:
        ok = store.revoke(args.id)
    finally:
        store.close()
    if not ok:
        print(f"error: no active token {args.id}", file=sys.stderr)
        return 1
    print(f"{args.id}: revoked; a running broker ends its sessions and cancels what it "
          "left waiting (scheduled items, transactions, held commands) within a second")
    return 0
