"""Requests pipelined behind AUTH (SPEC 2, "Pipelined requests"): a lock may send its
first publishes in the AUTH's write, before the CONNECT_ACK; the broker reads them
after the AUTH, answers them after the CONNECT_ACK, and stores them once. (With a
wrong key and with frame MACs: tests/security/test_e2e.py.)"""

from __future__ import annotations

from lockmq.protocol import AuthMethod, ErrorCode, Flag, Op, Publish, PublishAck, Role, decode_body
from lockmq.testing import Peer, open_peer


def _events(topic: str, seqs: range) -> list[tuple[int, bytes]]:
    return [(Op.PUBLISH, Publish(topic, s, 0, b"e" * 24).encode()) for s in seqs]


def _queue_end(port: int, topic: str) -> int:
    topics = {t["topic"]: t for t in open_peer(port).admin("topics")["topics"]}
    return topics[topic]["queue_end"] if topic in topics else 0


def test_publishes_in_the_auth_write_are_stored_and_answered_after_connect_ack(broker):
    lock = Peer(broker.port, sn="LOCK-P1")
    try:
        ack = lock.auth_lock(b"\x00" * 32, early=_events("early", range(1, 4)))
        assert ack.last_seq == 0xFFFFFFFF      # nothing stored when CONNECT_ACK was made
        answers = [decode_body(Op.PUBLISH_ACK, lock.answer_frame(o).body)
                   for o in lock.early_opaques]
        assert [a.status for a in answers] == [PublishAck.STORED] * 3
        assert len({a.offset for a in answers}) == 3
        # the session goes on as usual after them
        assert lock.publish("early", 4).status == PublishAck.STORED
    finally:
        lock.close()
    assert _queue_end(broker.port, "early") == 4

    # sent again on a new session (the lock did not see the acks): stored once
    again = Peer(broker.port, sn="LOCK-P1")
    try:
        ack = again.auth_lock(b"\x00" * 32, early=_events("early", range(1, 3)))
        assert ack.last_seq == 4
        assert [decode_body(Op.PUBLISH_ACK, again.answer_frame(o).body).status
                for o in again.early_opaques] == [PublishAck.DUPLICATE] * 2
    finally:
        again.close()
    assert _queue_end(broker.port, "early") == 4


def test_a_pipelined_request_the_lock_may_not_send_is_refused_after_connect_ack(broker):
    """The rules of the established session apply to pipelined requests: a lock's
    SUBSCRIBE is FORBIDDEN (not fatal), the publish behind it is still stored."""
    lock = Peer(broker.port, sn="LOCK-P2")
    try:
        early = [(Op.SUBSCRIBE, b"\x00"), *_events("early2", range(1, 2))]
        lock.auth_lock(b"\x00" * 32, early=early)
        refused, publish = lock.early_opaques
        f = lock.answer_frame(publish)
        assert decode_body(f.opcode, f.body).status == PublishAck.STORED
        err = lock.answers.pop(refused)
        assert err.opcode == Op.ERROR
        assert decode_body(err.opcode, err.body).code == ErrorCode.FORBIDDEN
    finally:
        lock.close()


def test_a_service_may_pipeline_too(broker):
    svc = Peer(broker.port, sn="svc-early")
    try:
        svc.handshake(Role.SERVICE, AuthMethod.TOKEN, b"x", early=_events("early3", range(1, 3)))
        assert [decode_body(Op.PUBLISH_ACK, svc.answer_frame(o).body).status
                for o in svc.early_opaques] == [PublishAck.STORED] * 2
    finally:
        svc.close()


def test_the_connect_ack_comes_in_one_write_with_the_pipelined_acks(broker):
    """The broker holds the CONNECT_ACK until the pipelined publishes are stored: one
    write for both (a send and a wake-up fewer per lock in a storm)."""
    lock = Peer(broker.port, sn="LOCK-P4")
    try:
        lock.auth_lock(b"\x00" * 32, early=_events("early4", range(1, 2)))
        # the publish's ack came in the CONNECT_ACK's read: the decoder holds it
        # (written apart, it would come ~an fdatasync later, in a read of its own)
        assert lock.dec.buffered() > 0
        f = lock.answer_frame(lock.early_opaques[0])
        assert decode_body(f.opcode, f.body).status == PublishAck.STORED
    finally:
        lock.close()


def test_pipelined_oneway_publishes_do_not_hold_the_connect_ack(broker):
    """ONEWAY publishes have no ack to carry the held CONNECT_ACK: it is sent once they
    are stored (a broker waiting for an ack would leave the lock unconnected)."""
    lock = Peer(broker.port, sn="LOCK-P5")
    try:
        early = [(op, body, Flag.ONEWAY) for op, body in _events("early5", range(1, 3))]
        lock.auth_lock(b"\x00" * 32, early=early)
        assert lock.publish("early5", 3).status == PublishAck.STORED
    finally:
        lock.close()
    assert _queue_end(broker.port, "early5") == 3
