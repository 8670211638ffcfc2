"""The benchmark's lean lock (bench/loadgen.py) speaks the protocol byte for byte: its
precomputed PUBLISH frames equal the codec's, its fixed-layout ack check takes exactly
the intact PUBLISH_ACKs of stored records and leaves everything else (another frame,
a split or a damaged ack, a duplicate's ack) to the FrameDecoder, which refuses a
damaged one and counts a duplicate's ack as an error."""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import struct
import sys
from pathlib import Path

import pytest

from lockmq.protocol import (BadChecksum, Challenge, ConnectAck, ErrorCode, Flag, FrameDecoder,
                             NO_SEQ, Op, Publish, PublishAck, encode_frame, error_frame)
from lockmq import accel
from lockmq.protocol.batch import publish_ack_frame, scan_frame as py_scan_frame
from lockmq.testing import BrokerThread, SecureBroker, wait_for_async

from . import helpers
from .helpers import BENCH, bench_module, listening, start_floor

floor_exe = helpers.floor_exe   # the fixture: bench/floor_c.c built once for this module

loadgen = bench_module("loadgen")
TOPIC = "bench.events"
TP = struct.pack(">B", len(TOPIC)) + TOPIC.encode()


@pytest.mark.parametrize("sn", ["B", "BENCH-000042", "L" * 64])
def test_lean_publish_frames_equal_the_codec(sn):
    payload = loadgen.record(random.Random(1))
    frames = loadgen.PublishFrames(sn.encode(), TP, payload)
    for opaque, seq, ts in [(1, 0, 0), (7, 6, 1_700_000_000_123), (0xFFFFFFFF, 0xFFFFFFFF, 2**63)]:
        body = TP + struct.pack(">IQ", seq, ts) + payload
        lean = frames.frame(opaque, seq, ts)
        assert lean == encode_frame(Op.PUBLISH, sn, body, opaque)
        dec = FrameDecoder()
        dec.feed(lean)
        f = dec.next_frame()
        assert (f.opcode, f.sn, f.opaque, f.flags) == (Op.PUBLISH, sn, opaque, 0)
        p = Publish.decode(f.body)
        assert (p.topic, p.seq, p.lock_ts_ms, p.payload) == (TOPIC, seq, ts, payload)
    # what a LeanLock really sends (its own inlined copy of ``frame``): the codec's frame
    lock = loadgen.LeanLock(sn, TP, payload, 4, {}, [], 1, None)
    for seq in range(3):
        now = 1000.0 + seq
        lock._publish(now)
        ts = int((now + loadgen.WALL_MINUS_MONO) * 1000)
        body = TP + struct.pack(">IQ", seq, ts) + payload
        assert lock.out[-1] == encode_frame(Op.PUBLISH, sn, body, seq + 1)


def codec_ack(opaque: int, status: int = 0, offset: int = 9) -> bytes:
    return encode_frame(Op.PUBLISH_ACK, "", PublishAck(status, offset).encode(), opaque,
                        Flag.RESPONSE)


def test_ack_scan_takes_intact_acks_and_stops_at_anything_else():
    acks = codec_ack(3) + publish_ack_frame(0, 77, 4) + codec_ack(0xFFFFFFFF, 0, 2**64 - 1)
    assert publish_ack_frame(0, 9, 3) == codec_ack(3)   # the broker's fast ack is the codec's
    got: list[int] = []
    assert loadgen.scan_acks(acks, 0, got) == len(acks)
    assert got == [3, 4, 0xFFFFFFFF]
    assert all(loadgen.is_stored_ack(acks[i:i + 24]) for i in range(0, len(acks), 24))

    # a duplicate's ack (status 1) is not a new record stored: left to the decoder
    dup = publish_ack_frame(1, 77, 5)
    got = []
    assert loadgen.scan_acks(codec_ack(4) + dup, 0, got) == 24 and got == [4]
    assert not loadgen.is_stored_ack(dup)

    # another frame (a BUSY error) stops the scan at its first byte
    busy = error_frame(ErrorCode.BUSY, "busy", 5, 5)
    got = []
    assert loadgen.scan_acks(codec_ack(1) + busy + codec_ack(2), 0, got) == len(codec_ack(1))
    assert got == [1]

    # an ack split across reads: the whole ones are taken, the part is left
    got = []
    assert loadgen.scan_acks(acks[:30], 0, got) == 24 and got == [3]


@pytest.mark.parametrize("flip", [0, 4, 6, 8, 12, 16, 22, 23])
def test_a_damaged_ack_is_not_taken_and_the_decoder_refuses_it(flip):
    good = codec_ack(11)
    bad = bytearray(good)
    bad[flip] ^= 0x01
    bad = bytes(bad)
    got: list[int] = []
    assert loadgen.scan_acks(good + bad, 0, got) == len(good)
    assert got == [11]
    assert loadgen.is_stored_ack(good) and not loadgen.is_stored_ack(bad)
    if flip in (8, 12, 16, 22, 23):   # header intact: only the CRC can tell
        dec = FrameDecoder()
        dec.feed(bad)
        with pytest.raises(BadChecksum):
            dec.next_frame()


async def _serve_one(accepted: asyncio.Queue) -> tuple[asyncio.AbstractServer, int]:
    async def on_client(reader, writer):  # type: ignore[no-untyped-def]
        await accepted.put((reader, writer))

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _read_frames(reader: asyncio.StreamReader, dec: FrameDecoder, n: int) -> list:
    frames = []
    while len(frames) < n:
        f = dec.next_frame()
        if f is None:
            dec.feed(await reader.read(65536))
            continue
        frames.append(f)
    return frames


def test_lean_lock_over_a_socket_handshakes_counts_split_acks_and_drops_a_damaged_one():
    """Acks split across reads, each read seen by the lock on its own (it waits for the
    lock to hold the part -- TCP may not coalesce the writes behind the test's back):
    a part after whole acks, a tail followed by whole acks and the next part, a tail
    alone. After each read, exactly the acks whose last byte arrived are counted, by
    opaque: none from a part, none twice, none lost."""
    async def run() -> None:
        accepted: asyncio.Queue = asyncio.Queue()
        server, port = await _serve_one(accepted)
        stats = {"busy": 0, "errors": 0, "lost_in_flight": 0}
        ready: list = []
        payload = loadgen.record(random.Random(1))
        lock = loadgen.LeanLock("LOCK-T1", TP, payload, 4, stats, [], 1,
                                lambda p, err=None: ready.append(err))
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        await asyncio.get_running_loop().create_connection(lambda: lock, sock=sock)
        reader, writer = await accepted.get()
        dec = FrameDecoder()
        (connect,) = await _read_frames(reader, dec, 1)
        assert connect.opcode == Op.CONNECT
        writer.write(encode_frame(Op.CHALLENGE, "", Challenge(b"n" * 16, 1).encode(),
                                  connect.opaque, Flag.RESPONSE))
        (auth,) = await _read_frames(reader, dec, 1)
        assert auth.opcode == Op.AUTH
        writer.write(encode_frame(Op.CONNECT_ACK, "", ConnectAck(30, 65536, 1, NO_SEQ, 1).encode(),
                                  auth.opaque, Flag.RESPONSE))
        await wait_for_async(lambda: ready == [None], "the lock is connected")
        lock.start()
        pubs = await _read_frames(reader, dec, 4)
        assert [Publish.decode(f.body).seq for f in pubs] == [0, 1, 2, 3]
        a, b, c, d = (codec_ack(f.opaque) for f in pubs)
        outstanding = {f.opaque for f in pubs}

        async def read_seen(data: bytes, counted: list, holds_part: bool) -> None:
            """Write ``data`` as one read; once the lock has taken it (its decoder
            holds a part, or the count moved), exactly ``counted`` were acked."""
            before = lock.acked
            writer.write(data)
            await writer.drain()
            await wait_for_async(lambda: lock.partial == holds_part
                                 and lock.acked >= before + len(counted), "the read taken")
            outstanding.difference_update(f.opaque for f in counted)
            assert lock.acked == before + len(counted)
            assert outstanding <= set(lock.sent_at)   # none counted from a part
            assert not {f.opaque for f in pubs} - outstanding & set(lock.sent_at)

        await read_seen(a + b[:10], [pubs[0]], holds_part=True)     # whole, then a part
        await read_seen(b[10:] + c + d[:1], [pubs[1], pubs[2]], holds_part=True)
        await read_seen(d[1:], [pubs[3]], holds_part=False)          # the tail alone
        assert lock.acked == 4 and stats["errors"] == 0
        # the refills, one per ack
        refills = await _read_frames(reader, dec, 4)
        assert [Publish.decode(f.body).seq for f in refills] == [4, 5, 6, 7]
        # a fresh record acked as a duplicate (status 1) was not stored as new: an
        # error, not an ack; its place in the window is refilled
        writer.write(codec_ack(refills[3].opaque, status=1))
        await wait_for_async(lambda: stats["errors"] == 1, "the duplicate's ack refused")
        assert lock.acked == 4 and refills[3].opaque not in lock.sent_at
        (refill,) = await _read_frames(reader, dec, 1)
        assert Publish.decode(refill.body).seq == 8
        # an ack for a record already acked, alone in its read: an error, not a count
        writer.write(codec_ack(pubs[0].opaque))
        await wait_for_async(lambda: stats["errors"] == 2, "the second ack refused")
        assert lock.acked == 4
        # a damaged ack: not counted, the connection dropped
        bad = bytearray(codec_ack(refills[0].opaque))
        bad[-1] ^= 0xFF
        writer.write(bytes(bad))
        await wait_for_async(lambda: stats["errors"] == 3 and lock.transport is None,
                             "the damaged ack refused and the connection dropped")
        assert lock.acked == 4
        writer.close()
        server.close()

    asyncio.run(run())


async def publish_records(port: int, sn: str, records: int, tp: bytes = TP) -> tuple[int, dict]:
    """Connect a LeanLock (8 in flight) to ``port``, publish until ``records`` are
    acknowledged to topic ``tp`` (str8), let the window drain: (records acknowledged,
    error counters)."""
    stats = {"busy": 0, "errors": 0, "lost_in_flight": 0}
    ready: list = []
    lock = loadgen.LeanLock(sn, tp, loadgen.record(random.Random(2)), 8, stats, [], 10,
                            lambda p, err=None: ready.append(err))
    ep = loadgen.Endpoint("127.0.0.1", port)
    assert await loadgen.lean_connect(ep, lambda: lock) is lock
    await wait_for_async(lambda: ready == [None], "the handshake answered")
    lock.start()
    await wait_for_async(lambda: lock.acked >= records, f"{records} records acknowledged")
    lock.running = False
    await wait_for_async(lambda: not lock.sent_at, "the window drained")
    assert len(lock.lat) >= records // 10
    lock.transport.close()
    return lock.acked, stats


def test_lean_lock_publishes_to_the_real_broker(tmp_path):
    with BrokerThread(str(tmp_path / "b")) as broker:
        acked, stats = asyncio.run(publish_records(broker.port, "LOCK-T2", 200))
    assert acked >= 200 and stats["errors"] == 0


def _floor_command(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    """The Python floor (bench/floors.py) or the compiled one (bench/floor_c.c: the
    ``floor_exe`` fixture), in fsync mode on a port the kernel picks."""
    args = ["--mode", "fsync", "--port", "0", "--dir", str(tmp_path)]
    if kind == "py":
        return [sys.executable, str(BENCH / "floors.py"), *args]
    return [str(request.getfixturevalue("floor_exe")), *args]


@pytest.mark.parametrize("kind", ["py", "c"])
def test_the_floors_answer_the_lean_lock_and_store_before_acking(kind, tmp_path, request):
    proc, port = start_floor(_floor_command(kind, tmp_path, request))
    try:
        acked, stats = asyncio.run(publish_records(port, "LOCK-F1", 300))
        assert stats["errors"] == 0
        # every acknowledged record (SN + PUBLISH body) was written before its ack
        record_size = len(b"LOCK-F1") + len(TP) + 12 + 24
        assert (tmp_path / "floor.log").stat().st_size >= acked * record_size
        # a frame with a bad CRC: the floor drops that connection and keeps serving
        bad = bytearray(encode_frame(Op.PUBLISH, "LOCK-F2", TP + bytes(12), 1))
        bad[-1] ^= 0xFF
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(bytes(bad))
            assert s.recv(100) == b""
        assert listening(port) and proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("scanner", ["compiled", "pure"])
def test_the_storm_lock_reads_one_whole_answer_like_the_decoder(scanner, monkeypatch):
    if scanner == "pure":   # the protocol's pure-Python scan_frame (no compiled core)
        monkeypatch.setattr(loadgen, "_scan_frame", py_scan_frame)
    elif not accel.COMPILED:
        pytest.skip(f"the hot path is {accel.DESCRIPTION}")
    answers = [encode_frame(Op.CHALLENGE, "", Challenge(b"c" * 16, 5).encode(), 1, Flag.RESPONSE),
               encode_frame(Op.CONNECT_ACK, "", ConnectAck(30, 65536, 1, NO_SEQ, 1).encode(), 2,
                            Flag.RESPONSE),
               codec_ack(3), error_frame(ErrorCode.BUSY, "busy", 3, 10)]
    for frame in answers:
        dec = FrameDecoder()
        dec.feed(frame)
        f = dec.next_frame()
        assert loadgen.whole_frame(frame) == (f.opcode, f.opaque, f.body)
    damaged = bytearray(answers[0])
    damaged[20] ^= 0x40
    for not_one in (answers[0][:-1], answers[0] + answers[1], bytes(damaged),
                    encode_frame(Op.PUBLISH_ACK, "SN", b"\x00" * 9, 3, Flag.RESPONSE)):
        assert loadgen.whole_frame(not_one) is None   # left to the FrameDecoder


def test_a_small_storm_against_the_real_broker_is_all_acknowledged(tmp_path):
    with BrokerThread(str(tmp_path / "b")) as broker:
        ep = loadgen.Endpoint("127.0.0.1", broker.port)
        got = asyncio.run(loadgen.scenario_storm(ep, 40, 0.1, TOPIC, "STORM-"))
    assert (got["acked"], got["failed"], got["errors"]) == (40, 0, 0)
    assert got["gen_busy_pct"] > 0 and "cpu_usr_us" not in got   # no server pid given


def test_the_generator_cost_bench_drives_both_locks_through_their_steady_state():
    # bench/gen_lock_cost.py times one ack read and the next record of each lock kind:
    # every ack it makes must be taken as the ack of the record in flight (else the
    # bench exits), and each lock must have built its next record, one write each
    cost = bench_module("gen_lock_cost")
    for kind in ("lockmq", "mqtt"):
        assert cost.per_record_us(kind, 20, 3) > 0
        stats = {"busy": 0, "errors": 0, "lost_in_flight": 0}
        locks = cost.make_locks(kind, 3, stats)
        before = [next(iter(lock.sent_at)) for lock in locks]
        for lock in locks:
            lock.data_received(cost.ack_of(kind, lock))
        assert stats["errors"] == 0
        assert [lock.acked for lock in locks] == [1, 1, 1]
        assert all(list(lock.sent_at) != [key] and len(lock.sent_at) == 1
                   for lock, key in zip(locks, before))


@pytest.mark.parametrize("tags", ["compiled", "session"])
def test_mac_locks_publish_sealed_to_a_broker_with_auth_required(tags, tmp_path, monkeypatch):
    """The sealed-frame scenario (``--mac``): each lock authenticates with its device key,
    every record is acked with a tag the lock checks (with the compiled frame_tag or
    the session's own path), and it says goodbye sealed: no error on either side."""
    if tags == "session":
        monkeypatch.setattr(loadgen, "_FRAME_TAG", None)
    elif loadgen._FRAME_TAG is None:
        pytest.skip(f"the hot path is {accel.DESCRIPTION}")
    sns = [f"MACT-{j:06d}" for j in range(3)]
    # (a few locks as fast as they can go: above the default per-lock message rate)
    secure = SecureBroker(tmp_path, {"security": {"lock_message_rate": 1e6,
                                                  "lock_message_burst": 1_000_000}}, locks=sns)
    try:
        broker = secure.start()
        monkeypatch.setattr(loadgen, "KEYS", dict(secure.keys))
        ep = loadgen.Endpoint("127.0.0.1", broker.port)
        got = asyncio.run(loadgen.scenario_publish(ep, 3, 2, 0.5, "lock.bench", "MACT-",
                                                   mac=True))
        assert got["acked"] > 0 and got["errors"] == 0 and got["unacked_at_close"] == 0
        metrics = broker.metrics()
        assert metrics["lockmq_publish_stored_total"] == got["acked_total"]
        assert metrics["lockmq_session_violations_total"] == 0   # (a sealed goodbye too)
    finally:
        secure.close()


def test_the_lane_cost_bench_runs_each_kind_through_the_lane():
    # bench/lane_cost.py: every frame of each kind taken by the lane (it asserts so)
    if not accel.COMPILED:
        pytest.skip(f"the hot path is {accel.DESCRIPTION}")
    cost = bench_module("lane_cost")
    assert cost.best_us_per_record(False, 20, 2) > 0
    assert cost.best_us_per_record(True, 20, 3) > 0   # (the counters go on per round)


def test_lean_locks_publish_over_tls_with_the_ca_they_are_given(tmp_path, monkeypatch):
    """``--tls-ca`` (the ``auth-tls`` scenario): the lock checks the broker's
    certificate against the CA, authenticates and publishes over TLS."""
    sn = "TLST-000001"
    secure = SecureBroker(tmp_path, {"security": {"lock_message_rate": 0}}, tls=True,
                          locks=[sn])
    try:
        broker = secure.start()
        monkeypatch.setattr(loadgen, "KEYS", dict(secure.keys))
        monkeypatch.setattr(loadgen, "TLS", [ssl.create_default_context(
            cafile=secure.certs.ca_pem)])
        topic = struct.pack(">B", len("lock.bench")) + b"lock.bench"   # (a lock's own)
        acked, stats = asyncio.run(publish_records(secure.tls_port, sn, 100, topic))
        assert acked >= 100 and stats["errors"] == 0
        assert broker.metrics()["lockmq_publish_stored_total"] >= 100
        # a CA that did not sign the certificate: no connection
        monkeypatch.setattr(loadgen, "TLS", [ssl.create_default_context()])
        ep = loadgen.Endpoint("127.0.0.1", secure.tls_port)
        lock = loadgen.LeanLock(sn, topic, b"x", 1, dict(stats), [], 1, lambda *a: None)
        assert asyncio.run(asyncio.wait_for(loadgen.lean_connect(ep, lambda: lock), 60)) is None
    finally:
        secure.close()
