"""``lockmq sim``: simulated locks in CPython speaking the real protocol.

``--locks N`` locks connect (spread over ``--spread`` seconds, like a building
coming back after a power cut), authenticate with their device keys, publish
LockEvent records at ``--rate`` per second each (``--window`` in flight), answer
downlink commands, heartbeat, and reconnect after a broker restart, retransmitting
what was not acknowledged. Against a broker with ``auth = "required"`` give the
keys with ``--keys`` (a JSON {"SN": "hex key"}, or the directory of provisioning
files ``lockmq devices add --out DIR`` wrote) or let ``--register DATA_DIR`` add the
SNs to that broker's device registry first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from lockmq.client.cliargs import add_connection_args, endpoint_from_args, fail
from lockmq.client.errors import LockmqError
from lockmq.client.session import Endpoint
from lockmq.client.sync import new_event_loop

from lockmq.signals import stop_on_signals
from lockmq.sim import (DEFAULT_TOPIC, SimConfig, SimStats, load_keys, raise_nofile,
                        register_locks, run_sim)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq sim``."""
    p = sub.add_parser("sim", help="simulated locks that publish lock events",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(p)
    for action in p._actions:   # a lock talks to one broker: no primary,standby list
        if action.dest == "broker":
            action.metavar = "HOST:PORT"
            action.help = ("the broker HOST:PORT the simulated locks connect to (one "
                           "broker; env LOCKMQ_BROKER)")
    p.add_argument("--locks", type=int, default=10, help="how many locks (default %(default)s)")
    p.add_argument("--topic", default=DEFAULT_TOPIC, help="topic (default %(default)s)")
    p.add_argument("--events", type=int, default=10,
                   help="records per lock, then stop (0 = until --duration or Ctrl-C)")
    p.add_argument("--rate", type=float, default=1.0,
                   help="records per second per lock (0 = as fast as acks allow)")
    p.add_argument("--window", type=int, default=1, help="records in flight per lock")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--spread", type=float, default=0.0,
                   help="spread the connects over this many seconds")
    p.add_argument("--size", type=int, default=22, help="record size in bytes (>= 14)")
    p.add_argument("--sn-prefix", default="SIM-", help="SNs are PREFIX + 6 digits")
    p.add_argument("--first", type=int, default=1, help="number of the first lock")
    p.add_argument("--keys", metavar="FILE|DIR",
                   help="device keys: JSON {SN: hex}, or the provisioning files written "
                        "by `lockmq devices add --out DIR`")
    p.add_argument("--register", metavar="DATA_DIR",
                   help="add the SNs to the device registry in DATA_DIR first")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq sim``."""
    if args.locks < 1 or args.size < 14 or args.window < 1:
        return fail("need --locks >= 1, --size >= 14, --window >= 1", 2)
    cfg = SimConfig(locks=args.locks, topic=args.topic, sn_prefix=args.sn_prefix,
                    first_index=args.first, events_per_lock=args.events or None,
                    duration_s=args.duration, rate_per_lock=args.rate, window=args.window,
                    connect_spread_s=args.spread, payload_bytes=args.size)
    try:
        if args.keys:
            cfg.keys = load_keys(args.keys)
        if args.register:
            cfg.keys.update(register_locks(cfg, args.register))
    except (OSError, ValueError) as exc:
        return fail(f"device keys: {exc}")
    if args.keys and not args.register:
        problem = _keys_problem(cfg, args.keys)
        if problem:
            return fail(problem, 2)
    try:
        endpoint = endpoint_from_args(args)
    except LockmqError as exc:
        return fail(str(exc), 2)
    if isinstance(endpoint, list):   # simulated locks talk to one broker each
        return fail("sim: --broker takes one HOST:PORT", 2)
    raise_nofile()
    loop = new_event_loop()
    try:
        stats = loop.run_until_complete(_run(cfg, endpoint, args))
    finally:
        loop.close()
    summary = stats.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print("sim: " + ", ".join(f"{k} {v}" for k, v in summary.items()), file=sys.stderr)
    ok = stats.acked == stats.sent and stats.errors == 0 and stats.connected >= cfg.locks
    if not ok and not args.json:
        print(f"sim: {cfg.locks - stats.connected} locks never connected, "
              f"{stats.sent - stats.acked} records unacknowledged"
              + (f"; last connect error: {stats.last_error}" if stats.last_error else ""),
              file=sys.stderr)
    return 0 if ok else 1


def _keys_problem(cfg: SimConfig, source: str) -> str:
    """Why ``--keys`` cannot authenticate the simulated SNs (no keys, or none for
    them: every lock would be refused and the run would show ``connected 0``)."""
    if not cfg.keys:
        return (f"--keys {source}: no device keys there (a JSON {{SN: hex key}} or the "
                "*.json files of `lockmq devices add --out DIR`)")
    sns = [cfg.sn(i) for i in range(cfg.locks)]
    without = [sn for sn in sns if sn not in cfg.keys]
    if without:   # said at once: a broker with auth on refuses them (connected 0)
        have = sorted(cfg.keys)
        print(f"sim: {len(without)} of {len(sns)} SNs have no key in --keys {source} "
              f"(first: {without[0]}; it has {', '.join(have[:3])}"
              f"{' ...' if len(have) > 3 else ''}): a broker with auth on refuses them; "
              "match them with --sn-prefix/--first, or use --register DATA_DIR",
              file=sys.stderr)
    return ""


async def _run(cfg: SimConfig, endpoint: Endpoint, args: argparse.Namespace) -> SimStats:
    stop = stop_on_signals()
    t0 = time.monotonic()
    last = [0, t0]

    def progress(s: SimStats) -> None:
        if args.quiet:
            return
        now = time.monotonic()
        rate = (s.acked - last[0]) / max(1e-9, now - last[1])
        last[0], last[1] = s.acked, now
        print(f"  t={now - t0:5.1f}s  connected {s.connected:5d}  sent {s.sent:7d}  "
              f"acked {s.acked:7d}  busy {s.busy:4d}  reconnects {s.reconnects:3d}  "
              f"commands {s.commands:3d}  {rate:7.0f} acks/s", file=sys.stderr, flush=True)
        if s.connected < cfg.locks and s.last_error:   # why the others do not connect
            print(f"  (not connected: {cfg.locks - s.connected}; last error: {s.last_error})",
                  file=sys.stderr, flush=True)

    return await run_sim(cfg, endpoint, stop=stop, progress=progress)
