"""``lockmq demo``: a broker, simulated locks and a consumer cluster, together.

The README's main job, on a fresh machine with no configuration: it starts a real
broker in this process (embedded defaults, a temporary data directory unless
``--data-dir`` is given, any free port), a fleet of simulated locks that speak the
real protocol over TCP, and a consumer cluster of ``--consumers`` members whose
handler records each unlock event in SQLite through the idempotency helper. It
prints progress every second (published, acknowledged, consumed, lag, workers),
sends one remote-unlock command to a lock, and ends with a summary after the
locks have sent ``--events`` records each (or after ``--duration`` seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

from lockmq.client import AsyncConsumer, AsyncProducer, CommandError, LockmqError, Message
from lockmq.client.cliargs import EVENT_NAMES
from lockmq.broker.embedded import EmbeddedBroker
from lockmq.client.idempotency import SqliteIdempotency
from lockmq.client.session import Endpoint
from lockmq.client.sync import new_event_loop
from lockmq.protocol import CommandKind, LockEvent
from lockmq.sim import SimConfig, SimStats, percentile, run_sim

TOPIC = "lock.events"
CLUSTER = "access-log"


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq demo``."""
    p = sub.add_parser(
        "demo", help="run a broker, simulated locks and a consumer cluster together",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--locks", type=int, default=50, help="simulated locks (default %(default)s)")
    p.add_argument("--events", type=int, default=40,
                   help="records each lock sends (default %(default)s; 0 = until --duration)")
    p.add_argument("--rate", type=float, default=5.0,
                   help="records per second per lock (default %(default)s; 0 = as fast as "
                        "acks allow)")
    p.add_argument("--duration", type=float, default=60.0,
                   help="stop the locks after this many seconds at most (default %(default)s)")
    p.add_argument("--consumers", type=int, default=2,
                   help="members of the consumer cluster (default %(default)s)")
    p.add_argument("--min-workers", type=int, default=1, help="workers per member, minimum")
    p.add_argument("--max-workers", type=int, default=4, help="workers per member, maximum")
    p.add_argument("--fail-every", type=int, default=0, metavar="N",
                   help="make the handler fail on every N-th message once, to show "
                        "nack and redelivery (default off)")
    p.add_argument("--data-dir", default=None,
                   help="broker data directory (default: a temporary one, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    p.add_argument("--port", type=int, default=0, help="broker port (default: any free port)")
    p.add_argument("--quiet", action="store_true", help="no per-second progress lines")
    p.add_argument("--secure", action="store_true",
                   help="run the broker with auth = \"required\": register the simulated "
                        "locks' keys and a service token in its registry first (needs the "
                        "'cryptography' package)")
    p.set_defaults(func=run)


class _App:
    """The demo's backend service: an access log in SQLite, written exactly once."""

    def __init__(self, path: str, fail_every: int) -> None:
        self.idem = SqliteIdempotency(path, scope=CLUSTER, synchronous="NORMAL")
        self.idem._conn().execute(
            "CREATE TABLE IF NOT EXISTS access_log (msg_id TEXT PRIMARY KEY, lock TEXT,"
            " event TEXT, lock_ts_ms INTEGER, e2e_ms REAL)")
        self.fail_every = fail_every
        self.handled = 0
        self.failed_once: set[str] = set()
        self.kinds: Counter[str] = Counter()
        self.e2e_ms: list[float] = []
        self._lock = threading.Lock()
        self.handler = self.idem.wrap(self._record)

    def _record(self, conn: sqlite3.Connection, msg: Message) -> None:
        with self._lock:
            self.handled += 1
            n = self.handled
        if self.fail_every and n % self.fail_every == 0 and msg.id not in self.failed_once:
            self.failed_once.add(msg.id)
            raise RuntimeError("simulated failure (the broker will redeliver)")
        ev = LockEvent.decode(msg.payload)
        kind = EVENT_NAMES.get(ev.event_type, str(ev.event_type))
        e2e = max(0.0, time.time() * 1000 - ev.ts_ms)
        conn.execute("INSERT INTO access_log VALUES (?, ?, ?, ?, ?)",
                     (msg.id, msg.sn, kind, ev.ts_ms, e2e))
        with self._lock:
            self.kinds[kind] += 1
            self.e2e_ms.append(e2e)

    def processed(self) -> int:
        return self.idem.count()

    def rows(self) -> tuple[int, int]:
        conn = sqlite3.connect(self.idem.path)
        try:
            total, distinct = conn.execute(
                "SELECT count(*), count(DISTINCT msg_id) FROM access_log").fetchone()
        finally:
            conn.close()
        return int(total), int(distinct)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq demo``."""
    if args.locks < 1 or args.consumers < 1 or args.min_workers < 1 \
            or args.max_workers < args.min_workers:
        print("lockmq demo: need --locks >= 1, --consumers >= 1, "
              "1 <= --min-workers <= --max-workers", file=sys.stderr)
        return 2
    temp = args.data_dir is None
    data_dir = tempfile.mkdtemp(prefix="lockmq-demo-") if temp else args.data_dir
    os.makedirs(data_dir, exist_ok=True)
    broker_dir = os.path.join(data_dir, "broker")
    os.makedirs(broker_dir, exist_ok=True)
    sim_cfg = _sim_config(args)
    token = None
    if args.secure:
        try:
            token = _provision(sim_cfg, broker_dir)
        except Exception as exc:  # noqa: BLE001 - e.g. cryptography missing
            print(f"lockmq demo: cannot set up security: {exc}", file=sys.stderr)
            return 1
    broker = EmbeddedBroker(broker_dir, port=args.port, log_level="ERROR",
                            auth="required" if args.secure else "off")
    try:
        broker.start()
    except Exception as exc:  # noqa: BLE001 - e.g. the port is taken
        print(f"lockmq demo: the broker did not start: {exc}", file=sys.stderr)
        return 1
    print(f"lockmq demo: broker on {broker.address}, data in {data_dir}")
    if args.secure:
        print("             auth required: locks prove their device keys, the service "
              "uses a token")
    else:
        print("             auth off (development mode; --secure turns it on)")
    print(f"             {args.locks} simulated locks -> topic {TOPIC!r} -> consumer cluster "
          f"{CLUSTER!r} ({args.consumers} members, {args.min_workers}-{args.max_workers} "
          f"workers each)")
    app = _App(os.path.join(data_dir, "access-log.db"), args.fail_every)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(_main(args, broker, app, sim_cfg, token))
    except KeyboardInterrupt:
        print("\nlockmq demo: interrupted")
        return 130
    finally:
        loop.close()
        broker.stop()
        app.idem.close()
        if temp and not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
        elif temp:
            print(f"lockmq demo: data kept in {data_dir}")


def _sim_config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(locks=args.locks, topic=TOPIC, events_per_lock=args.events or None,
                     duration_s=args.duration, rate_per_lock=args.rate,
                     connect_spread_s=min(1.0, args.locks / 1000), payload_bytes=22,
                     stay_connected=True)


def _provision(cfg: SimConfig, broker_dir: str) -> str:
    """Register the simulated locks and create the demo service's token."""
    from lockmq.security.config import SecurityConfig
    from lockmq.security.principal import Permissions
    from lockmq.security.tokens import TokenStore
    from lockmq.sim import register_locks

    cfg.keys = register_locks(cfg, broker_dir)
    store = TokenStore(SecurityConfig(data_dir=broker_dir).registry_path)
    try:
        token, _ = store.create("demo-service", Permissions(
            consume=(f"{TOPIC}:{CLUSTER}",), command=(f"{cfg.sn_prefix}*",)), ttl_s=86400)
    finally:
        store.close()
    return token


async def _main(args: argparse.Namespace, broker: EmbeddedBroker, app: _App,
                cfg: SimConfig, token: str | None) -> int:
    t0 = time.monotonic()
    members = [AsyncConsumer(broker.address, topic=TOPIC, cluster=CLUSTER, handler=app.handler,
                             min_workers=args.min_workers, max_workers=args.max_workers,
                             target_per_worker=25, idle_shrink_s=2.0,
                             consumer_id=f"demo-consumer-{i + 1}", token=token)
               for i in range(args.consumers)]
    for m in members:
        await m.start()
    stats = SimStats()
    last = [0, time.monotonic()]
    peak_workers = [0]

    async def watch_pool() -> None:
        while True:
            peak_workers[0] = max(peak_workers[0], sum(m.workers for m in members))
            await asyncio.sleep(0.1)

    pool_watch = asyncio.ensure_future(watch_pool())

    def progress(_: Any = None) -> None:
        if args.quiet:
            return
        now = time.monotonic()
        done = app.processed()
        rate = (done - last[0]) / max(1e-6, now - last[1])
        last[0], last[1] = done, now
        workers = sum(m.workers for m in members)
        print(f"  t={now - t0:5.1f}s  locks online {stats.connected - 0:4d}  "
              f"published {stats.sent:6d}  acked {stats.acked:6d}  consumed {done:6d}  "
              f"lag {max(0, stats.acked - done):5d}  workers {workers:2d}  "
              f"{rate:7.0f} msg/s", flush=True)

    # One remote unlock while the fleet runs: service -> broker -> lock -> back.
    command = asyncio.ensure_future(_try_command(broker, cfg.sn(0), stats, token))
    # Ctrl-C (or SIGTERM) ends the locks early; the cluster still drains, and the
    # summary is printed.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    sim = asyncio.ensure_future(run_sim(cfg, Endpoint("127.0.0.1", broker.port), stats=stats,
                                        linger=command, stop=stop))
    while not sim.done():
        await asyncio.wait([sim], timeout=1.0)
        progress()
    await sim
    # Let the cluster drain what was acknowledged.
    deadline = time.monotonic() + 30
    while app.processed() < stats.acked and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        if int((time.monotonic() - t0) * 5) % 5 == 0:
            progress()
    progress()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.remove_signal_handler(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    if not command.done():
        command.cancel()
    try:
        command_line = await command
    except asyncio.CancelledError:
        command_line = "not sent (interrupted)"
    pool_watch.cancel()
    redelivered = 0
    for m in members:
        redelivered += m.stats["nacked"]
        await m.stop()
    elapsed = time.monotonic() - t0
    total, distinct = app.rows()
    print()
    print("lockmq demo: summary")
    print(f"  elapsed                 {elapsed:.1f} s")
    print(f"  locks connected         {stats.connected} (reconnects {stats.reconnects})")
    print(f"  records published       {stats.sent}, acknowledged {stats.acked} "
          f"(broker said busy {stats.busy} times)")
    if stats.ack_latency_ms:
        print(f"  publish->ack latency    p50 {percentile(stats.ack_latency_ms, 50):.1f} ms, "
              f"p99 {percentile(stats.ack_latency_ms, 99):.1f} ms")
    print(f"  consumed exactly once   {app.processed()} messages, {total} access-log rows, "
          f"{distinct} distinct ids")
    if app.e2e_ms:
        print(f"  lock->handler latency   p50 {percentile(app.e2e_ms, 50):.1f} ms, "
              f"p99 {percentile(app.e2e_ms, 99):.1f} ms")
    print(f"  nacked and redelivered  {redelivered}")
    print(f"  consumer workers        {args.consumers * args.min_workers} at rest, peak "
          f"{peak_workers[0]} (max {args.consumers * args.max_workers}; the pool grows "
          f"with the backlog)")
    print("  events by type          " + ", ".join(f"{k} {v}" for k, v in app.kinds.most_common()))
    print(f"  remote unlock           {command_line}")
    for m in members:
        print(f"  member {m.client_id:18s} acked {m.stats['acked']:6d}  pulls {m.stats['pulls']:5d}")
    ok = app.processed() == stats.acked and total == distinct == stats.acked
    print("  result                  " + ("OK: every acknowledged record was processed once"
                                          if ok else "INCOMPLETE: see the figures above"))
    return 0 if ok else 1


async def _try_command(broker: EmbeddedBroker, sn: str, stats: SimStats,
                       token: str | None) -> str:
    """Send a remote unlock to ``sn`` once the fleet is online; describe the outcome."""
    try:
        async with AsyncProducer(broker.address, name="demo-service", token=token) as svc:
            while stats.acked == 0:
                await asyncio.sleep(0.01)
            out = await svc.command(sn, CommandKind.UNLOCK, (5).to_bytes(2, "big"),
                                    expires_in_s=10, timeout_s=15)
            return f"{sn} answered: {out.detail}"
    except CommandError as exc:
        return f"{sn}: {exc}"
    except (LockmqError, OSError, asyncio.TimeoutError) as exc:
        return f"could not send: {exc}"
