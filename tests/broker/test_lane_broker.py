"""A real broker with its compiled lane (issue #14): locks in their steady state are
read and acked by ``lockmq._core.Lane``, and everything else -- a heartbeat, a
command, a bad frame, a hang-up, a shutdown, a lock that does not read -- still goes
as the Python path answers it, nothing lost and nothing stored twice."""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any

import pytest

from lockmq.broker.lane import LANE_TYPE
from lockmq.protocol import (Command, CommandKind, ErrorCode, ErrorReply, Heartbeat, Op,
                             Publish, PublishAck, Role, decode_body)
from lockmq.protocol._crc import crc16
from lockmq.security import Permissions
from lockmq.protocol._frame import encode_frame
from lockmq.testing import BrokerThread, Peer, SecureBroker, drain, open_peer, wait_for

pytestmark = pytest.mark.skipif(LANE_TYPE is None, reason="lockmq._core not built")

SN = "LOCK-L1"
TOPIC = "door-events"


def _stat(broker: BrokerThread, name: str) -> int:
    return broker.call(lambda: broker.broker.stats.c[name])


def _in_lane(broker: BrokerThread) -> int:
    return broker.call(lambda: broker.broker.lane.adopted)


def _publish_frame(seq: int, opaque: int, topic: str = TOPIC) -> bytes:
    return encode_frame(Op.PUBLISH, SN, Publish(topic, seq, 1700000000000 + seq,
                                                b"r%06d" % seq).encode(), opaque)


def _steady_lock(broker: BrokerThread, sn: str = SN) -> Peer:
    """A lock that published until its connection joined the lane."""
    lock = open_peer(broker.port, sn=sn, role=Role.LOCK)
    joins = _stat(broker, "lane_joins")
    for seq in range(1, 4):
        assert lock.publish(TOPIC, seq).status == PublishAck.STORED
    wait_for(lambda: _stat(broker, "lane_joins") > joins, "the lock to join the lane")
    return lock


def _stored_seqs(broker: BrokerThread, n: int) -> list[int]:
    reader = open_peer(broker.port, sn="reader")
    sub = reader.subscribe(TOPIC, "check").sub_id
    seqs = [m.seq for m in drain(reader, sub, n)]
    reader.close()
    return seqs


def test_a_steady_lock_is_acked_in_order_and_stored_once(broker: BrokerThread) -> None:
    lock = _steady_lock(broker)
    assert _in_lane(broker) == 1
    offsets = [lock.publish(TOPIC, seq).offset for seq in range(4, 204)]   # one by one
    assert offsets == sorted(offsets) and len(set(offsets)) == 200
    # pipelined: 500 in one write, every ack in request order
    lock.raw(b"".join(_publish_frame(seq, 10_000 + seq) for seq in range(204, 704)))
    acks = [lock.read() for _ in range(500)]
    assert [(f.opcode, f.opaque) for f in acks] == \
        [(Op.PUBLISH_ACK, 10_000 + seq) for seq in range(204, 704)]
    assert {PublishAck.decode(f.body).status for f in acks} == {PublishAck.STORED}
    # a retry of an acked record is a duplicate, also in the lane
    lock.raw(_publish_frame(700, 99_999))
    ack = lock.read()
    assert ack.opaque == 99_999 and PublishAck.decode(ack.body).status == PublishAck.DUPLICATE
    assert _stored_seqs(broker, 703) == list(range(1, 704))
    assert _in_lane(broker) == 1 and _stat(broker, "lane_bails") == 0


def test_a_heartbeat_and_a_command_are_answered_and_the_lock_joins_again(
        broker: BrokerThread) -> None:
    lock = _steady_lock(broker)
    hb = lock.request(Op.HEARTBEAT, Heartbeat(int(time.time() * 1000), 5, 0, 0, 80,
                                              1000).encode())
    assert isinstance(hb, Heartbeat)
    assert _stat(broker, "lane_bails") == 1
    svc = open_peer(broker.port, sn="door-service")
    svc.send(Op.COMMAND, Command(SN, 42, 0, CommandKind.UNLOCK, b"\x00\x05").encode())
    cmd = lock.wait_unsolicited(Op.COMMAND)
    assert cmd.kind == CommandKind.UNLOCK and cmd.args == b"\x00\x05"
    joins = _stat(broker, "lane_joins")
    for seq in range(4, 10):
        assert lock.publish(TOPIC, seq).status == PublishAck.STORED
    wait_for(lambda: _stat(broker, "lane_joins") > joins, "the lock to join the lane again")
    assert _stored_seqs(broker, 9) == list(range(1, 10))


def _hold_next_commit(broker: BrokerThread) -> tuple[threading.Event, threading.Event]:
    """The broker store's next group commit waits, before it writes, until the test
    sets ``release`` (in-process fault injection: the store, its files and the sockets
    stay real). Returns (``started``: the commit waits now, ``release``)."""
    started, release = threading.Event(), threading.Event()

    def patch() -> None:
        writer = broker.broker.core.store._writer
        write = writer._write

        def held(plan: Any) -> None:
            writer._write = write   # (once)
            started.set()
            release.wait(10)
            write(plan)
        writer._write = held
    broker.call(patch)
    return started, release


def _writer_waits(broker: BrokerThread) -> None:
    """Until the broker store's writer thread waits for work (the last commit's answer
    reaches the loop before the writer goes round to wait)."""
    wait_for(lambda: broker.call(lambda: broker.broker.core.store.writer_waits),
             "the store's writer to wait for work")


def test_what_arrives_during_a_commit_is_read_as_its_answer_comes(
        broker: BrokerThread) -> None:
    lock = _steady_lock(broker)
    started, release = _hold_next_commit(broker)
    # the first write is read by the loop and starts a commit; the next ones come
    # while it runs and stay unread until its answer, when the loop reads them before
    # it sends its acks -- the heartbeat among them too: the socket goes back to Python
    beat = encode_frame(Op.HEARTBEAT, SN, Heartbeat(int(time.time() * 1000), 5, 0, 0, 80,
                                                    1000).encode(), 7)
    lock.raw(_publish_frame(4, 4))
    assert started.wait(10)
    lock.raw(_publish_frame(5, 5) + _publish_frame(6, 6))
    lock.raw(_publish_frame(7, 7) + beat + _publish_frame(8, 8))
    release.set()
    frames = [lock.read() for _ in range(6)]
    assert [(f.opcode, f.opaque) for f in frames if f.opcode == Op.PUBLISH_ACK] == \
        [(Op.PUBLISH_ACK, seq) for seq in range(4, 9)]
    assert [f.opaque for f in frames if f.opcode == Op.HEARTBEAT] == [7]
    assert _stat(broker, "lane_commit_reads") >= 1
    assert _stat(broker, "lane_bails") == 1
    assert _stored_seqs(broker, 8) == list(range(1, 9))


def test_a_stalled_commit_has_the_loop_watch_the_lane_again(broker: BrokerThread) -> None:
    lock = _steady_lock(broker)
    _writer_waits(broker)   # (so it takes the next batch before the hold stops it)
    with broker.broker.core.store.writes_held():   # (a disk that hangs)
        lock.raw(_publish_frame(4, 4))   # (taken by the writer before the hold)
        assert lock.read().opaque == 4
        # read by the loop, which waits for the commit's answer to read the lane again
        lock.raw(_publish_frame(5, 5))
        with pytest.raises(TimeoutError):
            lock.read(timeout=0.3)   # (held: not acked yet)
        hb = lock.request(Op.HEARTBEAT, Heartbeat(int(time.time() * 1000), 5, 0, 0, 80,
                                                  1000).encode())
        # answered while the writer still cannot write: the loop watched the lane again
        assert isinstance(hb, Heartbeat)
        assert _stat(broker, "lane_commit_stalls") == 1
    ack = lock.read()
    assert ack.opaque == 5 and PublishAck.decode(ack.body).status == PublishAck.STORED
    assert _stored_seqs(broker, 5) == [1, 2, 3, 4, 5]


def test_a_bad_frame_read_in_the_lane_gets_the_decoders_error(broker: BrokerThread) -> None:
    lock = _steady_lock(broker)
    bad = bytearray(_publish_frame(7, 7))
    bad[-1] ^= 0xFF
    lock.raw(_publish_frame(4, 4) + _publish_frame(5, 5) + _publish_frame(6, 6) + bytes(bad))
    # as on the Python path: the error at once, and the connection closed before the
    # three records' group commit could answer them (they are stored, not acked)
    [err] = lock.wait_closed()
    assert err.code == ErrorCode.BAD_CHECKSUM
    assert _stored_seqs(broker, 6) == list(range(1, 7))
    assert _stat(broker, "bad_frames") == 1


def test_a_lock_hanging_up_in_the_lane_goes_offline(broker: BrokerThread) -> None:
    lock = _steady_lock(broker)
    watch = open_peer(broker.port, sn="watch")
    assert watch.admin("devices")["count"] == 1
    lock.raw(_publish_frame(4, 4)[:20])   # half a frame, then gone
    lock.close()
    wait_for(lambda: watch.admin("devices")["count"] == 0, "the lock to go offline")
    assert _in_lane(broker) == 0
    assert _stored_seqs(broker, 3) == [1, 2, 3]


def test_a_lock_that_does_not_read_its_acks_gets_every_one_later(broker: BrokerThread) -> None:
    lock = _steady_lock(broker)
    lock.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

    def small_send_buffer() -> None:   # (the broker's end: so that it fills soon)
        [conn] = [c for c in broker.broker.conns.values() if c.claimed_sn == SN]
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET,
                                                            socket.SO_SNDBUF, 4096)
    broker.call(small_send_buffer)
    n = 5_000    # ~120 KB of acks: far more than the two 4 KB socket buffers (8 KB each in Linux) hold
    data = b"".join(_publish_frame(seq, seq) for seq in range(4, 4 + n))
    sender = threading.Thread(target=lock.raw, args=(data,))
    sender.start()
    # not reading: the broker's writes stop going through, and it stops reading too
    wait_for(lambda: _stat(broker, "lane_bails") > 0 or _stat(broker, "reads_paused") > 0,
             "the broker to find the lock's socket full")
    opaques = [lock.read().opaque for _ in range(n)]
    sender.join()
    assert opaques == list(range(4, 4 + n))
    assert _stat(broker, "publish_stored") >= n + 3


def test_shutdown_with_a_lock_in_the_lane_loses_no_acked_record(make_broker: Any,
                                                                tmp_path: Any) -> None:
    data_dir = str(tmp_path / "data")
    broker = make_broker(data_dir)
    lock = _steady_lock(broker)
    lock.raw(b"".join(_publish_frame(seq, seq) for seq in range(4, 2004)))
    wait_for(lambda: _stat(broker, "frames_in") >= 2000, "the records to be read")
    broker.stop()
    seen = lock.wait_closed()
    acked = [f.opaque for f in seen if getattr(f, "opcode", None) == Op.PUBLISH_ACK]
    assert acked == list(range(4, 4 + len(acked)))
    assert any(getattr(f, "opcode", None) == Op.DISCONNECT for f in seen)
    again = make_broker(data_dir)
    stored = _stored_seqs(again, 3 + len(acked))
    assert stored[:3 + len(acked)] == list(range(1, 4 + len(acked)))


def test_decode_body_of_a_lane_ack_is_a_publish_ack(broker: BrokerThread) -> None:
    """The lane's acks are the codec's frames (decoded by the public decoder)."""
    lock = _steady_lock(broker)
    lock.raw(_publish_frame(4, 77))
    f = lock.read()
    ack = decode_body(f.opcode, f.body)
    assert isinstance(ack, PublishAck) and ack.status == PublishAck.STORED and ack.offset > 0


def test_a_lock_in_the_lane_keeps_to_its_message_rate(tmp_path: Any) -> None:
    """The lane spends a credit taken from the lock's budget: past it, the records go
    to the Python path, which refuses them RATE_LIMITED as it always did."""
    rate, burst = 20.0, 50
    secure = SecureBroker(tmp_path, {"security": {"lock_message_rate": rate,
                                                  "lock_message_burst": burst}}, locks=[SN])
    try:
        broker = secure.start()
        lock = Peer(broker.port, SN)
        lock.auth_lock(secure.keys[SN])   # (device key, no frame MACs)
        topic = "lock.events"   # (a lock's own topics: security.lock_topics)
        # (the budget refills from its first use on, the wait for the join included:
        # on a loaded machine that wait alone is worth a record or two)
        t0 = time.monotonic()
        for seq in range(1, 4):
            assert lock.publish(topic, seq).status == PublishAck.STORED
        wait_for(lambda: broker.metrics()["lockmq_lane_joins_total"] >= 1,
                 "the lock to join the lane")
        n = 200
        lock.raw(b"".join(_publish_frame(seq, seq, topic) for seq in range(4, 4 + n)))
        stored = limited = 0
        for _ in range(n):
            f = lock.read()
            if f.opcode == Op.PUBLISH_ACK:
                stored += 1
            else:
                assert decode_body(f.opcode, f.body).code == ErrorCode.RATE_LIMITED
                limited += 1
        elapsed = time.monotonic() - t0
        assert stored + limited == n and limited > 0
        assert stored <= burst - 3 + rate * elapsed + 1
        lock.close()
    finally:
        secure.close()


def _sealed(lock: Peer, opcode: int, body: bytes) -> bytes:
    """One frame sealed by the lock's session (its next counter)."""
    return lock.session.seal(opcode, lock.sn, body, lock.next_opaque())


def _opened(lock: Peer, n: int | None = None) -> list[Any]:
    """The broker's next ``n`` frames (None: every frame until it closes), each opened
    by the lock's session in the order it came: a tag with another counter fails."""
    frames = []
    while n is None or len(frames) < n:
        f = lock.read()
        if f is None:
            assert n is None, frames
            break
        lock.session.receive(f)
        frames.append(f)
    return frames


def test_a_lock_with_frame_macs_is_read_and_acked_in_the_lane(tmp_path: Any) -> None:
    """A lock that seals its frames (the firmware's default on plain TCP) joins the
    lane as a plain one does: the lane checks each tag and seals each ack with the
    session's counters, and hands the counters back with the socket, so what the
    Python path sends next -- a heartbeat's answer, BAD_MAC -- carries the next ones."""
    secure = SecureBroker(tmp_path, locks=[SN],
                          tokens={"opener": Permissions(command=(SN,))})
    try:
        broker = secure.start()
        lock = Peer(broker.port, SN)
        lock.auth_lock(secure.keys[SN], mac=True)
        topic = "lock.events"
        sent = 0

        def publish_run(seqs: range) -> None:
            nonlocal sent
            lock.raw(b"".join(_sealed(lock, Op.PUBLISH, Publish(topic, s, 0, b"x" * 24)
                                      .encode()) for s in seqs))
            sent += len(seqs)
            got = _opened(lock, len(seqs))
            assert [(f.opcode, PublishAck.decode(f.body).status) for f in got] == \
                [(Op.PUBLISH_ACK, PublishAck.STORED)] * len(seqs)
            assert [f.opaque for f in got] == sorted(f.opaque for f in got)

        def metric(name: str) -> float:
            return broker.metrics()[f"lockmq_{name}_total"]

        for seq in range(1, 4):   # one by one: the Python path answers, then it joins
            publish_run(range(seq, seq + 1))
        wait_for(lambda: metric("lane_joins") == 1, "the sealed lock to join the lane")
        publish_run(range(4, 204))   # (within the lane's rate credit: LANE_CREDIT)
        assert metric("lane_bails") == 0 and metric("lane_joins") == 1   # (all the lane's)
        lock.raw(_sealed(lock, Op.HEARTBEAT, Heartbeat(0, 5).encode()))
        [beat] = _opened(lock, 1)
        assert beat.opcode == Op.HEARTBEAT and metric("lane_bails") == 1
        for seq in range(204, 207):
            publish_run(range(seq, seq + 1))
        wait_for(lambda: metric("lane_joins") == 2, "the lock to join the lane again")
        publish_run(range(207, 300))
        # a command for the lock while it is in the lane: sealed by the session's path
        # with the counter the lane hands back first, then the lane's acks go on
        svc = Peer(broker.port, "")
        svc.auth_token(secure.tok["opener"])
        svc.send(Op.COMMAND, Command(SN, 7, 0, CommandKind.UNLOCK, b"\x00\x05").encode())
        [cmd] = _opened(lock, 1)
        assert cmd.opcode == Op.COMMAND
        assert decode_body(cmd.opcode, cmd.body).args == b"\x00\x05"
        svc.close()
        for seq in range(300, 303):
            publish_run(range(seq, seq + 1))
        wait_for(lambda: metric("lane_joins") == 3, "the lock to join the lane once more")
        # an altered tag: the lane stops at it, the session's own path refuses it
        run = [_sealed(lock, Op.PUBLISH, Publish(topic, s, 0, b"x" * 24).encode())
               for s in range(303, 307)]
        bad = bytearray(run[3])
        bad[-5] ^= 1   # inside the tag
        body = bytes(bad[:-2])
        run[3] = body + crc16(body).to_bytes(2, "big")   # (the CRC made right again)
        lock.raw(b"".join(run))
        answers = _opened(lock)
        assert answers and answers[-1].opcode == Op.ERROR
        assert ErrorReply.decode(answers[-1].body).code == ErrorCode.BAD_MAC
        assert all(f.opcode == Op.PUBLISH_ACK for f in answers[:-1])
        wait_for(lambda: metric("publish_stored") == sent + 3,
                 "the three good records stored")
        lock.close()
    finally:
        secure.close()


def test_a_sealed_lock_that_leaves_the_lane_during_a_commit_gets_that_commit_s_acks_sealed_right(
        tmp_path: Any) -> None:
    """The commit's answer reads the lane first: a sealed lock's heartbeat among what
    arrived takes the socket back to Python, and the acks of the commit that was
    running are then Python's to seal -- with the counters the lane hands back, which
    must be the session's before those acks are sealed (a tag with a stale counter
    would make the lock drop its session)."""
    secure = SecureBroker(tmp_path, locks=[SN])   # (its registry; the broker in-process)
    try:
        broker = BrokerThread(str(secure.data), auth="required").start()
        lock = Peer(broker.port, SN)
        lock.auth_lock(secure.keys[SN], mac=True)
        topic = "lock.events"
        opaques: list[int] = []

        def sealed_publish(seq: int) -> bytes:
            opaques.append(lock.next_opaque())
            return lock.session.seal(Op.PUBLISH, lock.sn, Publish(topic, seq, 0, b"x" * 24)
                                     .encode(), opaques[-1])

        for seq in range(1, 4):   # one by one: the Python path answers, then it joins
            lock.raw(sealed_publish(seq))
            _opened(lock, 1)
        wait_for(lambda: _stat(broker, "lane_joins") == 1, "the sealed lock to join the lane")
        _writer_waits(broker)
        started, release = _hold_next_commit(broker)
        lock.raw(sealed_publish(4))   # read by the loop: its commit is held
        assert started.wait(10)
        lock.raw(sealed_publish(5) + _sealed(lock, Op.HEARTBEAT, Heartbeat(0, 5).encode())
                 + sealed_publish(6))
        # (in the lane's sockets before the commit answers: its epoll fd is readable)
        lane_fd = broker.broker.lane._lane.fileno()
        wait_for(lambda: select.select([lane_fd], [], [], 0)[0], "the lock's bytes to arrive")
        release.set()
        frames = _opened(lock, 4)   # each tag checked against the lock's own counter
        assert sorted(f.opcode for f in frames) == sorted([Op.PUBLISH_ACK] * 3 + [Op.HEARTBEAT])
        assert [f.opaque for f in frames if f.opcode == Op.PUBLISH_ACK] == opaques[3:]
        assert _stat(broker, "lane_bails") == 1
        lock.close()
        broker.stop()
    finally:
        secure.close()
