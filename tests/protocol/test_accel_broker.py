"""The broker's read path with the compiled scanner and with the pure-Python one.

One read carrying publishes, a ONEWAY publish, a heartbeat, a duplicate, a refused
topic, another producer's SN and finally a broken PUBLISH body must get the same
answers, in the same order, whichever path decodes it (``impl``); the compiled one is
skipped, with the reason, when ``lockmq._core`` was not built.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from lockmq.broker import connection, intake
from lockmq.protocol import ErrorCode, Flag, Op, Publish, PublishAck, Role, \
    decode_body, encode_frame
from lockmq.protocol import batch as py_batch
from lockmq.testing import FAST_TIMERS, BrokerThread, Peer, SecureBroker, merge_tables, open_peer

from .helpers import NOT_BUILT, SPEEDUPS



@pytest.fixture(params=["pure", pytest.param("compiled", marks=NOT_BUILT),
                        pytest.param("scanner+pure-queue", marks=NOT_BUILT)])
def broker(request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[BrokerThread]:
    if request.param != "pure":
        monkeypatch.setattr(connection, "_scan_publishes", SPEEDUPS.scan_publishes)
        monkeypatch.setattr(intake, "_publish_acks", SPEEDUPS.publish_acks)
        monkeypatch.setattr(connection, "_scan_frame", SPEEDUPS.scan_frame)
        monkeypatch.setattr(connection, "SCAN_LIMIT", 3)   # a read takes several scans
        # the runs of scanned publishes queued in C, or by their pure twins
        pure_queue = request.param == "scanner+pure-queue"
        monkeypatch.setattr(intake, "_queue_run",
                            py_batch.queue_run if pure_queue else SPEEDUPS.queue_run)
    else:   # the broker's own pure path: no scanner, the Python ack packer
        monkeypatch.setattr(connection, "_scan_publishes", None)
        monkeypatch.setattr(connection, "_scan_frame", None)
        monkeypatch.setattr(intake, "_publish_acks", py_batch.publish_acks)
    # small store batches: a read's publishes cross several of them
    b = BrokerThread(str(tmp_path / "data"),
                     **merge_tables(FAST_TIMERS, {"broker": {"max_publish_batch": 3}})).start()
    try:
        yield b
    finally:
        b.stop()


def _pub(sn: str, opaque: int, seq: int, topic: str = "locks", flags: int = 0) -> bytes:
    return encode_frame(Op.PUBLISH, sn, Publish(topic, seq, 1000, b"e" * 24).encode(), opaque,
                        flags)


def _answers(peer: Any, n: int) -> list[tuple]:
    """The next ``n`` frames: (opaque, ack status) for acks, (opaque, opcode) else."""
    out = []
    for _ in range(n):
        f = peer.read(timeout=10)
        assert f is not None, f"closed after {out}"
        body = decode_body(f.opcode, f.body)
        out.append((f.opaque, body.status if f.opcode == Op.PUBLISH_ACK else
                    (f.opcode, getattr(body, "code", None))))
    return out


def test_one_mixed_read_gets_the_same_answers(broker: BrokerThread) -> None:
    lock = open_peer(broker.port, sn="LK-1", role=Role.LOCK)
    read = b"".join(_pub("LK-1", op, op) for op in range(1, 6))
    read += _pub("", 6, 6, flags=Flag.ONEWAY)                       # counted, no answer
    read += encode_frame(Op.HEARTBEAT, "LK-1", b"", 7)
    read += _pub("LK-1", 8, 8) + _pub("LK-1", 9, 1)                  # 9: a duplicate
    read += _pub("LK-1", 10, 10, topic="bad topic")                  # refused, link kept
    lock.raw(read)
    got = _answers(lock, 9)
    # acks keep the order of the requests; the others are answered at once
    assert [a for a in got if a[0] not in (7, 10)] == [
        (1, PublishAck.STORED), (2, PublishAck.STORED), (3, PublishAck.STORED),
        (4, PublishAck.STORED), (5, PublishAck.STORED), (8, PublishAck.STORED),
        (9, PublishAck.DUPLICATE)]
    assert (7, (Op.HEARTBEAT, None)) in got
    assert (10, (Op.ERROR, ErrorCode.INVALID_ARGUMENT)) in got
    lock.raw(_pub("LK-1", 11, 11) + encode_frame(Op.PUBLISH, "LK-1", b"\x09abc", 12)
             + _pub("LK-1", 13, 13))                                # a broken body: fatal
    assert [getattr(f, "code", None) for f in lock.wait_closed(timeout=10)] == \
        [ErrorCode.BAD_BODY]
    topics = {t["topic"]: t for t in open_peer(broker.port).admin("topics")["topics"]}
    assert topics["locks"]["queue_end"] in (7, 8)   # seq 1-6 and 8 (11: stored or not)


def test_another_sn_is_the_sessions_call(broker: BrokerThread) -> None:
    lock = open_peer(broker.port, sn="LK-2", role=Role.LOCK)
    lock.raw(_pub("LK-2", 1, 1))
    assert _answers(lock, 1) == [(1, PublishAck.STORED)]
    lock.raw(_pub("LK-2", 2, 2) + _pub("LK-3", 3, 3) + _pub("LK-2", 4, 4))
    assert [getattr(f, "code", None) for f in lock.wait_closed(timeout=10)] == \
        [ErrorCode.SN_MISMATCH]


def test_batches_cut_between_oneway_and_refused_publishes(broker: BrokerThread) -> None:
    lock = open_peer(broker.port, sn="LK-4", role=Role.LOCK)
    flags = [0, Flag.ONEWAY, 0, 0, Flag.ONEWAY, 0, 0, 0, Flag.ONEWAY, 0, 0]
    read = b"".join(_pub("LK-4", i + 1, i + 1, topic="bad topic" if i == 6 else "t4",
                         flags=f) for i, f in enumerate(flags))
    lock.raw(read)
    got = _answers(lock, 8)
    assert (7, (Op.ERROR, ErrorCode.INVALID_ARGUMENT)) in got
    assert [a for a in got if a[0] != 7] == [(op, PublishAck.STORED)
                                            for op in (1, 3, 4, 6, 8, 10, 11)]
    topics = {t["topic"]: t for t in open_peer(broker.port).admin("topics")["topics"]}
    assert topics["t4"]["queue_end"] == 10   # every publish but the refused one


def test_a_run_to_a_refused_topic_is_refused_record_by_record(broker: BrokerThread) -> None:
    # the guard grants a run of one topic in one step (publish_quota); a topic it
    # refuses gets each of its records refused, between records that are stored
    lock = open_peer(broker.port, sn="LK-5", role=Role.LOCK)
    topics = ["t5", "$sys.x", "$sys.x", "$sys.x", "t5", "t5", "$sys.x", "t5"]
    lock.raw(b"".join(_pub("LK-5", i + 1, i + 1, topic=t) for i, t in enumerate(topics)))
    got = dict(_answers(lock, len(topics)))
    assert got == {i + 1: PublishAck.STORED if t == "t5" else (Op.ERROR, ErrorCode.FORBIDDEN)
                   for i, t in enumerate(topics)}
    topics_now = {t["topic"]: t for t in open_peer(broker.port).admin("topics")["topics"]}
    assert topics_now["t5"]["queue_end"] == 4 and "$sys.x" not in topics_now


def test_a_rate_limited_lock_gets_exactly_its_burst_stored(tmp_path: Path) -> None:
    # auth required (a real broker process, on the path LOCKMQ_PURE_PYTHON picks; no
    # frame MACs, so the compiled path takes the read's publishes as one run): a run of publishes in one read is checked once against the lock's rate,
    # and exactly the records over it are refused, in order
    env = SecureBroker(tmp_path, {"security": {"lock_message_rate": 0.01,
                                               "lock_message_burst": 5}}, locks=["LK-R"])
    try:
        broker = env.start()
        lock = Peer(broker.port, "LK-R")
        lock.auth_lock(env.keys["LK-R"])
        lock.raw(b"".join(_pub("LK-R", i, i, topic="lock.events") for i in range(1, 13)))
        got = _answers(lock, 12)   # (refusals at once, acks after the fdatasync)
        assert sorted(got) == [(i, PublishAck.STORED) for i in range(1, 6)] + \
            [(i, (Op.ERROR, ErrorCode.RATE_LIMITED)) for i in range(6, 13)]
        lock.raw(_pub("LK-R", 13, 13, topic="lock.events"))           # the link stays
        assert _answers(lock, 1) == [(13, (Op.ERROR, ErrorCode.RATE_LIMITED))]
        lock.close()
        m = broker.metrics()
        assert m['lockmq_security_rate_limited_total{reason="lock_message_rate"}'] == 8
    finally:
        env.close()
