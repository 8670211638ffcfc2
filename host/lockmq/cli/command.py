"""``lockmq command``: send a downlink command to a lock and print its answer.

The broker authorises the command (the token needs the right to command that
lock), signs it with the lock's key, holds it while the lock is offline (up to
``--expires``) and relays the lock's answer:

    lockmq command LK-0A1B2C3D unlock --seconds 5
    lockmq command LK-0A1B2C3D cards 0a1b2c3d4e5f6071 11223344
    lockmq command LK-0A1B2C3D config '{"heartbeat_s": 60}'
    lockmq command LK-0A1B2C3D config --network '{"brokers": [["10.0.0.2", 6843]]}'
    lockmq command LK-0A1B2C3D reboot
    lockmq command LK-0A1B2C3D fw-update 0.2.0 41234 9f86d081...   # `lockmq firmware release`

Each kind needs its own right in the token (``--command 'KINDS:SN_GLOB'``, see
``lockmq tokens``). A config that changes where the lock connects (``brokers``,
``tls``) needs the right ``config.network`` and ``--network``, which marks the
command ``"network": true``: the lock refuses such a change without that mark.

With ``auth = "off"`` the broker has no device registry, so it cannot tell an
offline lock from a mistyped SN and would hold either until ``--expires``. So
without ``--token`` (only an auth-off broker accepts that) the command asks first
and fails at once for a lock that is not connected; ``--wait`` holds the command
for it anyway. With ``--token`` it cannot ask (a service token's admin request
would be refused and audited by a broker with auth required), so it says on
stderr that it waits up to ``--expires`` and why. With ``auth = "required"`` the
broker refuses an unregistered SN itself and holds commands for a registered lock
that is offline.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from lockmq.client import AdminError, AsyncAdmin, AsyncProducer, CommandError, LockmqError
from lockmq.client.cliargs import add_connection_args, endpoint_from_args, fail
from lockmq.client.command_text import KINDS, command_args
from lockmq.client.sync import new_event_loop
from lockmq.cli.scheduled import add_when_args, when_kwargs


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq command``."""
    p = sub.add_parser("command", help="send a downlink command to a lock (unlock, cards, ...)",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(p)
    p.add_argument("sn", help="the target lock's serial number")
    p.add_argument("kind", choices=KINDS)
    p.add_argument("values", nargs="*",
                   help="cards: credential ids in hex; config: a JSON object; "
                        "fw-update: VERSION SIZE SHA256 of a released bundle")
    p.add_argument("--seconds", type=int, default=5, help="unlock: how long (default 5)")
    p.add_argument("--network", action="store_true",
                   help="config: the change redirects the lock (brokers, tls); needs the "
                        "config.network right")
    p.add_argument("--expires", type=float, default=60.0,
                   help="give up if the lock is not reached within this many seconds "
                        "(default 60)")
    p.add_argument("--wait", action="store_true",
                   help="with auth off (no --token): hold the command for a lock that is not "
                        "connected (up to --expires) instead of failing at once")
    add_when_args(p)   # a scheduled command: --at / --delay / --level (not before then)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq command``."""
    try:
        kind, payload = command_args(args.kind, args.values, args.seconds, args.network)
    except ValueError as exc:
        return fail(str(exc))
    loop = new_event_loop()
    try:
        return loop.run_until_complete(_send(args, kind, payload))
    except CommandError as exc:
        return fail(f"{args.sn}: {exc}")
    except LockmqError as exc:
        return fail(str(exc))
    finally:
        loop.close()


async def _not_connected(args: argparse.Namespace) -> str | None:
    """The error for a lock that is not connected to a broker running with auth off
    (no registry there: a wrong SN would wait until ``--expires``), else None. Asked
    only without a token: a service token's admin requests would be refused (and
    audited) by a broker with auth required, which checks SNs itself."""
    if args.token:
        return None
    try:
        async with AsyncAdmin(endpoint_from_args(args), token=args.token) as admin:
            online = (await admin.request("devices", sn=args.sn)).get("devices", [])
            if any(d.get("sn") == args.sn for d in online):
                return None
            if (await admin.request("stats")).get("auth") != "off":
                return None   # the broker knows its registered locks: it holds or refuses
    except AdminError:
        return None
    return (f"lock {args.sn!r} is not connected to the broker (auth is off: the broker has "
            f"no device registry, so an unknown SN and an offline lock look the same); "
            f"check the SN with `lockmq devices online`, or pass --wait to hold the command "
            f"until the lock connects (up to --expires)")


#: how long a command may take before the CLI says why it is still waiting
NOTE_AFTER_S = 1.0


def _why_it_waits(args: argparse.Namespace) -> str:
    """The note printed when a lock has not answered within :data:`NOTE_AFTER_S`
    (with a token the CLI did not ask first whether the lock is connected)."""
    return (f"lockmq: {args.sn}: no answer yet; waiting up to {args.expires:g} s (a broker "
            f"holds commands for offline locks; with auth off, leave out --token to fail "
            f"at once when the lock is not connected)")


async def _send(args: argparse.Namespace, kind: int, payload: bytes) -> int:
    when = when_kwargs(args, "not_before")
    if not when and not args.wait:
        missing = await _not_connected(args)
        if missing:
            return fail(missing)
    producer = AsyncProducer(endpoint_from_args(args), token=args.token, name="cli-command")
    await producer.connect()
    try:
        if when:   # stored by the broker; runs at its time (`lockmq scheduled list`)
            sid = await producer.schedule_command(args.sn, kind, payload,
                                                  expires_in_s=args.expires, **when)
            print(f"{args.sn}: command scheduled, id {sid}")
            return 0
        sent = asyncio.ensure_future(
            producer.command(args.sn, kind, payload, expires_in_s=args.expires))
        done, _ = await asyncio.wait({sent}, timeout=NOTE_AFTER_S)
        if not done:   # a lock that answers at once gets no note
            print(_why_it_waits(args), file=sys.stderr)
        outcome = await sent
    finally:
        await producer.close()
    print(f"{outcome.target}: command {outcome.cmd_id} ok: {outcome.detail}")
    return 0
