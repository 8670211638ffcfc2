"""``lockmq produce``: publish messages to a topic from the command line.

Messages come from the arguments, from stdin (one per line) or, with ``--count``
and no arguments, are generated (``--lock-events`` makes them LockEvent records).
``--count N`` with arguments sends the arguments N times in all, in turn
(``lockmq produce t1 hello --count 5`` sends "hello" five times). ``--mode`` picks
RocketMQ's send mode: ``sync`` waits for each ack, ``async`` keeps many in flight,
``oneway`` asks for no ack.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from typing import Iterator

from lockmq.client import AsyncProducer, LockmqError
from lockmq.client.cliargs import add_connection_args, endpoint_from_args, fail
from lockmq.client.sync import new_event_loop
from lockmq.cli.scheduled import add_when_args, when_kwargs
from lockmq.sim import make_event, percentile


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq produce``."""
    p = sub.add_parser("produce", help="publish messages to a topic",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(p)
    p.add_argument("topic")
    p.add_argument("messages", nargs="*", help="message texts (default: stdin lines)")
    p.add_argument("--mode", choices=("sync", "async", "oneway"), default="sync",
                   help="send mode (default %(default)s)")
    p.add_argument("--count", type=int, default=0,
                   help="send this many messages: the arguments in turn, or generated "
                        "ones when there are none")
    p.add_argument("--size", type=int, default=24, help="size of generated messages")
    p.add_argument("--lock-events", action="store_true",
                   help="generated messages are LockEvent records")
    p.add_argument("--hex", action="store_true", help="arguments/lines are hex bytes")
    p.add_argument("--producer-id", default=None,
                   help="the producer id (SN field); default: generated per process")
    p.add_argument("--window", type=int, default=1000,
                   help="messages in flight in async mode (default %(default)s)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the summary")
    add_when_args(p)   # scheduled delivery: --at / --delay / --level (sync and async)
    p.set_defaults(func=run)


def _messages(args: argparse.Namespace) -> Iterator[bytes]:
    if args.count and args.messages:
        given = [bytes.fromhex(t) if args.hex else t.encode() for t in args.messages]
        for i in range(args.count):
            yield given[i % len(given)]
        return
    if args.count:
        rng = random.Random()
        for i in range(args.count):
            if args.lock_events:
                yield make_event(rng, max(14, args.size))
            else:
                yield (b"%d:" % i).ljust(args.size, b".")[: max(args.size, len(b"%d:" % i))]
        return
    source = args.messages if args.messages else (line.rstrip("\n") for line in sys.stdin)
    for text in source:
        yield bytes.fromhex(text) if args.hex else text.encode()


def run(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq produce``."""
    loop = new_event_loop()
    try:
        return loop.run_until_complete(_produce(args))
    except LockmqError as exc:
        return fail(str(exc))
    finally:
        loop.close()


async def _produce(args: argparse.Namespace) -> int:
    when = when_kwargs(args)
    if when and args.mode == "oneway":
        return fail("--at/--delay/--level need an ack: use --mode sync or async", 2)
    p = AsyncProducer(endpoint_from_args(args), token=args.token, producer_id=args.producer_id,
                      name="cli", max_in_flight=max(1, args.window) + 1)
    await p.connect()
    t0 = time.monotonic()
    lat: list[float] = []
    failed = 0
    sem = asyncio.Semaphore(max(1, args.window))
    pending: set[asyncio.Future] = set()
    n = 0
    try:
        for body in _messages(args):
            n += 1
            if args.mode == "oneway":
                p.send_oneway(args.topic, body)
                continue
            if args.mode == "sync":
                ts = time.monotonic()
                try:
                    r = await p.send(args.topic, body, **when)
                except (LockmqError, asyncio.TimeoutError) as exc:
                    failed += 1
                    print(f"failed: {exc}", file=sys.stderr)
                    continue
                lat.append((time.monotonic() - ts) * 1000)
                if not args.quiet:
                    print(f"{r.message_id} {'schedule_id' if when else 'offset'}={r.offset}"
                          + (" duplicate" if r.duplicate else ""))
                continue
            await sem.acquire()
            ts = time.monotonic()
            fut = p.send_async(args.topic, body, **when)

            def done(f: asyncio.Future, ts: float = ts) -> None:
                nonlocal failed
                sem.release()
                pending.discard(f)
                if f.exception() is not None:
                    failed += 1
                    print(f"failed: {f.exception()}", file=sys.stderr)
                else:
                    lat.append((time.monotonic() - ts) * 1000)
                    if not args.quiet:
                        print(f.result().message_id)

            pending.add(fut)
            fut.add_done_callback(done)
        if pending:
            await asyncio.wait(pending)
    finally:
        await p.close()
    secs = time.monotonic() - t0
    line = f"sent {n} messages ({args.mode}) in {secs:.2f} s, {n / max(secs, 1e-9):.0f} msg/s"
    if lat:
        line += f", ack p50 {percentile(lat, 50):.2f} ms p99 {percentile(lat, 99):.2f} ms"
    if failed:
        line += f", {failed} FAILED"
    print(line, file=sys.stderr)
    return 1 if failed else 0
