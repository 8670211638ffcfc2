"""The benchmark's peers: what a gateway operator would run instead of lockmq.

* ``mosquitto`` — MQTT 3.1.1, QoS 1 PUBLISH / PUBACK (default persistence: it acks
  from memory, never fsyncs before an ack);
* ``redis``     — ``XADD`` on a stream with ``appendfsync always`` (fsync before the
  reply, like lockmq's ``store.flush = sync``); and the drain of a consumer group
  (``redis_drain``: ``XREADGROUP COUNT 100``, one ``XACK`` per batch).

Each has a lean asyncio client with the same shape as ``loadgen.LeanLock`` (``start``,
``running``, ``sent_at``, ``transport``) so ``loadgen.scenario_publish`` drives all
of them with the same loop, and a ``command`` for ``bench_broker.Server``. Nothing
here is lockmq code: a peer that is not installed is skipped by the benchmark.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import time
from typing import Callable

PEERS = ("mosquitto", "redis")


def peer_binary(kind: str) -> str | None:
    """The server's executable, or None when it is not installed."""
    name = {"mosquitto": "mosquitto", "redis": "redis-server"}[kind]
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None)


def command(kind: str, port: int, data_dir: str) -> list[str]:
    """The command line that runs peer ``kind`` on ``port`` with its data in ``data_dir``."""
    exe = peer_binary(kind)
    if exe is None:
        raise FileNotFoundError(f"{kind} is not installed (apt-get install "
                                f"{'mosquitto' if kind == 'mosquitto' else 'redis-server'})")
    if kind == "mosquitto":
        conf = os.path.join(data_dir, "mosquitto.conf")
        with open(conf, "w") as fh:
            fh.write(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                     f"persistence true\npersistence_location {data_dir}/\n"
                     "max_inflight_messages 0\nmax_queued_messages 0\n")
        return [exe, "-c", conf]
    return [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", data_dir,
            "--appendonly", "yes", "--appendfsync", "always", "--save", "",
            "--protected-mode", "no", "--daemonize", "no"]


def _mqtt_str(s: bytes) -> bytes:
    return struct.pack(">H", len(s)) + s


def _mqtt_len(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


class Windowed(asyncio.Protocol):
    """A publisher keeping ``window`` records in flight, with one socket write per
    read (``out``): shared by ``loadgen.LeanLock`` and the peers' clients, so every
    client pays the same per ack: one dict pop, one counter, one clock read per
    socket read (not per message), one frame built."""

    def __init__(self, payload: bytes, window: int, stats: dict, lat: list, sample: int,
                 on_ready: Callable) -> None:
        self.payload = payload
        self.window = window
        self.stats = stats
        self.lat = lat
        self.sample = sample
        self.on_ready = on_ready
        self.transport: asyncio.Transport | None = None
        self.running = False
        self.out: list[bytes] = []
        #: records acknowledged (summed over the clients by the scenario)
        self.acked = 0
        self.seq = 0
        #: request key -> monotonic time it was sent
        self.sent_at: dict[int, float] = {}

    def start(self) -> None:
        """Begin publishing (fill the window)."""
        self.running = True
        now = time.monotonic()
        for _ in range(self.window):
            self._publish(now)
        self._flush()

    def _acked(self, key: int, now: float) -> None:
        """Request ``key`` was acknowledged (in a read that arrived at ``now``)."""
        t = self.sent_at.pop(key, None)
        if t is None:   # an ack for nothing in flight (or a second one): never counted
            self.stats["errors"] += 1
            return
        self.acked += 1
        if self.acked % self.sample == 0:
            self.lat.append((now - t) * 1000)
        if self.running:
            self._publish(now)

    def _flush(self) -> None:
        out = self.out
        if out:
            if self.transport is not None:
                self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    def _publish(self, now: float) -> None:
        raise NotImplementedError


class _Lean(Windowed):
    """What the peers' clients share: a name and a read buffer."""

    def __init__(self, name: str, payload: bytes, window: int, stats: dict, lat: list,
                 sample: int, on_ready: Callable) -> None:
        super().__init__(payload, window, stats, lat, sample, on_ready)
        self.name = name.encode()
        self.buf = b""

    def connection_lost(self, exc) -> None:  # type: ignore[no-untyped-def]
        self.transport = None


class LeanMqtt(_Lean):
    """MQTT 3.1.1 publisher at QoS 1: CONNECT, then PUBLISH / PUBACK by packet id."""

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport
        var = _mqtt_str(b"MQTT") + bytes((4, 0x02)) + struct.pack(">H", 60)
        body = var + _mqtt_str(self.name)
        transport.write(b"\x10" + _mqtt_len(len(body)) + body)
        self.topic = _mqtt_str(b"bench/events")

    def _publish(self, now: float) -> None:
        self.seq = self.seq % 65535 + 1
        body = self.topic + struct.pack(">H", self.seq) + self.payload
        self.sent_at[self.seq] = now
        self.out.append(b"\x32" + _mqtt_len(len(body)) + body)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        pos = 0
        now = time.monotonic()
        # the broker sends only CONNACK (0x20) and PUBACK (0x40), both 4 bytes
        while len(buf) - pos >= 4:
            kind = buf[pos]
            if kind == 0x40:
                self._acked(struct.unpack_from(">H", buf, pos + 2)[0], now)
            elif kind == 0x20:
                self.on_ready(self)
            else:
                self.stats["errors"] += 1
            pos += 4
        self.buf = buf[pos:]
        self._flush()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.write(b"\xe0\x00")   # DISCONNECT
            self.transport.close()


class LeanRedis(_Lean):
    """Redis publisher: ``XADD bench.events * r <payload>``; replies come in order."""

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport
        self.next_reply = 1
        asyncio.get_running_loop().call_soon(self.on_ready, self)

    def _publish(self, now: float) -> None:
        self.seq += 1
        p = self.payload
        self.sent_at[self.seq] = now
        self.out.append(b"*5\r\n$4\r\nXADD\r\n$12\r\nbench.events\r\n$1\r\n*\r\n$1\r\nr\r\n$%d\r\n"
                        % len(p) + p + b"\r\n")

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        pos = 0
        now = time.monotonic()
        while True:
            end = buf.find(b"\r\n", pos)
            if end < 0:
                break
            kind = buf[pos:pos + 1]
            if kind == b"$":   # the new entry's id: $n\r\n<id>\r\n
                stop = end + 2 + int(buf[pos + 1:end]) + 2
                if stop > len(buf):
                    break
                pos = stop
                self._acked(self.next_reply, now)
            else:              # -ERR ...
                pos = end + 2
                self.stats["errors"] += 1
                self.sent_at.pop(self.next_reply, None)
            self.next_reply += 1
        self.buf = buf[pos:]
        self._flush()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


CLIENTS = {"mosquitto": LeanMqtt, "redis": LeanRedis}


# -- Redis consumer groups: the drain figure's peer -------------------------------------
def resp_command(*args: bytes) -> bytes:
    """One RESP command (an array of bulk strings)."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def resp_parse(buf: bytes, pos: int):  # type: ignore[no-untyped-def]
    """One RESP reply at ``pos``: (value, next pos), or None while it is incomplete.
    Errors come back as ``Exception`` values (not raised)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return None
    kind, line, nxt = buf[pos:pos + 1], buf[pos + 1:end], end + 2
    if kind == b"+":
        return line, nxt
    if kind == b"-":
        return Exception(line.decode()), nxt
    if kind == b":":
        return int(line), nxt
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, nxt
        if len(buf) < nxt + n + 2:
            return None
        return buf[nxt:nxt + n], nxt + n + 2
    n = int(line)   # "*": an array
    if n < 0:
        return None, nxt
    items = []
    for _ in range(n):
        got = resp_parse(buf, nxt)
        if got is None:
            return None
        item, nxt = got
        items.append(item)
    return items, nxt


class RespConnection(asyncio.Protocol):
    """Requests and their replies, in order, on one Redis connection."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.waiting: list[asyncio.Future] = []

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        pos = 0
        while self.waiting:
            got = resp_parse(buf, pos)
            if got is None:
                break
            value, pos = got
            self.waiting.pop(0).set_result(value)
        self.buf = buf[pos:]

    def send(self, *commands: bytes) -> list[asyncio.Future]:
        """Write ``commands`` at once; one future per reply."""
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in commands]
        self.waiting.extend(futs)
        assert self.transport is not None
        self.transport.write(b"".join(commands))
        return futs


async def redis_drain(host: str, port: int, messages: int, consumers: int, payload: bytes,
                      count: int = 100) -> dict:
    """Preload ``messages`` XADDs, then ``consumers`` members of one consumer group drain
    them: ``XREADGROUP COUNT count`` and one ``XACK`` per batch (sent with the next read)."""
    loop = asyncio.get_running_loop()

    async def connect() -> RespConnection:
        _, proto = await loop.create_connection(RespConnection, host, port)
        return proto

    conn = await connect()
    xadd = resp_command(b"XADD", b"bench.events", b"*", b"r", payload)
    t0 = time.monotonic()
    for base in range(0, messages, 1000):
        futs = conn.send(*[xadd] * min(1000, messages - base))
        await futs[-1]
    preload_s = time.monotonic() - t0
    (err,) = conn.send(resp_command(b"XGROUP", b"CREATE", b"bench.events", b"g", b"0"))
    if isinstance(await err, Exception):
        raise RuntimeError(f"XGROUP CREATE: {err.result()}")
    seen: set = set()
    dup = [0]

    async def member(k: int) -> None:
        c = await connect()
        read = resp_command(b"XREADGROUP", b"GROUP", b"g", b"c%d" % k, b"COUNT", b"%d" % count,
                            b"STREAMS", b"bench.events", b">")
        ack = b""
        while True:
            futs = c.send(*([ack, read] if ack else [read]))
            reply = await futs[-1]
            if not reply:   # nil: nothing left for this member
                break
            entries = reply[0][1]
            ids = [e[0] for e in entries]
            for i in ids:
                if i in seen:
                    dup[0] += 1
                seen.add(i)
            ack = resp_command(b"XACK", b"bench.events", b"g", *ids) if ids else b""
        if ack:
            await c.send(ack)[0]
        c.transport.close()  # type: ignore[union-attr]

    t0 = time.monotonic()
    await asyncio.gather(*[member(k) for k in range(consumers)])
    elapsed = time.monotonic() - t0
    conn.transport.close()  # type: ignore[union-attr]
    return {"messages": messages, "unique": len(seen), "lost": messages - len(seen),
            "duplicates": dup[0], "seconds": elapsed, "rate": len(seen) / elapsed,
            # what a Redis client gets is the figure AsyncConsumer is held against
            "client_rate": len(seen) / elapsed, "client_lost": messages - len(seen),
            "preload_s": preload_s}
