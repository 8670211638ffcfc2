"""Simulated locks in CPython that speak the real protocol (``lockmq sim``).

Each :class:`SimLock` is one TCP connection that authenticates like a lock (device
HMAC over the broker's nonce; any key is accepted by a broker with ``auth = "off"``),
publishes :class:`~lockmq.protocol.LockEvent` records to a topic with its own
sequence numbers (continuing after the broker's ``last_seq``), keeps ``window``
records in flight, retries after BUSY with the broker's hint, reconnects after a
drop and retransmits what was not acknowledged, heartbeats, and answers downlink
commands. Thousands of them run in one event loop: demos, end-to-end tests and the
benchmark's load generator all use this module.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import struct
import time
from dataclasses import dataclass, field
from typing import Callable

from lockmq.protocol import (
    NO_SEQ,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    EventType,
    Flag,
    Heartbeat,
    LockEvent,
    Method,
    Op,
    Publish,
    PublishAck,
    Result,
    Role,
    verify_command,
)

from .client._conn import FrameConnection
from .client.backoff import Backoff
from .client.errors import BusyError, ConnectionLost, LockmqError
from .client.session import Credentials, Endpoint, error_from_body, open_session
from .rlimits import raise_nofile_limit

DEFAULT_TOPIC = "lock.events"


@dataclass
class SimConfig:
    """What the simulated fleet does.

    Attributes:
        locks: how many locks.
        topic: where they publish.
        sn_prefix: lock SNs are ``<prefix><index:06d>``.
        first_index: index of the first lock.
        events_per_lock: records each lock sends, then it stops (None: until
            ``duration_s`` or the stop event).
        duration_s: stop sending after this long (None: no limit).
        rate_per_lock: records per second per lock (0: as fast as acks allow).
        window: records in flight per lock (1 = sync send).
        connect_spread_s: spread the connects uniformly over this many seconds
            (a power-cut storm is ~1 s).
        payload_bytes: size of each LockEvent record (>= 14; the credential fills
            the rest; the paper's records are 24 bytes).
        keys: per-SN device keys (``auth = "required"``); SNs without one use
            ``default_key``.
        default_key: key for SNs not in ``keys``.
        heartbeat: send heartbeats at the broker's interval.
        answer_commands: reply to downlink commands.
        ack_timeout_s: a record not acknowledged by then is sent again.
        stay_connected: keep the connections open after the last record until
            ``stop`` is set or ``duration_s`` passes (or, with run_sim's
            ``linger``, until that future is done too) — e.g. to receive commands.
    """

    locks: int = 10
    topic: str = DEFAULT_TOPIC
    sn_prefix: str = "SIM-"
    first_index: int = 1
    events_per_lock: int | None = 10
    duration_s: float | None = None
    rate_per_lock: float = 1.0
    window: int = 1
    connect_spread_s: float = 0.0
    payload_bytes: int = 22
    keys: dict[str, bytes] = field(default_factory=dict)
    default_key: bytes = b"lockmq-sim-default-key-000000000"
    heartbeat: bool = True
    answer_commands: bool = True
    ack_timeout_s: float = 30.0
    stay_connected: bool = False

    def sn(self, i: int) -> str:
        """The SN of the ``i``-th lock (0-based)."""
        return f"{self.sn_prefix}{self.first_index + i:06d}"


@dataclass
class SimStats:
    """Counters and latency samples of a simulation run (all locks together)."""

    connected: int = 0
    connect_failures: int = 0
    reconnects: int = 0
    sent: int = 0
    acked: int = 0
    duplicates: int = 0
    busy: int = 0
    errors: int = 0
    retransmits: int = 0
    commands: int = 0
    finished_locks: int = 0
    ack_latency_ms: list[float] = field(default_factory=list)
    connect_latency_ms: list[float] = field(default_factory=list)
    first_ack_ms: list[float] = field(default_factory=list)
    keep_latencies: bool = True
    #: why the last connect failed ("" when none did): what `lockmq sim` tells when
    #: locks do not connect (a refused key, frame MACs required, no broker)
    last_error: str = ""

    def summary(self) -> dict[str, float | int]:
        """Plain figures for printing."""
        out: dict[str, float | int] = {
            k: getattr(self, k) for k in ("connected", "connect_failures", "reconnects", "sent",
                                          "acked", "duplicates", "busy", "errors",
                                          "retransmits", "commands", "finished_locks")}
        for name in ("ack_latency_ms", "first_ack_ms", "connect_latency_ms"):
            vals = getattr(self, name)
            if vals:
                out[name.replace("_ms", "") + "_p50_ms"] = round(percentile(vals, 50), 2)
                out[name.replace("_ms", "") + "_p99_ms"] = round(percentile(vals, 99), 2)
        return out


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values`` (not empty)."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


_EVENT_KINDS = (
    (EventType.UNLOCK, Method.CARD, Result.OK),
    (EventType.UNLOCK, Method.PIN, Result.OK),
    (EventType.FAILED_ATTEMPT, Method.CARD, Result.DENIED_UNKNOWN),
    (EventType.DOOR_OPENED, Method.NONE, Result.OK),
    (EventType.DOOR_CLOSED, Method.NONE, Result.OK),
    (EventType.LOCKED, Method.NONE, Result.OK),
)


def make_event(rng: random.Random, size: int = 22, ts_ms: int | None = None) -> bytes:
    """A plausible :class:`LockEvent` record of exactly ``size`` bytes (>= 14)."""
    etype, method, result = _EVENT_KINDS[rng.randrange(len(_EVENT_KINDS))]
    cred_len = max(0, min(255, size - 14))
    cred = rng.getrandbits(8 * cred_len).to_bytes(cred_len, "big") if cred_len else b""
    ts = int(time.time() * 1000) if ts_ms is None else ts_ms
    return LockEvent(etype, ts, method, result, rng.randrange(60), cred).encode()


class SimLock:
    """One simulated lock: a connection, a sequence counter and a sender loop."""

    def __init__(self, index: int, cfg: SimConfig, endpoint: Endpoint, stats: SimStats,
                 stop: asyncio.Event, rng: random.Random) -> None:
        self.sn = cfg.sn(index)
        self.cfg = cfg
        self.endpoint = endpoint
        self.stats = stats
        self.stop = stop
        self.rng = rng
        self.key = cfg.keys.get(self.sn, cfg.default_key)
        self.conn: FrameConnection | None = None
        self.next_seq = 0
        self.backoff = Backoff(0.1, 5.0, rng)
        self._connecting: asyncio.Future | None = None
        self._hb: asyncio.Task | None = None
        self._start = time.monotonic()
        self._first_ack = False
        self.sent_seqs = 0

    async def connect(self) -> FrameConnection:
        """Return an open connection, connecting (with backoff) when needed."""
        conn = self.conn
        if conn is not None and conn.is_open:
            return conn
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        loop = asyncio.get_running_loop()
        self._connecting = loop.create_future()
        try:
            attempt = 0
            while True:
                if self.stop.is_set() and self.conn is None and attempt:
                    raise ConnectionLost("stopped")
                t0 = time.monotonic()
                try:
                    conn, ack = await open_session(
                        self.endpoint, self.sn, Role.LOCK, Credentials.device(self.key),
                        on_frame=self._on_frame, keepalive_s=30)
                except (LockmqError, OSError, asyncio.TimeoutError) as exc:
                    attempt += 1
                    self.stats.connect_failures += 1
                    self.stats.last_error = f"{self.sn}: {exc or type(exc).__name__}"
                    delay = self.backoff.next_delay()
                    if isinstance(exc, BusyError) and exc.retry_after_ms:
                        delay = max(delay, exc.retry_after_ms / 1000 * self.rng.uniform(0.5, 1.0))
                    await asyncio.sleep(delay)
                    continue
                self.backoff.reset()
                if self.conn is None:
                    self.stats.connected += 1
                    if self.stats.keep_latencies:
                        self.stats.connect_latency_ms.append((time.monotonic() - t0) * 1000)
                else:
                    self.stats.reconnects += 1
                if ack.last_seq != NO_SEQ:
                    self.next_seq = max(self.next_seq, ack.last_seq + 1)
                self.conn = conn
                conn.dispatch_early()  # e.g. a command that waited for this lock
                if self.cfg.heartbeat:
                    if self._hb is not None:
                        self._hb.cancel()
                    self._hb = loop.create_task(self._heartbeat(conn, max(1, ack.heartbeat_s)))
                self._connecting.set_result(conn)
                return conn
        except BaseException as exc:
            if not self._connecting.done():
                self._connecting.set_exception(exc)
                self._connecting.exception()  # mark retrieved
            raise
        finally:
            self._connecting = None

    async def _heartbeat(self, conn: FrameConnection, every_s: int) -> None:
        t0 = time.monotonic()
        while conn.is_open:
            await asyncio.sleep(every_s)
            if conn.is_open:
                conn.send(Op.HEARTBEAT, Heartbeat(int(time.time() * 1000),
                                                  int(time.monotonic() - t0)).encode(),
                          0, Flag.ONEWAY)

    def _on_frame(self, frame: object) -> None:
        if getattr(frame, "opcode", None) == Op.COMMAND and self.cfg.answer_commands:
            self._answer_command(frame)

    def _answer_command(self, frame: object) -> None:
        cmd = Command.decode(frame.body)  # type: ignore[attr-defined]
        status, detail = CommandStatus.OK, "done"
        if cmd.mac and not verify_command(self.key, self.sn, cmd):
            status, detail = CommandStatus.REFUSED, "bad command MAC"
        elif cmd.expires_ms and cmd.expires_ms < time.time() * 1000:
            status, detail = CommandStatus.EXPIRED, "command expired before it arrived"
        elif cmd.kind == CommandKind.UNLOCK:
            secs = struct.unpack(">H", cmd.args[:2])[0] if len(cmd.args) >= 2 else 5
            detail = f"unlocked for {secs} s"
        elif cmd.kind not in (CommandKind.CARDS_SET, CommandKind.CONFIG, CommandKind.REBOOT):
            status, detail = CommandStatus.UNSUPPORTED, f"kind {cmd.kind} not supported"
        self.stats.commands += 1
        conn = self.conn
        if conn is not None and conn.is_open:
            conn.send(Op.COMMAND_RESULT, CommandResult(self.sn, cmd.cmd_id, status, detail).encode(),
                      frame.opaque, Flag.RESPONSE)  # type: ignore[attr-defined]

    async def publish(self, payload: bytes) -> None:
        """Publish one record and wait until the broker acknowledged it (retrying
        after BUSY, timeouts and reconnects with the same sequence number)."""
        seq = self.next_seq
        self.next_seq = (seq + 1) & 0xFFFFFFFF
        body = Publish(self.cfg.topic, seq, int(time.time() * 1000), payload).encode()
        stats = self.stats
        stats.sent += 1
        t0 = time.monotonic()
        first = True
        while True:
            conn = await self.connect()
            if not first:
                stats.retransmits += 1
            first = False
            try:
                async with asyncio.timeout(self.cfg.ack_timeout_s):  # no task per record
                    frame = await conn.request(Op.PUBLISH, body)
            except ConnectionLost:
                continue
            except asyncio.TimeoutError:
                conn.close()
                continue
            if frame.opcode == Op.PUBLISH_ACK:
                ack = PublishAck.decode(frame.body)
                stats.acked += 1
                if ack.status == PublishAck.DUPLICATE:
                    stats.duplicates += 1
                now = time.monotonic()
                if stats.keep_latencies:
                    stats.ack_latency_ms.append((now - t0) * 1000)
                    if not self._first_ack:
                        stats.first_ack_ms.append((now - self._start) * 1000)
                self._first_ack = True
                return
            err = error_from_body(frame.body) if frame.opcode == Op.ERROR else None
            if isinstance(err, BusyError):
                stats.busy += 1
                await asyncio.sleep(max(0.001, err.retry_after_ms / 1000) * self.rng.uniform(1, 1.5))
                continue
            stats.errors += 1
            raise err or LockmqError(f"unexpected answer {frame!r}")

    async def run(self, done_all: asyncio.Event | None = None) -> None:
        """Connect (after this lock's share of the connect spread), send, finish."""
        cfg = self.cfg
        if cfg.connect_spread_s > 0:
            await asyncio.sleep(self.rng.uniform(0, cfg.connect_spread_s))
        self._start = time.monotonic()
        try:
            await self.connect()
            workers = [self._sender() for _ in range(max(1, cfg.window))]
            await asyncio.gather(*workers)
            self.stats.finished_locks += 1
            if cfg.stay_connected and done_all is not None:
                await done_all.wait()
        except ConnectionLost:
            pass
        finally:
            self.close()

    async def _sender(self) -> None:
        cfg = self.cfg
        interval = 1.0 / cfg.rate_per_lock if cfg.rate_per_lock > 0 else 0.0
        if interval:
            await asyncio.sleep(self.rng.uniform(0, interval))
        while not self.stop.is_set():
            if cfg.events_per_lock is not None:
                if self.sent_seqs >= cfg.events_per_lock:
                    return
            self.sent_seqs += 1
            await self.publish(make_event(self.rng, cfg.payload_bytes))
            if interval and not self.stop.is_set():
                try:
                    async with asyncio.timeout(interval * cfg.window
                                               * self.rng.uniform(0.8, 1.2)):
                        await self.stop.wait()
                except TimeoutError:
                    pass

    def close(self) -> None:
        """Close the connection and the heartbeat."""
        if self._hb is not None:
            self._hb.cancel()
        if self.conn is not None:
            self.conn.close()


async def run_sim(
    cfg: SimConfig,
    endpoint: Endpoint,
    stop: asyncio.Event | None = None,
    progress: Callable[[SimStats], None] | None = None,
    progress_every_s: float = 1.0,
    seed: int | None = None,
    stats: SimStats | None = None,
    linger: "asyncio.Future | None" = None,
) -> SimStats:
    """Run the simulated fleet until every lock has sent its records, ``duration_s``
    passed or ``stop`` is set. Returns the counters.

    ``linger``: the run also waits for this future after the last record (with
    ``stay_connected`` the locks stay online meanwhile, e.g. for a command)."""
    stop = stop or asyncio.Event()
    stats = stats or SimStats()
    rng = random.Random(seed)
    done_all = asyncio.Event()
    locks = [SimLock(i, cfg, endpoint, stats, stop, random.Random(rng.getrandbits(64)))
             for i in range(cfg.locks)]
    tasks = [asyncio.ensure_future(lock.run(done_all)) for lock in locks]
    all_sent = asyncio.ensure_future(_wait_finished(stats, cfg))

    async def reporter() -> None:
        while True:
            await asyncio.sleep(progress_every_s)
            if progress is not None:
                progress(stats)

    rep = asyncio.ensure_future(reporter()) if progress is not None else None
    try:
        waiters = [asyncio.ensure_future(stop.wait())]
        if linger is not None:
            waiters.append(asyncio.ensure_future(_both(all_sent, linger)))
        elif not cfg.stay_connected:
            waiters.append(all_sent)
        await asyncio.wait(waiters, timeout=cfg.duration_s, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        all_sent.cancel()
        stop.set()
        done_all.set()
        # Locks finish the record they are on (bounded by the ack timeout).
        await asyncio.wait(tasks, timeout=cfg.ack_timeout_s + 5)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if rep is not None:
            rep.cancel()
        for lock in locks:
            lock.close()
    return stats


async def _both(a: "asyncio.Future", b: "asyncio.Future") -> None:
    await asyncio.wait([a, b])


async def _wait_finished(stats: SimStats, cfg: SimConfig) -> None:
    if cfg.events_per_lock is None:
        await asyncio.Event().wait()
    while stats.finished_locks < cfg.locks:
        await asyncio.sleep(0.02)


def load_keys(path: str) -> dict[str, bytes]:
    """Read device keys: a JSON file ``{"SN": "hex key", ...}``, one provisioning
    document ``{"sn": ..., "key": ...}`` or a directory of them (what
    ``lockmq devices add --out DIR`` writes)."""
    if os.path.isdir(path):
        out: dict[str, bytes] = {}
        for name in sorted(os.listdir(path)):
            if name.endswith(".json"):
                out.update(load_keys(os.path.join(path, name)))
        return out
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if isinstance(data, dict) and isinstance(data.get("sn"), str) and "key" in data:
        return {data["sn"]: bytes.fromhex(data["key"])}
    return {sn: bytes.fromhex(k) for sn, k in data.items()}


def register_locks(cfg: SimConfig, data_dir: str | None = None) -> dict[str, bytes]:
    """Register the simulated SNs in the local device registry (``lockmq devices``)
    and return their keys; existing SNs are re-keyed."""
    from lockmq.security.config import SecurityConfig
    from lockmq.security.registry import DeviceExists, DeviceRegistry

    scfg = SecurityConfig() if data_dir is None else SecurityConfig(data_dir=data_dir)
    reg = DeviceRegistry.open(scfg)
    try:
        out: dict[str, bytes] = {}
        sns = [cfg.sn(i) for i in range(cfg.locks)]
        try:
            # (the simulated locks speak without frame MACs: registered so)
            out.update(reg.add_many(sns, note="lockmq sim", mac=False))
        except DeviceExists:
            for sn in sns:
                try:
                    out[sn] = reg.add(sn, note="lockmq sim", mac=False)
                except DeviceExists:
                    out[sn] = reg.rekey(sn)
        return out
    finally:
        reg.close()


def raise_nofile() -> int:
    """Raise this process's open-file limit (thousands of simulated locks need
    thousands of sockets); return the new soft limit."""
    return raise_nofile_limit()[0]
