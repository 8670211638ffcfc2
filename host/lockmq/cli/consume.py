"""``lockmq consume``: join a consumer cluster and print (or just count) messages.

Each printed message is acknowledged. ``--fail-rate`` makes the handler raise for a
share of messages, to watch nacks, retries and dead letters. ``--idempotency``
records every processed id in SQLite (a path) or PostgreSQL (a DSN) so a
redelivered message is reported as a duplicate and has no second effect.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import threading
import time

from lockmq.client import AsyncConsumer, LockmqError, Message
from lockmq.client.campus import AsyncCampusConsumer
from lockmq.client.cliargs import add_connection_args, endpoint_from_args, fail, render_payload
from lockmq.client.idempotency import idempotency_store
from lockmq.client.sync import new_event_loop

from lockmq.signals import stop_on_signals


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq consume``."""
    p = sub.add_parser("consume", help="join a consumer cluster and print messages",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(p)
    p.add_argument("topic")
    p.add_argument("--cluster", "-c", default="cli", help="consumer cluster (default %(default)s)")
    p.add_argument("--count", "-n", type=int, default=0, help="stop after this many messages")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--min-workers", type=int, default=1)
    p.add_argument("--max-workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="messages per pull")
    p.add_argument("--ordered", action="store_true", help="per-lock ordering")
    p.add_argument("--format", choices=("auto", "text", "hex", "event", "json", "none"),
                   default="auto", help="how to print messages (none: only count)")
    p.add_argument("--fail-rate", type=float, default=0.0,
                   help="share of messages the handler fails (nack), 0..1")
    p.add_argument("--idempotency", metavar="PATH|DSN", default=None,
                   help="processed-message table: SQLite file or postgresql:// DSN")
    p.add_argument("--registry", "-r", metavar="HOST:PORT[,HOST:PORT]",
                   default=os.environ.get("LOCKMQ_REGISTRY"),
                   help="consume from every gateway the campus registry lists for the "
                        "topic, joining new ones as they appear (env LOCKMQ_REGISTRY; "
                        "--broker is then not used)")
    p.add_argument("--registry-token", default=os.environ.get("LOCKMQ_REGISTRY_TOKEN"),
                   help="the registry's token (env LOCKMQ_REGISTRY_TOKEN; default --token)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq consume``."""
    loop = new_event_loop()
    try:
        return loop.run_until_complete(_consume(args))
    except LockmqError as exc:
        return fail(str(exc))
    finally:
        loop.close()


class _OverCount(Exception):
    """A message fetched after ``--count`` were claimed: nacked, so it is not lost."""


async def _consume(args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    loop = asyncio.get_running_loop()
    counts = {"handled": 0, "failed": 0, "duplicates": 0, "claimed": 0}
    rng = random.Random()
    lock = threading.Lock()
    idem = idempotency_store(args.idempotency, scope=args.cluster) if args.idempotency else None

    def show(msg: Message, note: str = "") -> None:
        if args.format == "none":
            return
        if args.format == "json":
            print(json.dumps({"id": msg.id, "topic": msg.topic, "delivery": msg.delivery,
                              "lock_ts_ms": msg.lock_ts_ms, "broker_ts_us": msg.broker_ts_us,
                              "headers": msg.headers, "payload_hex": msg.payload.hex(),
                              "note": note}), flush=True)
        else:
            extra = f" delivery={msg.delivery}" if msg.delivery > 1 else ""
            print(f"{msg.id}{extra}{' ' + note if note else ''}  "
                  f"{render_payload(msg.payload, args.format)}", flush=True)

    def handle(msg: Message) -> None:
        if args.count:
            # workers run in parallel: claim one of the --count slots first; a message
            # past them is given back (nacked at once) for another run or member
            with lock:
                if counts["claimed"] >= args.count:
                    raise _OverCount("past --count: given back")
                counts["claimed"] += 1
        if args.fail_rate and rng.random() < args.fail_rate:
            with lock:
                counts["failed"] += 1
                if args.count:
                    counts["claimed"] -= 1   # not handled: its slot is free again
            show(msg, "(failing on purpose: nack)")
            raise RuntimeError("failed on purpose (--fail-rate)")
        if idem is not None:
            with idem.transaction(msg.id) as tx:
                if tx.duplicate:
                    with lock:
                        counts["duplicates"] += 1
                        counts["claimed"] -= 1   # not handled: its slot is free again
                    show(msg, "(duplicate: already processed)")
                    return
        with lock:
            counts["handled"] += 1
            n = counts["handled"]
        show(msg)
        if args.count and n >= args.count:
            loop.call_soon_threadsafe(stop.set)

    opts: dict[str, object] = dict(
        topic=args.topic, cluster=args.cluster, handler=handle,
        min_workers=args.min_workers, max_workers=args.max_workers,
        batch=args.batch, ordered=args.ordered, token=args.token)
    if args.count:   # fetch no more than --count asks for (no prefetch beyond it)
        opts.update(batch=max(1, min(args.batch, args.count)), prefetch=0,
                    max_workers=max(1, min(args.max_workers, args.count)),
                    min_workers=max(1, min(args.min_workers, args.count)), nack_delay_ms=1)
    c = AsyncCampusConsumer(args.registry, registry_token=args.registry_token,
                            registry_insecure=args.insecure, **opts) \
        if args.registry \
        else AsyncConsumer(endpoint_from_args(args), **opts)
    t0 = time.monotonic()
    await c.start()
    print(f"consuming {args.topic!r} as cluster {args.cluster!r} (Ctrl-C to stop)",
          file=sys.stderr)
    try:
        await asyncio.wait_for(stop.wait(), args.duration)
    except asyncio.TimeoutError:
        pass
    await c.stop()
    if idem is not None:
        idem.close()
    secs = time.monotonic() - t0
    print(f"handled {counts['handled']} in {secs:.1f} s "
          f"({counts['handled'] / max(secs, 1e-9):.0f} msg/s), nacked {counts['failed']}, "
          f"duplicates {counts['duplicates']}", file=sys.stderr)
    return 0
