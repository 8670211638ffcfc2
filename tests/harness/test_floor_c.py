"""The compiled floor (bench/floor_c.c), built here with cc and spoken to over real
sockets: each storing mode acknowledges a PUBLISH only once its record (SN + body) is
in its file, the delay mode only once its delay has passed, acks come back in order
with the connection's offsets, and a bad frame or a connection gone with acks still in
flight costs the floor nothing else."""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from lockmq.protocol import Flag, FrameDecoder, Op, PublishAck, encode_frame

from . import helpers
from .helpers import start_floor

floor_exe = helpers.floor_exe   # the fixture: bench/floor_c.c built once for this module

TOPIC = b"bench.events"
#: "fsync-thread:2": two writer threads, two fdatasyncs in flight (``--writers 2``)
STORING_MODES = ("fsync", "fsync-thread", "fsync-thread:2")
COMMIT_DELAY_MS = 20
#: the delay mode's wait per batch in these tests (``--delay-us``)
DELAY_US = 30_000


class Floor:
    """One floor_c process in ``mode`` with its log under ``directory``. Each commit
    waits ``COMMIT_DELAY_MS`` before its write, so an ack sent before its commit
    would reach the test while its record is still missing from the file."""

    def __init__(self, exe: Path, mode: str, directory: Path) -> None:
        self.log = directory / "floor.log"
        mode, _, writers = mode.partition(":")
        self.proc, self.port = start_floor(
            [str(exe), "--mode", mode, "--port", "0", "--dir", str(directory),
             "--commit-delay-ms", str(COMMIT_DELAY_MS), "--writers", writers or "1",
             "--delay-us", str(DELAY_US)])

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def stored(self) -> bytes:
        return self.log.read_bytes() if self.log.exists() else b""


@pytest.fixture(params=("ack", "delay", *STORING_MODES))
def floor(request: pytest.FixtureRequest, floor_exe: Path, tmp_path: Path) -> Iterator[Floor]:
    f = Floor(floor_exe, request.param, tmp_path)
    try:
        yield f
    finally:
        f.proc.terminate()
        f.proc.wait(10)


def publish_body(seq: int, payload: bytes) -> bytes:
    return bytes([len(TOPIC)]) + TOPIC + struct.pack(">IQ", seq, 1_700_000_000_000 + seq) + payload


def record(sn: str, seq: int) -> bytes:
    """What the floor appends for one PUBLISH: SN + body (the payload names it)."""
    return sn.encode() + publish_body(seq, f"{sn}/{seq:06d}".encode())


def publish(sn: str, seq: int, flags: int = 0) -> bytes:
    return encode_frame(Op.PUBLISH, sn, publish_body(seq, f"{sn}/{seq:06d}".encode()),
                        seq, flags)


def read_acks(sock: socket.socket, dec: FrameDecoder) -> Iterator[tuple[int, int]]:
    """(opaque, offset) of each PUBLISH_ACK as it arrives."""
    while True:
        f = dec.next_frame()
        if f is None:
            data = sock.recv(65536)
            assert data, "the floor closed the connection"
            dec.feed(data)
            continue
        assert f.opcode == Op.PUBLISH_ACK and f.flags & Flag.RESPONSE
        ack = PublishAck.decode(f.body)
        assert ack.status == PublishAck.STORED
        yield f.opaque, ack.offset


@pytest.mark.parametrize("floor", STORING_MODES, indirect=True)
def test_a_storing_floor_acks_each_publish_only_after_its_record_is_in_its_file(floor):
    socks = {f"LOCK-{i}": floor.connect() for i in range(4)}
    # every lock sends 3 oneway records (stored, never acked), then 60 in one
    # write: each ack that comes back must find its record, and every record
    # sent before it on that connection, already in the file
    for sn, s in socks.items():
        s.sendall(b"".join(publish(sn, seq, Flag.ONEWAY) for seq in range(3))
                  + b"".join(publish(sn, seq) for seq in range(3, 63)))
    for sn, s in socks.items():
        acks = read_acks(s, FrameDecoder())
        for seq in range(3, 63):
            opaque, offset = next(acks)
            assert (opaque, offset) == (seq, seq + 1)   # in order; oneways counted
            stored = floor.stored()
            for before in range(seq + 1):
                assert record(sn, before) in stored, (sn, before, "acked before stored")
    assert len(floor.stored()) == sum(len(record(sn, seq)) for sn in socks
                                      for seq in range(63))
    for s in socks.values():
        s.close()


@pytest.mark.parametrize("floor", ["ack"], indirect=True)
def test_the_ack_floor_acks_in_order_and_stores_nothing(floor):
    with floor.connect() as s:
        s.sendall(b"".join(publish("LOCK-A", seq) for seq in range(20)))
        acks = read_acks(s, FrameDecoder())
        assert [next(acks) for _ in range(20)] == [(seq, seq + 1) for seq in range(20)]
    assert floor.stored() == b""


@pytest.mark.parametrize("floor", ["delay"], indirect=True)
def test_the_delay_floor_acks_each_publish_only_after_its_delay_and_stores_nothing(floor):
    with floor.connect() as s:
        acks = read_acks(s, FrameDecoder())
        for seq in range(5):   # one at a time, as a sync lock sends
            sent = time.monotonic()
            s.sendall(publish("LOCK-A", seq))
            assert next(acks) == (seq, seq + 1)
            assert time.monotonic() - sent >= DELAY_US / 1e6
        # a burst: in order, and none before the delay
        sent = time.monotonic()
        s.sendall(b"".join(publish("LOCK-A", seq) for seq in range(5, 25)))
        assert next(acks) == (5, 6)
        assert time.monotonic() - sent >= DELAY_US / 1e6
        assert [next(acks) for _ in range(6, 25)] == [(seq, seq + 1) for seq in range(6, 25)]
    assert list(floor.log.parent.iterdir()) == []   # no log, no latency probe left


def test_the_delay_floor_measures_its_delay_on_the_disk_when_given_none(floor_exe, tmp_path):
    proc = subprocess.Popen([str(floor_exe), "--mode", "delay", "--port", "0",
                             "--dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        said = proc.stderr.readline().decode()
        assert re.fullmatch(r"floor_c delay [1-9][0-9]* us\n", said), said
        assert " listening on " in proc.stdout.readline().decode()
        assert list(tmp_path.iterdir()) == []   # the probe file is gone
    finally:
        proc.terminate()
        proc.wait(10)


def test_bad_frames_and_connections_gone_with_acks_in_flight_cost_nothing_else(floor):
    # a frame with a bad CRC: that connection is dropped
    bad = bytearray(publish("LOCK-BAD", 1))
    bad[-1] ^= 0xFF
    with floor.connect() as s:
        s.sendall(bytes(bad))
        assert s.recv(100) == b""
    # connections that vanish (RST) right after their records, acks still to come
    for i in range(20):
        s = floor.connect()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.sendall(b"".join(publish(f"LOCK-GONE{i}", seq) for seq in range(50)))
        s.close()
    # the floor still serves, and acks a newcomer's records
    with floor.connect() as s:
        s.sendall(b"".join(publish("LOCK-NEXT", seq) for seq in range(5)))
        acks = read_acks(s, FrameDecoder())
        assert [next(acks) for _ in range(5)] == [(seq, seq + 1) for seq in range(5)]
    assert floor.proc.poll() is None
    if floor.log.exists():
        assert record("LOCK-NEXT", 4) in floor.stored()
