"""``lockmq devices``: the device registry — provision, list, disable, re-key locks.

``lockmq devices online`` asks a running broker which locks are connected now; the
other actions work on the registry file directly (no broker needed).

``lockmq devices add SN --out config.json --broker HOST:PORT`` creates the lock's
secret, stores it (wrapped) in the broker's registry and writes the provisioning
config (firmware/README.md's config.json shape) that ``lockmq firmware build``
puts on the board. The file holds the secret: it is written 0600; delete it once
the board is flashed.

What the lock can do is fixed here, not by what it later sends (SPEC 2, "Per-device
policy"): a lock is registered for frame MACs unless ``--no-mac`` (firmware that
cannot), and for TLS only with ``--tls`` (implied by ``--tls-ca``). The broker never
accepts it without them; ``lockmq devices policy SN`` changes that later.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from lockmq.client.cliargs import add_group
from lockmq.security import DeviceRegistry, provisioning_config
from lockmq.security.registry import DeviceExists, UnknownDevice, write_provisioning

from ._security_common import add_registry_options, print_rows, security_config, when


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``lockmq devices`` and its sub-commands."""
    dsub = add_group(sub, "devices", "device registry: provision, list, disable, re-key locks",
                     __doc__, "devices_cmd")

    a = dsub.add_parser("add", help="register lock(s) and write provisioning config(s)")
    a.add_argument("sn", nargs="+", help="lock serial number(s)")
    a.add_argument("--note", default="", help="free text kept with the device")
    a.add_argument("--no-mac", dest="mac", action="store_false",
                   help="firmware that cannot do frame MACs: accepted without them on plain "
                        "TCP while [security] lock_frame_mac = \"optional\" (logged at "
                        "every connect); default: MACs required")
    a.add_argument("--tls", action="store_true",
                   help="the lock connects over TLS only: refused on plain TCP (implied "
                        "by --tls-ca)")
    _provision_options(a)
    add_registry_options(a)
    a.set_defaults(func=cmd_add)

    pol = dsub.add_parser("policy", help="change what a lock must use (frame MACs, TLS)")
    pol.add_argument("sn")
    pol.add_argument("--mac", dest="mac", action="store_true", default=None,
                     help="require frame MACs on plain TCP")
    pol.add_argument("--no-mac", dest="mac", action="store_false",
                     help="accept it without frame MACs (lock_frame_mac = \"optional\")")
    pol.add_argument("--tls", dest="tls", action="store_true", default=None,
                     help="require TLS")
    pol.add_argument("--no-tls", dest="tls", action="store_false", help="allow plain TCP")
    add_registry_options(pol)
    pol.set_defaults(func=cmd_policy)

    tg = dsub.add_parser("tag", help="add or remove a lock's tags (rollouts select by tag)")
    tg.add_argument("sn", nargs="+", help="lock serial number(s)")
    tg.add_argument("--add", action="append", default=[], metavar="TAG",
                    help="tag to add (repeat)")
    tg.add_argument("--remove", action="append", default=[], metavar="TAG",
                    help="tag to remove (repeat)")
    add_registry_options(tg)
    tg.set_defaults(func=cmd_tag)

    ls = dsub.add_parser("list", help="list registered locks")
    ls.add_argument("--pattern", help="only SNs matching this glob")
    ls.add_argument("--tag", help="only locks that carry this tag")
    ls.add_argument("--json", action="store_true", help="JSON lines output")
    add_registry_options(ls)
    ls.set_defaults(func=cmd_list)

    for name, helptext, func in (("disable", "refuse the lock (its live session ends at once)",
                                  cmd_disable),
                                 ("enable", "allow a disabled lock again", cmd_enable),
                                 ("remove", "forget the lock entirely", cmd_remove),
                                 ("show", "one lock's registry row", cmd_show)):
        s = dsub.add_parser(name, help=helptext)
        s.add_argument("sn")
        add_registry_options(s)
        s.set_defaults(func=func)

    o = dsub.add_parser("online", help="locks connected to a running broker now")
    from lockmq.client.cliargs import add_connection_args
    add_connection_args(o)
    o.add_argument("--json", action="store_true", help="print the broker's JSON answer")
    o.set_defaults(func=cmd_online)

    r = dsub.add_parser("rekey", help="give a lock a new secret (the old one stops working)")
    r.add_argument("sn")
    _provision_options(r)
    add_registry_options(r)
    r.set_defaults(func=cmd_rekey)


def _provision_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="PATH",
                   help="provisioning config to write (a file for one SN, a directory "
                        "for several: DIR/<SN>.json); default ./<SN>.json")
    p.add_argument("--broker", action="append", default=[], metavar="HOST:PORT",
                   help="broker address(es) for the lock (repeatable)")
    p.add_argument("--tls-ca", metavar="CA.DER",
                   help="enable TLS on the lock with this CA (DER, from `lockmq certs init`)")
    p.add_argument("--server-hostname", default="", help="name in the broker's certificate")
    p.add_argument("--broker-id", default="",
                   help="the broker's [security] broker_id: the lock refuses any other")
    p.add_argument("--show-key", action="store_true",
                   help="also print the key (hex) on stdout")


def _registry(args: argparse.Namespace) -> DeviceRegistry:
    return DeviceRegistry.open(security_config(args))


def _brokers(values: list[str]) -> list[list[object]] | None:
    out: list[list[object]] = []
    for v in values:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise SystemExit(f"--broker must be HOST:PORT, not {v!r}")
        out.append([host, int(port)])
    return out or None


def _write_docs(args: argparse.Namespace, keys: dict[str, bytes]) -> None:
    extra: dict[str, object] = {}
    brokers = _brokers(args.broker)
    if brokers:
        extra["brokers"] = brokers
    if args.tls_ca:
        extra["tls"] = {"enabled": True, "ca": os.path.basename(args.tls_ca),
                        "server_hostname": args.server_hostname}
    if getattr(args, "mac", True) is False:
        extra["frame_mac"] = False
    if args.broker_id:
        extra["broker_id"] = args.broker_id
    many = len(keys) > 1
    for sn, key in keys.items():
        if args.out and (many or os.path.isdir(args.out)):
            os.makedirs(args.out, exist_ok=True)
            path = os.path.join(args.out, f"{sn}.json")
        else:
            path = args.out or f"{sn}.json"
        write_provisioning(path, provisioning_config(sn, key, **extra))
        line = f"{sn}: provisioning config written to {path} (mode 0600; holds the secret)"
        if args.show_key:
            line += f" key={key.hex()}"
        print(line)


def cmd_add(args: argparse.Namespace) -> int:
    """Register locks; write their provisioning configs."""
    reg = _registry(args)
    try:
        keys = reg.add_many(args.sn, note=args.note, mac=args.mac,
                            tls=bool(args.tls or args.tls_ca))
    except (DeviceExists, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        reg.close()
    _write_docs(args, keys)
    return 0


def cmd_rekey(args: argparse.Namespace) -> int:
    """New secret for a lock."""
    reg = _registry(args)
    try:
        key = reg.rekey(args.sn)
    except UnknownDevice:
        print(f"error: no device {args.sn}", file=sys.stderr)
        return 1
    finally:
        reg.close()
    _write_docs(args, {args.sn: key})
    return 0


def cmd_policy(args: argparse.Namespace) -> int:
    """Change a lock's required transport protections (from its next connect)."""
    reg = _registry(args)
    try:
        reg.set_policy(args.sn, mac=args.mac, tls=args.tls)
        info = reg.get(args.sn)
    except UnknownDevice:
        print(f"error: no device {args.sn}", file=sys.stderr)
        return 1
    finally:
        reg.close()
    print(f"{args.sn}: {_policy(info)}")
    return 0


def _policy(d: Any) -> str:
    """A row's policy as a short word: what the broker requires of that lock."""
    if d.need_tls:
        return "tls"
    return "mac" if d.need_mac else "none"


def cmd_list(args: argparse.Namespace) -> int:
    """Print the registry."""
    reg = _registry(args)
    try:
        rows = reg.list(args.pattern, args.tag)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        reg.close()
    return print_rows(
        rows, args.json,
        f"{'SN':<24} {'STATE':<9} {'KEY':>4} {'NEEDS':<5} {'LAST CMD':>8}  "
        f"{'UPDATED (UTC)':<16}  {'TAGS':<16}  NOTE",
        lambda d: (f"{d.sn:<24} {'enabled' if d.enabled else 'DISABLED':<9} "
                   f"v{d.key_version:<3} {_policy(d):<5} {d.last_command_id:>8}  "
                   f"{when(d.updated_at):<16}  {','.join(d.tags) or '-':<16}  {d.note}"),
        "device")


def cmd_tag(args: argparse.Namespace) -> int:
    """Add and remove tags; print each lock's tags. All SNs are checked first: an
    unknown one changes nothing."""
    if not args.add and not args.remove:
        print("error: give --add TAG or --remove TAG", file=sys.stderr)
        return 2
    reg = _registry(args)
    try:
        missing = [sn for sn in args.sn if not reg.exists(sn)]
        if missing:
            print(f"error: no device {', '.join(missing)}; no tag changed", file=sys.stderr)
            return 1
        for sn in args.sn:
            tags = reg.set_tags(sn, args.add, args.remove)
            print(f"{sn}: tags {','.join(tags) or '-'}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        reg.close()
    return 0


def _simple(args: argparse.Namespace, op: str) -> int:
    reg = _registry(args)
    try:
        if op == "show":
            print(json.dumps(reg.get(args.sn).to_dict(), indent=2))
        elif op == "remove":
            reg.remove(args.sn)
            print(f"{args.sn}: removed")
        else:
            reg.set_enabled(args.sn, op == "enable")
            print(f"{args.sn}: {op}d" + ("; a running broker ends its session within a "
                                         "second" if op == "disable" else ""))
    except UnknownDevice:
        print(f"error: no device {args.sn}", file=sys.stderr)
        return 1
    finally:
        reg.close()
    return 0


def cmd_disable(args: argparse.Namespace) -> int:
    """Disable a lock."""
    return _simple(args, "disable")


def cmd_enable(args: argparse.Namespace) -> int:
    """Enable a lock."""
    return _simple(args, "enable")


def cmd_remove(args: argparse.Namespace) -> int:
    """Remove a lock."""
    return _simple(args, "remove")


def cmd_show(args: argparse.Namespace) -> int:
    """Show a lock."""
    return _simple(args, "show")


def cmd_online(args: argparse.Namespace) -> int:
    """Ask the broker (``devices`` admin op) which locks are online."""
    from lockmq.cli._admin import admin_op

    return admin_op(args, "devices", lambda resp: _show_online(args, resp))


def _show_online(args: argparse.Namespace, resp: dict[str, Any]) -> int:
    devs = resp.get("devices", [])
    if args.json:
        print(json.dumps(devs, indent=2))
        return 0
    print(f"{'SN':<24} {'PEER':<22} {'IDLE s':>7} {'QUEUED':>6} {'BATTERY':>7} "
          f"{'FIRMWARE':<12} {'LAST UPDATE'}")
    for d in devs:
        batt = d.get("battery_pct")
        print(f"{d['sn']:<24} {d.get('peer', '?'):<22} {d.get('idle_s', 0):>7.1f} "
              f"{d.get('queued', '-'):>6} {'-' if batt is None else f'{batt}%':>7} "
              f"{d.get('fw', '-'):<12} {d.get('ota', '-')}")
    print(f"{resp.get('count', len(devs))} lock(s) online")
    return 0
