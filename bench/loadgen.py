"""The benchmark's load generator: lean simulated locks and consumers over real TCP.

Run by ``bench_broker.py`` pinned to its own core (``taskset``); each invocation
runs one scenario against one server and prints one JSON line of results. The
same code drives the real broker and the two floors, so their ratio is fair.

Scenarios:
  publish   N locks, each with W records in flight (W = 1: sync send), for D s
  storm     N locks connecting within S seconds, each sending one record
  deliver   preload M records, then C consumers of one cluster drain them
  e2e       publish at a fixed rate while a consumer receives; latency per record
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import ssl
import struct
import sys
import time
from binascii import crc_hqx
from typing import Callable

from lockmq import accel
from lockmq.client._conn import FrameConnection
from lockmq.client.session import Credentials, Endpoint, error_from_body, open_session
from lockmq.client.errors import BusyError, LockmqError
from lockmq.rlimits import raise_nofile_limit
from lockmq.protocol import (
    Ack,
    Auth,
    AuthMethod,
    Challenge,
    ClientSession,
    ESTABLISHED,
    Connect,
    Disconnect,
    FrameDecoder,
    encode_frame,
    EventType,
    Flag,
    LockEvent,
    MIN_FRAME,
    Messages,
    Method,
    Op,
    ProtocolError,
    PublishAck,
    Pull,
    Role,
    Subscribe,
    SubscribeAck,
    transcript_hash,
    VERSION,
)
from lockmq.security.keys import device_proof
from lockmq.protocol import table as protocol_table
from lockmq.protocol.batch import publish_ack_frame, scan_frame as _py_scan_frame

from machine import CpuWindow, tcp_ext_counters  # noqa: E402
from peers import CLIENTS, PEERS, Windowed, redis_drain  # noqa: E402  (bench/ is on sys.path: run as a script)

RECORD_BYTES = 24
KEY = b"lockmq-bench-key-0000000000000000"
#: per-SN device keys (``--keys``: a broker with ``auth = "required"``); else KEY
KEYS: dict[str, bytes] = {}
#: ``--tls-ca``: the TLS context the publish scenario's locks connect with (else empty)
TLS: list[ssl.SSLContext] = []


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (0 for an empty list)."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))]


def record(rng: random.Random) -> bytes:
    """A 24-byte LockEvent (unlock by card, 10-byte credential)."""
    ev = LockEvent(EventType.UNLOCK, int(time.time() * 1000), Method.CARD, 0,
                   rng.randrange(60), rng.getrandbits(80).to_bytes(10, "big"))
    data = ev.encode()
    assert len(data) == RECORD_BYTES
    return data


def publish_body(topic_prefix: bytes, seq: int, payload: bytes) -> bytes:
    """A PUBLISH body built without an object per message (topic, seq, ts, payload)."""
    return topic_prefix + struct.pack(">IQ", seq, int(time.time() * 1000)) + payload


async def connect_lock(ep: Endpoint, sn: str, retries: int = 50) -> tuple[FrameConnection, int]:
    """Open a lock session (retrying refusals); return it and the failed attempts."""
    fails = 0
    delay = 0.05
    while True:
        try:
            conn, _ = await open_session(ep, sn, Role.LOCK, Credentials.device(KEY))
            conn.dispatch_early()
            return conn, fails
        except (LockmqError, OSError, asyncio.TimeoutError):
            fails += 1
            if fails > retries:
                raise
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 2.0)


async def send_one(conn: FrameConnection, body: bytes, counters: dict[str, int]) -> None:
    """Send one PUBLISH and wait for its ack, retrying after BUSY."""
    while True:
        frame = await conn.request(Op.PUBLISH, body)
        if frame.opcode == Op.PUBLISH_ACK:
            return
        err = error_from_body(frame.body) if frame.opcode == Op.ERROR else None
        if isinstance(err, BusyError):
            counters["busy"] += 1
            await asyncio.sleep(max(0.001, err.retry_after_ms / 1000))
            continue
        counters["errors"] += 1
        return


async def connect_all(ep: Endpoint, sns: list[str], parallel: int = 256) -> list[FrameConnection]:
    """Connect many locks, ``parallel`` handshakes at a time."""
    out: list[FrameConnection] = []
    for i in range(0, len(sns), parallel):
        got = await asyncio.gather(*[connect_lock(ep, sn) for sn in sns[i:i + parallel]])
        out.extend(c for c, _ in got)
    return out


#: the CONNECT body of a lean or storm lock (its AUTH proof covers it: the transcript)
LEAN_CONNECT = Connect(Role.LOCK, 30, "bench").encode()
#: the DISCONNECT body every bench connection says goodbye with
BYE = Disconnect(0, "bench done").encode()


async def close_politely(transports: list, timeout: float = 5.0,
                         goodbyes: list[bytes] | None = None) -> None:
    """Send DISCONNECT on every connection and let the server close first (as a
    lock does), then close whatever is still open after ``timeout``. ``goodbyes``:
    each connection's own DISCONNECT frame (sealed, for a session with frame MACs)."""
    # first let this loop turn's queued frames go out (``FrameConnection.send`` writes
    # at the turn's end): a consumer's last ACK behind its DISCONNECT is not read,
    # and the broker rightly redelivers what it acked -- counted as duplicates
    await asyncio.sleep(0)
    plain = encode_frame(Op.DISCONNECT, b"", BYE)
    live = []
    for i, t in enumerate(transports):
        if t is not None and not t.is_closing():
            t.write(goodbyes[i] if goodbyes else plain)
            live.append(t)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(not t.is_closing() for t in live):
        await asyncio.sleep(0.02)
    for t in live:
        if not t.is_closing():
            t.close()


# -- the lean wire path: what a lock sends and reads per message ------------------------
#: a stored record's PUBLISH_ACK as the broker sends it (``publish_ack_frame``): its
#: first 9 bytes -- version, length, opcode, an empty SN, the RESPONSE flag -- are the
#: same in every such ack (then opaque u32, status u8, offset u64, CRC-16)
_STORED_ACK = publish_ack_frame(PublishAck.STORED, 0, 0)
_NUMBERS = {name: value for name, value, _ in protocol_table.NUMBERS}
#: version u8 | length u32 | opcode u16 | sn_len u8, then (after the SN) flags u8 | opaque u32
HEADER_SIZE, SUBHEADER_SIZE = _NUMBERS["HEADER_SIZE"], _NUMBERS["SUBHEADER_SIZE"]
ACK_HEAD = _STORED_ACK[:HEADER_SIZE + 1]
ACK_SIZE = len(_STORED_ACK)
#: where an ack's status byte is, the body's first (0: stored; 1, a duplicate, is not
#: a new record)
ACK_STATUS_AT = HEADER_SIZE + SUBHEADER_SIZE
_OPAQUE = struct.Struct(">I")
_CRC = struct.Struct(">H").pack
#: CRC-16/CCITT-FALSE: the compiled one (eight bytes a step: ~2.7x faster than
#: ``binascii.crc_hqx`` per 72-byte PUBLISH, call included), else the standard library's
crc16 = accel.speedups.crc16 if accel.COMPILED else crc_hqx
#: wall clock minus monotonic clock, taken once: a record's lock time in ms is
#: ``(monotonic + WALL_MINUS_MONO) * 1000`` without reading the wall clock per read
WALL_MINUS_MONO = time.time() - time.monotonic()


def is_stored_ack(frame: bytes) -> bool:
    """``frame`` is exactly one intact PUBLISH_ACK of a stored record: header, length,
    status 0, and CRC-16 (CRC-16/CCITT-FALSE over a frame and its own big-endian CRC
    is 0, so the whole frame is checked in one ``crc16`` call, no slice)."""
    return (len(frame) == ACK_SIZE and frame.startswith(ACK_HEAD)
            and not frame[ACK_STATUS_AT] and not crc16(frame, 0xFFFF))


def scan_acks(buf: bytes, pos: int, opaques: list[int], head: bytes = ACK_HEAD,
              size: int = ACK_SIZE, tag_ok: Callable[[bytes, int, int], bool] | None = None
              ) -> int:
    """Append the opaque of every whole, intact PUBLISH_ACK of a stored record from
    ``buf[pos:]`` to ``opaques``; return where the first other bytes start (another
    frame, a damaged or partial ack, a duplicate's ack: the caller hands them to the
    ``FrameDecoder``). Each ack's header, length, status and CRC-16 are checked;
    sealed acks (``head``, ``size`` of theirs) by ``tag_ok(buf, pos, opaque)`` too."""
    end = len(buf)
    while (end - pos >= size and buf.startswith(head, pos)
           and not buf[pos + ACK_STATUS_AT]
           and not crc16(buf[pos:pos + size], 0xFFFF)):
        opaque = _OPAQUE.unpack_from(buf, pos + 9)[0]
        if tag_ok is not None and not tag_ok(buf, pos, opaque):
            break   # (the session's path refuses it: BAD_MAC)
        opaques.append(opaque)
        pos += size
    return pos


class PublishFrames:
    """The PUBLISH frames of one lock on one topic with one payload: the frame header
    is computed once, each frame is one ``struct`` pack and one ``crc16`` — the
    bytes of ``encode_frame(Op.PUBLISH, sn, publish_body(tp, seq, payload), opaque)``."""

    def __init__(self, snb: bytes, tp: bytes, payload: bytes) -> None:
        length = MIN_FRAME + len(snb) + len(tp) + 12 + len(payload)
        head = struct.pack(">BIHB", VERSION, length, Op.PUBLISH, len(snb)) + snb + b"\x00"
        self.pack = struct.Struct(">%dsI%dsIQ%ds" % (len(head), len(tp), len(payload))).pack
        self.head = head
        self.tp = tp
        self.payload = payload

    def frame(self, opaque: int, seq: int, ts_ms: int) -> bytes:
        """One PUBLISH frame (flags 0: answered by a PUBLISH_ACK)."""
        data = self.pack(self.head, opaque, self.tp, seq, ts_ms, self.payload)
        return data + _CRC(crc16(data, 0xFFFF))


class LeanLock(Windowed):
    """A callback-driven simulated lock: handshake, then keep ``window`` records in
    flight until told to stop. No task or future per message, one socket write per
    read, and in the steady state no codec object either: PUBLISH frames come from
    ``PublishFrames``, acks are read by ``scan_acks``; anything else (the handshake,
    ERROR/BUSY, a frame split across reads) goes through the ``FrameDecoder``."""

    def __init__(self, sn: str, topic_prefix: bytes, payload: bytes, window: int,
                 stats: dict, lat: list, sample: int, on_ready) -> None:
        super().__init__(payload, window, stats, lat, sample, on_ready)
        self.sn = sn
        self.snb = sn.encode()
        self.frames = PublishFrames(self.snb, topic_prefix, payload)
        self.dec = FrameDecoder(1 << 20)
        #: the decoder holds part of a frame: the next read goes to it first
        self.partial = False
        self.t_connect = 0.0

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport
        self.t_connect = time.monotonic()
        transport.write(encode_frame(Op.CONNECT, self.snb, LEAN_CONNECT, 1))

    def connection_lost(self, exc) -> None:  # type: ignore[no-untyped-def]
        self.transport = None
        if self.sent_at:
            self.stats["lost_in_flight"] += len(self.sent_at)

    def _publish(self, now: float) -> None:
        # PublishFrames.frame inlined: this runs once per record
        f = self.frames
        seq = self.seq
        self.seq = seq + 1
        self.sent_at[seq + 1] = now
        # the record's lock time from the read's monotonic clock (no second clock call)
        data = f.pack(f.head, seq + 1, f.tp, seq, int((now + WALL_MINUS_MONO) * 1000), f.payload)
        self.out.append(data + _CRC(crc16(data, 0xFFFF)))

    def _resend(self, opaque: int) -> None:
        if opaque in self.sent_at and self.transport is not None:
            self.transport.write(self.frames.frame(opaque, opaque - 1, int(time.time() * 1000)))

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.partial:   # a frame split across reads is being put together
            self._decode(data, now)
        elif (len(data) == ACK_SIZE and data.startswith(ACK_HEAD) and not data[ACK_STATUS_AT]
              and not crc16(data, 0xFFFF)):
            # the steady state at one in flight, one intact stored ack per read
            # (``is_stored_ack`` inlined: this runs once per record)
            self._acked(_OPAQUE.unpack_from(data, 9)[0], now)
        else:
            opaques: list[int] = []
            pos = scan_acks(data, 0, opaques)
            for opaque in opaques:
                self._acked(opaque, now)
            if pos < len(data):
                self._decode(data[pos:] if pos else data, now)
        self._flush()

    def _decode(self, data: bytes, now: float) -> None:
        """The general path: every frame through the protocol's decoder."""
        stats = self.stats
        try:
            self.dec.feed(data)
            for f in self.dec.frames():
                op = f.opcode
                if op == Op.PUBLISH_ACK:
                    if PublishAck.decode(f.body).status == PublishAck.STORED:
                        self._acked(f.opaque, now)
                    elif self.sent_at.pop(f.opaque, None) is not None:
                        # acked as a duplicate: a fresh seq was not stored as new
                        stats["errors"] += 1
                        if self.running:
                            self._publish(now)
                elif op == Op.CHALLENGE:
                    ch = Challenge.decode(f.body)
                    cn = os.urandom(16)
                    # the proof covers the handshake as sent and received (SPEC 2,
                    # "The session transcript")
                    th = transcript_hash(self.snb, 0, LEAN_CONNECT, f.body)
                    proof = device_proof(KEYS.get(self.sn, KEY), ch.nonce, cn, self.snb, th)
                    self.out.append(encode_frame(Op.AUTH, self.snb, Auth(1, cn, proof).encode(), 2))
                elif op == Op.CONNECT_ACK:
                    self.on_ready(self)
                elif op == Op.ERROR:
                    err = error_from_body(f.body)
                    if isinstance(err, BusyError) and f.opaque in self.sent_at:
                        stats["busy"] += 1
                        asyncio.get_running_loop().call_later(
                            max(0.001, err.retry_after_ms / 1000), self._resend, f.opaque)
                    else:
                        stats["errors"] += 1
                        if f.opaque in (1, 2):
                            self.on_ready(self, err)
        except ProtocolError:
            # a damaged frame (e.g. a bad CRC): the stream cannot be trusted any more
            stats["errors"] += 1
            if self.transport is not None:
                self.transport.abort()
            return
        self.partial = self.dec.buffered() > 0


async def lean_connect(ep: Endpoint, make) -> LeanLock | None:  # type: ignore[no-untyped-def]
    """Open one LeanLock connection; retry refused connects with backoff."""
    loop = asyncio.get_running_loop()
    delay = 0.05
    for _ in range(20):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            # connect the socket ourselves: no resolver thread per connection
            await loop.sock_connect(sock, (ep.host, ep.port))
            tls = TLS[0] if TLS else None
            _, proto = await loop.create_connection(make, sock=sock, ssl=tls,
                                                    server_hostname=ep.host if tls else None)
            return proto
        except ssl.SSLError:   # (a certificate this CA did not sign: retrying cannot help)
            sock.close()
            return None
        except OSError:
            sock.close()
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2.0, delay * 2)
    return None


#: the compiled frame tag (``lockmq._core``), or None: MacLock's steady state
_MAC_PADS = accel.speedups.mac_pads if accel.COMPILED else None
_FRAME_TAG = accel.speedups.frame_tag if accel.COMPILED else None
#: the first 9 bytes of every sealed PUBLISH_ACK (version, length 40, opcode, no SN,
#: flags RESPONSE | MAC), and its size
SEALED_ACK_SIZE = ACK_SIZE + 16
SEALED_ACK_HEAD = struct.pack(">BIHBB", VERSION, SEALED_ACK_SIZE, Op.PUBLISH_ACK, 0,
                              Flag.RESPONSE | Flag.MAC)


class MacLock(Windowed):
    """A lock that authenticates with its device key and asks for frame MACs, as the
    firmware does on plain TCP by default (SPEC 2, "Frame MACs"): the protocol's own
    ``ClientSession`` makes the handshake; every PUBLISH is sealed and every answer's
    tag checked with the session's counters (a wrong ack tag fails the lock). In the
    steady state the tags come from the compiled ``frame_tag`` when it is built, so the
    generator is not what limits the broker's figure; the session's own path
    otherwise, and for everything but a stored ack."""

    def __init__(self, sn: str, topic_prefix: bytes, payload: bytes, window: int,
                 stats: dict, lat: list, sample: int, on_ready) -> None:
        super().__init__(payload, window, stats, lat, sample, on_ready)
        self.sn = sn
        self.tp = topic_prefix
        self.session = ClientSession(Role.LOCK, sn, AuthMethod.DEVICE_HMAC,
                                     KEYS.get(sn, KEY), "bench", 30, mac=True)
        self.dec = FrameDecoder(1 << 20)
        self.snb = sn.encode()
        #: the session key's pads for the compiled tags, once established
        self.pads = b""

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport
        transport.write(self.session.connect_frame(1))

    def connection_lost(self, exc) -> None:  # type: ignore[no-untyped-def]
        self.transport = None
        if self.sent_at:
            self.stats["lost_in_flight"] += len(self.sent_at)

    def _publish(self, now: float) -> None:
        seq = self.seq = self.seq + 1
        self.sent_at[seq] = now
        body = publish_body(self.tp, seq, self.payload)
        session = self.session
        if not self.pads:
            self.out.append(session.seal(Op.PUBLISH, self.sn, body, seq))
            return
        flags = Flag.MAC
        tag = _FRAME_TAG(self.pads, 0, session.tx, Op.PUBLISH, flags, seq, self.snb, body)
        session.tx += 1   # (as session.seal counts)
        self.out.append(encode_frame(Op.PUBLISH, self.snb, body + tag, seq, flags))

    def goodbye(self) -> bytes:
        """Its DISCONNECT, sealed (an untagged one is a session violation: BAD_MAC)."""
        return self.session.seal(Op.DISCONNECT, "", BYE, 0)

    def _tag_ok(self, buf: bytes, pos: int, opaque: int) -> bool:
        """Is the sealed ack at ``buf[pos:]`` tagged for the session's next counter?
        (Then that counter is the ack's: the session counts it as opened.)"""
        session = self.session
        want = _FRAME_TAG(self.pads, 1, session.rx, Op.PUBLISH_ACK, Flag.RESPONSE | Flag.MAC,
                          opaque, b"", buf[pos + 13:pos + 22])
        if want != buf[pos + 22:pos + 38]:
            return False
        session.rx += 1
        return True

    def _stored_acks(self, data: bytes, now: float) -> int:
        """The leading whole, intact sealed stored acks of ``data``, their tags checked
        against the session's counter; returns where the rest starts (the session's)."""
        opaques: list[int] = []
        pos = scan_acks(data, 0, opaques, SEALED_ACK_HEAD, SEALED_ACK_SIZE, self._tag_ok)
        for opaque in opaques:
            self._acked(opaque, now)
        return pos

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        session = self.session
        if self.pads and not self.dec.buffered():
            pos = self._stored_acks(data, now)
            if pos == len(data):
                self._flush()
                return
            data = data[pos:]
        try:
            self.dec.feed(data)
            for f in self.dec.frames():
                was = session.state
                out = session.receive(f, os.urandom(16), 2)   # (tags checked here)
                if out:
                    self.out.append(out)
                if was != ESTABLISHED:
                    if session.state == ESTABLISHED:
                        if _FRAME_TAG is not None:
                            self.pads = _MAC_PADS(session.mac_key)
                        self.on_ready(self)
                elif f.opcode == Op.PUBLISH_ACK and \
                        PublishAck.decode(f.body).status == PublishAck.STORED:
                    self._acked(f.opaque, now)
                else:   # a duplicate's ack, BUSY, a refusal: not a stored record
                    self.stats["errors"] += 1
        except ProtocolError:   # (a SessionError too: a bad tag, a refusal)
            self.stats["errors"] += 1
            if self.transport is not None:
                self.transport.abort()
            return
        self._flush()


async def scenario_publish(ep: Endpoint, locks: int, window: int, duration: float,
                           topic: str, prefix: str, peer: str = "", server_pid: int = 0,
                           mac: bool = False) -> dict:
    """N locks, W in flight each, for ``duration`` seconds: acks/s and latency.
    ``peer``: speak to Mosquitto or Redis instead (``peers.py``), same loop; ``mac``:
    locks with frame MACs (``MacLock``, registered keys: ``--keys``). The
    generator's CPU share and (with ``server_pid``) the server's CPU per record are
    measured over the same window as the rate."""
    rng = random.Random(1)
    tp = struct.pack(">B", len(topic)) + topic.encode()
    payload = record(rng)
    stats = {"busy": 0, "errors": 0, "lost_in_flight": 0}
    lat: list[float] = []
    sample = max(1, (locks * window) // 500)
    ready: list[LeanLock] = []
    all_ready = asyncio.Event()

    def on_ready(lock: LeanLock, err: object = None) -> None:
        ready.append(lock)
        if len(ready) == locks:
            all_ready.set()

    def make(j: int):  # type: ignore[no-untyped-def]
        if peer:
            return CLIENTS[peer](f"{prefix}{j:06d}", payload, window, stats, lat, sample,
                                 on_ready)
        lock = MacLock if mac else LeanLock
        return lock(f"{prefix}{j:06d}", tp, payload, window, stats, lat, sample, on_ready)

    protos: list[LeanLock] = []
    for i in range(0, locks, 256):
        got = await asyncio.gather(*[lean_connect(ep, lambda j=j: make(j))
                                     for j in range(i, min(locks, i + 256))])
        protos.extend(p for p in got if p is not None)
    await asyncio.wait_for(all_ready.wait(), 60)
    await asyncio.sleep(0.2)
    window_cpu = CpuWindow(server_pid)
    t0 = time.monotonic()
    for p in protos:
        p.start()
    await asyncio.sleep(duration)
    for p in protos:
        p.running = False
    acked_at_end = sum(p.acked for p in protos)
    elapsed = time.monotonic() - t0
    cpu = window_cpu.figures(acked_at_end)
    if acked_at_end:
        # the generator's own CPU per acked record: its cost differs by protocol and server
        cpu["gen_us"] = (cpu["gen_usr_s"] + cpu["gen_sys_s"]) / acked_at_end * 1e6
    # let the in-flight records finish before closing (they are not counted)
    deadline = time.monotonic() + 10
    while any(p.sent_at for p in protos) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    if peer:
        for p in protos:
            p.close()
    else:
        await close_politely([p.transport for p in protos],
                             goodbyes=[p.goodbye() for p in protos] if mac else None)
    return {"acked": acked_at_end, "acked_total": sum(p.acked for p in protos),
            "busy": stats["busy"], "errors": stats["errors"],
            "unacked_at_close": sum(len(p.sent_at) for p in protos),
            "seconds": elapsed, "rate": acked_at_end / elapsed,
            "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), **cpu}


#: the protocol's one-frame reader: compiled when ``lockmq._core`` is in use (``lockmq.accel``)
_scan_frame = accel.speedups.scan_frame if accel.COMPILED else _py_scan_frame
#: the opcodes it reads (the protocol table's, code -> name); any other goes to the
#: ``FrameDecoder``
KNOWN_OPCODES = protocol_table.names(protocol_table.OPCODES)


def whole_frame(data: bytes) -> tuple[int, int, bytes] | None:
    """``(opcode, opaque, body)`` when ``data`` is exactly one intact frame without an
    SN (as a broker answers), else None (a split, a pair, a damaged frame: the caller
    hands it to the ``FrameDecoder``). Read by the protocol's ``scan_frame``."""
    got = _scan_frame(data, 0, 1 << 16, KNOWN_OPCODES)
    if got is None or got[5] != len(data) or got[1]:
        return None
    return got[0], got[3], got[4]


class StormLock(asyncio.Protocol):
    """A storm's lock, as lean as a Python lock can be (the generator must not be the
    limit at 10,000 handshakes a second on one core): handshake with its record
    pipelined behind the AUTH (as the firmware does), its ack; no task, future or
    timer of its own, one write per read. Each answer
    usually arrives alone in its read (``whole_frame``); a ``FrameDecoder`` is made
    only for a lock whose reads are split or joined."""

    __slots__ = ("sn", "snb", "storm", "t_start", "transport", "dec", "body")

    def __init__(self, sn: str, storm: "Storm", t_start: float) -> None:
        self.sn = sn
        self.snb = sn.encode()
        self.storm = storm
        self.t_start = t_start
        self.transport = None
        self.dec: FrameDecoder | None = None
        self.body = b""   # the PUBLISH body, once sent (resent after BUSY)

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport
        transport.write(encode_frame(Op.CONNECT, self.snb, self.storm.connect_body, 1))

    def connection_lost(self, exc) -> None:  # type: ignore[no-untyped-def]
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self.dec is None:
            got = whole_frame(data)
            if got is not None:
                self._on_frame(*got)
                return
            self.dec = FrameDecoder(1 << 16)
        try:
            self.dec.feed(data)
            for f in self.dec.frames():
                self._on_frame(f.opcode, f.opaque, f.body)
        except ProtocolError:
            # a damaged frame: this lock is lost (counted), the storm goes on
            self.storm.errors += 1
            self.storm.fail()
            if self.transport is not None:
                self.transport.abort()

    def _on_frame(self, op: int, opaque: int, body: bytes) -> None:
        storm = self.storm
        if op == Op.PUBLISH_ACK and opaque == 3:
            storm.acked(self)
        elif op == Op.CHALLENGE:
            nonce = body[:16]
            cn = os.urandom(16)
            th = transcript_hash(self.snb, 0, storm.connect_body, body)
            proof = device_proof(KEYS.get(self.sn, KEY), nonce, cn, self.snb, th)
            # the record goes in the AUTH's write, as the firmware sends its queued
            # events (SPEC 2, "Pipelined requests"): its ack follows the CONNECT_ACK
            self.body = storm.tp + struct.pack(">IQ", 0, int(time.time() * 1000)) + storm.payload
            self.transport.write(encode_frame(Op.AUTH, self.snb, Auth(1, cn, proof).encode(), 2)
                                 + encode_frame(Op.PUBLISH, self.snb, self.body, 3))
        elif op == Op.ERROR:
            storm.error(self, opaque, body)

    def resend(self) -> None:
        if self.transport is not None:
            self.transport.write(encode_frame(Op.PUBLISH, self.snb, self.body, 3))


class Storm:
    """The storm's shared state and counters (one object, not a closure per lock)."""

    def __init__(self, locks: int, topic: str) -> None:
        self.locks = locks
        self.tp = struct.pack(">B", len(topic)) + topic.encode()
        self.payload = record(random.Random(2))
        self.connect_body = LEAN_CONNECT
        self.lat: list[float] = []
        self.failed = 0
        self.busy = 0
        self.errors = 0
        self.protos: list[StormLock] = []
        self.done = asyncio.Event()

    def acked(self, lock: StormLock) -> None:
        self.lat.append((time.monotonic() - lock.t_start) * 1000)
        self._check_done()

    def error(self, lock: StormLock, opaque: int, body: bytes) -> None:
        err = error_from_body(body)
        if isinstance(err, BusyError) and opaque == 3:
            self.busy += 1
            asyncio.get_running_loop().call_later(max(0.001, err.retry_after_ms / 1000),
                                                  lock.resend)
            return
        self.errors += 1
        if opaque in (1, 2):   # the handshake was refused
            self.fail()

    def fail(self) -> None:
        self.failed += 1
        self._check_done()

    def _check_done(self) -> None:
        if len(self.lat) + self.failed >= self.locks:
            self.done.set()


async def storm_connect(ep: Endpoint, storm: Storm, sn: str) -> None:
    """Connect one storm lock (retrying refused connects with backoff). ``create_connection``
    with the numeric address: uvloop connects in C, no Python socket object, no
    resolver."""
    loop = asyncio.get_running_loop()
    t_start = time.monotonic()
    delay = 0.05
    for _ in range(20):
        try:
            _, proto = await loop.create_connection(lambda: StormLock(sn, storm, t_start),
                                                    ep.host, ep.port)
            storm.protos.append(proto)
            return
        except OSError:
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2.0, delay * 2)
    storm.fail()


async def scenario_storm(ep: Endpoint, locks: int, spread: float, topic: str,
                         prefix: str, server_pid: int = 0) -> dict:
    """N locks connect within ``spread`` s, each sends one record: % acked, latency
    from the start of its connect to its ack.

    The locks' start times (uniform over ``spread``) are drawn first; one driver
    starts every lock that is due, then sleeps until the next one (at least 0.5
    ms): a sleep per millisecond, not a task sleeping per lock."""
    rng = random.Random(2)
    storm = Storm(locks, topic)
    starts = sorted(rng.uniform(0, spread) for _ in range(locks))
    loop = asyncio.get_running_loop()
    connecting = []   # (the tasks are kept, not awaited: ``storm.done`` says when)
    window_cpu = CpuWindow(server_pid)
    tcp0 = tcp_ext_counters()
    t0 = time.monotonic()
    i = 0
    while i < locks:
        now = time.monotonic() - t0
        while i < locks and starts[i] <= now:
            connecting.append(loop.create_task(storm_connect(ep, storm, f"{prefix}{i:06d}")))
            i += 1
        if i < locks:
            await asyncio.sleep(max(0.0005, starts[i] - (time.monotonic() - t0)))
    try:
        await asyncio.wait_for(storm.done.wait(), 30 + spread)
    except asyncio.TimeoutError:
        pass
    elapsed = time.monotonic() - t0
    cpu = window_cpu.figures(len(storm.lat))
    tcp1 = tcp_ext_counters()
    if tcp0 is not None and tcp1 is not None:
        # handshakes the server's full accept queue dropped: each such lock waits for
        # its SYN's retransmission (1 s, then 2, 4 ...), which sets the p99 when >= 1 %
        cpu["listen_drops"] = tcp1["ListenOverflows"] - tcp0["ListenOverflows"]
        cpu["syn_retrans"] = tcp1["TCPSynRetrans"] - tcp0["TCPSynRetrans"]
    await close_politely([p.transport for p in storm.protos])
    lat = storm.lat
    return {"locks": locks, "acked": len(lat), "acked_total": len(lat),
            "acked_pct": 100.0 * len(lat) / locks,
            "failed": storm.failed, "busy": storm.busy, "errors": storm.errors,
            "seconds": elapsed, "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
            "max_ms": max(lat) if lat else 0.0, **cpu}


async def _consumer(ep: Endpoint, topic: str, cluster: str, name: str, batch: int,
                    seen: set, target: int, done: asyncio.Event, on_msg=None) -> int:
    """A lean consumer: two PULLs in flight, one oneway ACK per batch."""
    conn, _ = await open_session(ep, name, Role.SERVICE, Credentials.token(None))
    conn.dispatch_early()
    frame = await conn.request(Op.SUBSCRIBE, Subscribe(topic, cluster, 0, 0, 0).encode())
    if frame.opcode != Op.SUBSCRIBE_ACK:
        raise RuntimeError(f"subscribe refused: {error_from_body(frame.body)}")
    sub = SubscribeAck.decode(frame.body).sub_id
    got = 0
    pull = Pull(sub, batch, 200).encode()
    pending = [conn.request(Op.PULL, pull), conn.request(Op.PULL, pull)]
    while not done.is_set():
        fut = pending.pop(0)
        try:
            frame = await asyncio.wait_for(fut, 5)
        except asyncio.TimeoutError:
            break
        if frame.opcode == Op.MESSAGES:
            msgs = Messages.decode(frame.body).messages
            if msgs:
                now = time.monotonic()
                for m in msgs:
                    seen.add((m.sn, m.seq))
                    if on_msg is not None:
                        on_msg(m, now)
                got += len(msgs)
                conn.send(Op.ACK, Ack(sub, [(m.queue_offset, m.delivery) for m in msgs]).encode(),
                          0, Flag.ONEWAY)
                if len(seen) >= target:
                    done.set()
        if not done.is_set():
            pending.append(conn.request(Op.PULL, pull))
    await close_politely([conn.transport])
    return got


async def scenario_deliver(ep: Endpoint, messages: int, consumers: int, topic: str,
                           prefix: str, batch: int, with_client: bool = False) -> dict:
    """Preload ``messages`` records, then ``consumers`` lean members of one cluster
    drain them; with ``with_client``, ``consumers`` AsyncConsumers of a second
    cluster drain the same records again."""
    rng = random.Random(3)
    locks = 100
    per = messages // locks
    sns = [f"{prefix}{i:06d}" for i in range(locks)]
    conns = await connect_all(ep, sns)
    tp = struct.pack(">B", len(topic)) + topic.encode()
    payload = record(rng)
    counters = {"busy": 0, "errors": 0}

    async def preload(conn: FrameConnection) -> None:
        for base in range(0, per, 32):
            await asyncio.gather(*[send_one(conn, publish_body(tp, s, payload), counters)
                                   for s in range(base, min(per, base + 32))])

    t0 = time.monotonic()
    await asyncio.gather(*[preload(c) for c in conns])
    preload_s = time.monotonic() - t0
    await close_politely([c.transport for c in conns])
    total = per * locks
    seen: set = set()
    done = asyncio.Event()
    t0 = time.monotonic()
    counts = await asyncio.wait_for(asyncio.gather(*[
        _consumer(ep, topic, "bench-cluster", f"bench-consumer-{k}", batch, seen, total, done)
        for k in range(consumers)]), max(60, total / 5000))
    elapsed = time.monotonic() - t0
    out = {"messages": total, "received": sum(counts), "unique": len(seen),
           "lost": total - len(seen), "duplicates": sum(counts) - len(seen),
           "seconds": elapsed, "rate": len(seen) / elapsed, "preload_s": preload_s,
           "per_consumer": counts}
    if with_client:
        out.update(await _client_cluster(ep, topic, consumers, total))
    return out


async def _client_cluster(ep: Endpoint, topic: str, members: int, total: int) -> dict:
    """A second cluster on the same topic, made of ``lockmq.client.AsyncConsumer``
    members with a no-op handler: what the library itself delivers per second."""
    from lockmq.client import AsyncConsumer

    seen: set = set()
    done = asyncio.Event()

    async def handler(msg) -> None:  # type: ignore[no-untyped-def]
        seen.add((msg.sn, msg.seq))
        if len(seen) >= total:
            done.set()

    cs = [AsyncConsumer(f"{ep.host}:{ep.port}", topic=topic, cluster="bench-client",
                        handler=handler, min_workers=4, max_workers=4, batch=500,
                        backlog_poll_s=0, consumer_id=f"bench-client-{k}")
          for k in range(members)]
    t0 = time.monotonic()
    for c in cs:
        await c.start()
    try:
        await asyncio.wait_for(done.wait(), max(60, total / 5000))
    except asyncio.TimeoutError:
        pass
    elapsed = time.monotonic() - t0
    for c in cs:
        await c.stop()
    return {"client_rate": len(seen) / elapsed, "client_lost": total - len(seen),
            "client_redelivered": sum(c.stats["received"] for c in cs) - len(seen)}


async def scenario_e2e(ep: Endpoint, locks: int, rate: float, duration: float, topic: str,
                       prefix: str) -> dict:
    """Publish at ``rate`` msg/s in total while one consumer receives: latency."""
    rng = random.Random(4)
    sns = [f"{prefix}{i:06d}" for i in range(locks)]
    conns = await connect_all(ep, sns)
    tp = struct.pack(">B", len(topic)) + topic.encode()
    payload = record(rng)
    sent: dict[tuple[str, int], float] = {}
    lat: list[float] = []
    counters = {"busy": 0, "errors": 0}
    seen: set = set()
    done = asyncio.Event()

    def on_msg(m, now: float) -> None:
        t = sent.pop((m.sn, m.seq), None)
        if t is not None:
            lat.append((now - t) * 1000)

    total = int(rate * duration) // locks * locks
    consumer = asyncio.ensure_future(_consumer(ep, topic, "bench-e2e", "bench-e2e-consumer",
                                               256, seen, total, done, on_msg))
    await asyncio.sleep(0.3)
    interval = locks / rate

    async def lock(i: int, conn: FrameConnection) -> None:
        await asyncio.sleep(rng.uniform(0, interval))
        for seq in range(total // locks):
            sent[(sns[i], seq)] = time.monotonic()
            await send_one(conn, publish_body(tp, seq, payload), counters)
            await asyncio.sleep(interval)

    await asyncio.gather(*[lock(i, c) for i, c in enumerate(conns)])
    try:
        await asyncio.wait_for(done.wait(), 30)
    except asyncio.TimeoutError:
        pass
    done.set()
    await consumer
    await close_politely([c.transport for c in conns])
    return {"messages": total, "received": len(seen), "lost": total - len(seen),
            "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
            "max_ms": max(lat) if lat else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=("publish", "storm", "deliver", "e2e"))
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--locks", type=int, default=100)
    ap.add_argument("--window", type=int, default=1)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--spread", type=float, default=1.0)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--client", action="store_true",
                    help="deliver: also drain with lockmq.client.AsyncConsumer members")
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--topic", default="bench.events")
    ap.add_argument("--prefix", default="BENCH-")
    ap.add_argument("--peer", choices=PEERS, default="",
                    help="publish: drive Mosquitto (MQTT QoS 1) or Redis (XADD) instead; "
                         "deliver: drain a Redis consumer group (XREADGROUP + XACK)")
    ap.add_argument("--server-pid", type=int, default=0,
                    help="the server's pid: report its CPU (user, system) per record over "
                         "the measured window")
    ap.add_argument("--mac", action="store_true",
                    help="publish: locks that authenticate with their keys (--keys) and "
                         "seal every frame (frame MACs), as the firmware on plain TCP")
    ap.add_argument("--keys", default="",
                    help="JSON file {sn: hex key}: the device keys of registered locks")
    ap.add_argument("--tls-ca", default="",
                    help="publish: the locks connect with TLS, trusting this CA (PEM) for "
                         "the broker's certificate (--port: its TLS port)")
    args = ap.parse_args()
    if args.keys:
        with open(args.keys) as fh:
            KEYS.update({sn: bytes.fromhex(k) for sn, k in json.load(fh).items()})
    if args.tls_ca:
        TLS[:] = [ssl.create_default_context(cafile=args.tls_ca)]
    raise_nofile_limit()
    ep = Endpoint("127.0.0.1", args.port, connect_timeout_s=30)
    if args.scenario == "publish":
        coro = scenario_publish(ep, args.locks, args.window, args.duration, args.topic,
                                args.prefix, args.peer, args.server_pid, args.mac)
    elif args.scenario == "storm":
        coro = scenario_storm(ep, args.locks, args.spread, args.topic, args.prefix,
                              args.server_pid)
    elif args.scenario == "deliver" and args.peer == "redis":
        coro = redis_drain(ep.host, ep.port, args.messages, args.consumers,
                           record(random.Random(3)))
    elif args.scenario == "deliver":
        coro = scenario_deliver(ep, args.messages, args.consumers, args.topic, args.prefix,
                                args.batch, args.client)
    else:
        coro = scenario_e2e(ep, args.locks, args.rate, args.duration, args.topic, args.prefix)
    try:
        import uvloop

        result = uvloop.run(coro) if sys.version_info >= (3, 12) else _run_uvloop(coro)
    except ImportError:
        result = asyncio.run(coro)
    print(json.dumps(result), flush=True)


def _run_uvloop(coro):  # type: ignore[no-untyped-def]
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
