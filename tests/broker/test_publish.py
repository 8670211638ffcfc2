"""Producers over real TCP: sync, pipelined (async) and oneway sends; duplicates."""

from __future__ import annotations

import asyncio

from lockmq.protocol import Flag, Op, Publish, PublishAck, Role, decode_body
from lockmq.testing import Peer, drain, open_async_peer, open_peer, wait_for_async


def test_sync_publish_then_consume_and_ack(broker):
    prod = open_peer(broker.port, sn="LOCK-1")
    offsets = []
    for seq in range(5):
        ack = prod.publish("locks", seq, f"rec{seq}".encode())
        assert ack.status == PublishAck.STORED
        offsets.append(ack.offset)                 # commit-log positions
    assert offsets == sorted(set(offsets))
    cons = open_peer(broker.port, sn="svc-a")
    sub = cons.subscribe("locks", "backend")
    assert sub.backlog == 5
    msgs = drain(cons, sub.sub_id, 5)
    assert [m.payload for m in msgs] == [f"rec{i}".encode() for i in range(5)]
    assert all(m.sn == "LOCK-1" and m.topic == "locks" and m.delivery == 1 for m in msgs)
    info = cons.admin("clusters", cluster="backend")["clusters"][0]
    assert info["backlog"] == 0 and info["inflight"] == 0


def test_pipelined_publish_acks_match_opaque(broker):
    prod = open_peer(broker.port, sn="LOCK-2")
    n = 500
    ops = {}
    data = b"".join(
        _frame(prod, Publish("locks", seq, 0, b"x" * 24), ops, seq) for seq in range(n))
    prod.raw(data)                      # all in flight at once
    offsets = set()
    for op, seq in ops.items():
        f = prod.wait(op)
        assert f.opcode == Op.PUBLISH_ACK
        offsets.add(decode_body(f.opcode, f.body).offset)
    assert len(offsets) == n                      # n distinct commit-log positions


def _frame(peer: Peer, pub: Publish, ops: dict, seq: int) -> bytes:
    from lockmq.protocol import encode_frame
    op = peer.next_opaque()
    ops[op] = seq
    return encode_frame(Op.PUBLISH, peer.sn, pub.encode(), op)


def test_oneway_publish_is_stored_without_answer(broker):
    prod = open_peer(broker.port, sn="LOCK-3")
    for seq in range(20):
        prod.send(Op.PUBLISH, Publish("oneway", seq, 0, b"o").encode(), flags=Flag.ONEWAY)
    # a sync publish after them is answered; the oneways before it got no answer
    prod.publish("oneway", 20)
    assert not prod.answers and not prod.unsolicited
    topics = {t["topic"]: t for t in open_peer(broker.port).admin("topics")["topics"]}
    assert topics["oneway"]["queue_end"] == 21


def test_retransmit_is_acked_again_but_stored_once(broker):
    prod = open_peer(broker.port, sn="LOCK-4")
    assert prod.publish("locks", 7, b"a").status == PublishAck.STORED
    again = prod.publish("locks", 7, b"a")
    assert again.status == PublishAck.DUPLICATE
    # a new connection of the same lock (after a lost ack) too
    prod2 = open_peer(broker.port, sn="LOCK-4")
    assert prod2.publish("locks", 7, b"a").status == PublishAck.DUPLICATE
    topics = {t["topic"]: t for t in prod2.admin("topics")["topics"]}
    assert topics["locks"]["queue_end"] == 1


def test_connection_burst_every_lock_acked(broker):
    """500 locks connect at once (the building after a power cut), each publishes
    one record: every one is acknowledged and all are online together."""
    async def lock(i: int, ready: asyncio.Event, acked: list) -> None:
        peer = await open_async_peer(broker.port, f"STORM-{i:04d}", Role.LOCK, timeout=30)
        assert (await peer.publish("storm", 0)).status == PublishAck.STORED
        acked.append(peer.sn)
        await ready.wait()
        await peer.close()

    async def main() -> int:
        ready = asyncio.Event()
        acked: list = []
        tasks = [asyncio.ensure_future(lock(i, ready, acked)) for i in range(500)]
        await wait_for_async(lambda: len(acked) == 500 or any(t.done() and t.exception()
                                                              for t in tasks), "500 acks", 60)
        online = open_peer(broker.port).admin("devices")["count"]
        ready.set()
        await asyncio.gather(*tasks)
        assert len(acked) == 500
        return online

    assert asyncio.run(main()) == 500
