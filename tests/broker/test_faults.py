"""Bad input and back-pressure: malformed frames, identity, BUSY, memory bounds."""

from __future__ import annotations

import socket
import time

import pytest
from lockmq.protocol import (ErrorCode, Flag, Heartbeat, Op, Publish, PublishAck, Pull, Role,
                             decode_body, encode_frame)
from lockmq.testing import Peer, Refused, drain, open_peer, wait_for


def _closed_with(peer: Peer, code: int) -> None:
    f = peer.read_frame()
    assert f is not None and f.opcode == Op.ERROR, f
    assert decode_body(f.opcode, f.body).code == code
    assert peer.read_frame() is None          # then the broker closed the socket


@pytest.mark.parametrize("garbage,code", [
    (b"\x07" + b"\x00" * 20, ErrorCode.UNSUPPORTED_VERSION),
    (b"\x01\x7f\xff\xff\xff" + b"\x00" * 10, ErrorCode.FRAME_TOO_LARGE),
    (b"\x01\x00\x00\x00\x03" + b"\x00" * 10, ErrorCode.BAD_FRAME),
])
def test_malformed_frame_gets_error_and_close_others_unaffected(broker, garbage, code):
    good = open_peer(broker.port, sn="LOCK-G", role=Role.LOCK)
    bad = open_peer(broker.port, sn="LOCK-B", role=Role.LOCK)
    bad.raw(garbage)
    _closed_with(bad, code)
    assert good.publish("t", 1).status == PublishAck.STORED


def test_bad_checksum_and_bad_body_close_the_connection(broker):
    p = open_peer(broker.port, sn="LOCK-C", role=Role.LOCK)
    frame = bytearray(encode_frame(Op.PUBLISH, "LOCK-C", Publish("t", 1, 0, b"x").encode(), 9))
    frame[-1] ^= 0xFF
    p.raw(bytes(frame))
    _closed_with(p, ErrorCode.BAD_CHECKSUM)
    q = open_peer(broker.port, sn="LOCK-D", role=Role.LOCK)
    q.raw(encode_frame(Op.PUBLISH, "LOCK-D", b"\x05ab", 3))     # truncated PUBLISH body
    _closed_with(q, ErrorCode.BAD_BODY)


def test_split_and_sticky_frames_are_decoded(broker):
    p = open_peer(broker.port, sn="LOCK-S", role=Role.LOCK)
    data = b"".join(encode_frame(Op.PUBLISH, "LOCK-S", Publish("t", i, 0, b"y").encode(), 100 + i)
                    for i in range(50))
    for i in range(0, len(data), 7):            # 7-byte pieces
        p.raw(data[i:i + 7])
    for i in range(50):
        assert p.wait(100 + i).opcode == Op.PUBLISH_ACK


def test_unknown_opcode_is_refused_but_connection_kept(broker):
    p = open_peer(broker.port)
    p.raw(encode_frame(0x7777, "svc", b"", 5))
    f = p.read_frame()
    assert f.opcode == Op.ERROR and decode_body(f.opcode, f.body).code == ErrorCode.UNKNOWN_OPCODE
    assert p.admin("ping")["ok"]


def test_a_handler_bug_is_answered_internal_and_the_frames_after_it_are_served(
        broker, monkeypatch):
    def broken(conn, frame):
        raise RuntimeError("injected handler bug")

    monkeypatch.setitem(broker.broker.handlers, Op.HEARTBEAT, broken)
    p = open_peer(broker.port, sn="LOCK-I", role=Role.LOCK)
    # one read: the broken frame between two publishes
    hb = Heartbeat(0, 5, 0, 0, 80, 1000).encode()
    p.raw(b"".join([encode_frame(Op.PUBLISH, "LOCK-I", Publish("t", 1, 0, b"a").encode(), 7),
                    encode_frame(Op.HEARTBEAT, "LOCK-I", hb, 8),
                    encode_frame(Op.PUBLISH, "LOCK-I", Publish("t", 2, 0, b"b").encode(), 9)]))
    f = p.wait(8)
    assert f.opcode == Op.ERROR and decode_body(f.opcode, f.body).code == ErrorCode.INTERNAL
    assert p.wait(7).opcode == Op.PUBLISH_ACK and p.wait(9).opcode == Op.PUBLISH_ACK
    assert p.publish("t", 3).status == PublishAck.STORED


def test_request_before_handshake_is_refused(broker):
    p = Peer(broker.port, "svc")
    p.send(Op.PUBLISH, Publish("t", 1, 0, b"x").encode())
    _closed_with(p, ErrorCode.NOT_AUTHENTICATED)


def test_lock_frame_with_another_sn_is_refused(broker):
    p = open_peer(broker.port, sn="LOCK-1", role=Role.LOCK)
    p.send(Op.PUBLISH, Publish("t", 1, 0, b"x").encode(), sn="LOCK-2")
    _closed_with(p, ErrorCode.SN_MISMATCH)


def test_lock_may_not_publish_to_system_topics_or_consume(broker):
    p = open_peer(broker.port, sn="LOCK-1", role=Role.LOCK)
    with pytest.raises(Refused) as ei:
        p.publish("$devices", 1)
    assert ei.value.code == ErrorCode.FORBIDDEN
    with pytest.raises(Refused) as ei:
        p.subscribe("t", "c")
    assert ei.value.code == ErrorCode.FORBIDDEN
    assert p.publish("t", 2).status == PublishAck.STORED    # still connected


def test_full_disk_answers_busy_with_retry_after(make_broker):
    broker = make_broker(store={"min_free_bytes": 1 << 60})   # more than any disk
    p = open_peer(broker.port, sn="LOCK-F", role=Role.LOCK)
    for seq in range(3):
        with pytest.raises(Refused) as ei:
            p.publish("t", seq)
        assert ei.value.code == ErrorCode.STORAGE_FULL and ei.value.err.retry_after_ms > 0
    # a oneway publish that is refused gets no answer (SPEC) but is counted
    op = p.send(Op.PUBLISH, Publish("t", 9, 0, b"x").encode(), flags=Flag.ONEWAY)
    with pytest.raises(Refused):
        p.publish("t", 10)                     # answered after the oneway was handled
    assert op not in p.answers and not p.unsolicited
    stats = open_peer(broker.port).admin("stats")
    assert stats["ok"], stats
    assert stats["broker"]["publish_busy"] == 5 and stats["broker"]["publish_stored"] == 0
    assert stats["broker"]["publish_oneway_refused"] == 1


def test_store_queue_full_answers_busy_and_never_drops(make_broker):
    """A tiny store queue behind a stalled writer (as on a slow disk): pipelining
    producers get BUSY for some publishes, every publish is answered, every acked
    one is stored and no refused one is."""
    broker = make_broker(store={"max_pending_bytes": 4096})
    store = broker.broker.core.store
    n_conn, n_msg = 4, 400
    peers = [open_peer(broker.port, sn=f"LOCK-{i}", role=Role.LOCK) for i in range(n_conn)]
    sent: dict[str, list[tuple[int, int]]] = {p.sn: [] for p in peers}
    with store.writes_held():
        for start in range(0, n_msg, 10):           # 40 writes each: many store appends
            for p in peers:
                frames = []
                for seq in range(start, start + 10):
                    op = p.next_opaque()
                    sent[p.sn].append((op, seq))
                    frames.append(encode_frame(Op.PUBLISH, p.sn,
                                               Publish("q", seq, 0, b"z" * 200).encode(), op))
                p.raw(b"".join(frames))
        # the queue is full while the writer stalls: the broker answers BUSY at once
        admin = open_peer(broker.port)
        wait_for(lambda: admin.admin("stats")["broker"]["publish_busy"] >= n_conn * n_msg // 2,
                 "BUSY answers while the writer stalls")
    acked_ids: set[str] = set()
    busy = 0
    for p in peers:
        for op, seq in sent[p.sn]:
            opcode = p.wait(op).opcode              # every publish is answered
            assert opcode in (Op.PUBLISH_ACK, Op.ERROR)
            if opcode == Op.PUBLISH_ACK:
                acked_ids.add(f"{p.sn}:{seq}")
            else:
                busy += 1
    assert busy > 0 and busy + len(acked_ids) == n_conn * n_msg
    for p in peers:                                 # the writer runs again: stored again
        assert p.publish("q", n_msg, b"z").status == PublishAck.STORED
        acked_ids.add(f"{p.sn}:{n_msg}")
    c = open_peer(broker.port)
    sub = c.subscribe("q", "g").sub_id
    got = {m.message_id for m in drain(c, sub, len(acked_ids))}
    assert got == acked_ids                        # every acked one is stored
    assert c.pull(sub, 10).messages == []          # and no refused one


def test_peer_that_does_not_read_is_paused_not_buffered(make_broker):
    """A consumer sending PULLs without reading the (large) answers: once its unsent
    answers pass max_conn_buffer_bytes the broker stops reading it (TCP pushes back)
    instead of buffering without bound; when it reads again everything arrives."""
    broker = make_broker(broker={"max_conn_buffer_bytes": 64 * 1024})
    prod = open_peer(broker.port, sn="LOCK-BIG", role=Role.LOCK)
    n = 240
    for seq in range(n):
        prod.publish("big", seq, bytes([seq % 256]) * 100_000)    # 24 MB in all
    c = open_peer(broker.port)
    sub = c.subscribe("big", "g").sub_id
    c.sock.settimeout(2.0)
    ops = []
    try:
        for _ in range(n):
            ops.append(c.send(Op.PULL, Pull(sub, 1, 0).encode()))
    except (socket.timeout, TimeoutError):
        pass
    time.sleep(0.5)                                # the broker fills the socket
    stats = open_peer(broker.port).admin("stats")["broker"]
    assert stats["reads_paused"] >= 1
    c.sock.settimeout(20)
    got = 0
    for op in ops:
        f = c.wait(op, timeout=20)
        got += len(decode_body(f.opcode, f.body).messages)
    assert got == len(ops)
