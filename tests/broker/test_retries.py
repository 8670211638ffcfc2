"""Nack, retry levels (with a time scale), dead letters, replay, per-lock ordering."""

from __future__ import annotations

import json
import time

from lockmq.protocol import Role
from lockmq.testing import Peer, open_peer, wait_for

FAST = {"time_scale": 0.001, "retry_levels_s": [1, 5, 10, 30], "max_retries": 3}


def _publish(port: int, topic: str, items: list[tuple[str, int]]) -> None:
    peers: dict[str, Peer] = {}
    for sn, seq in items:
        p = peers.get(sn) or peers.setdefault(sn, open_peer(port, sn=sn, role=Role.LOCK))
        p.publish(topic, seq, f"{sn}/{seq}".encode())
    for p in peers.values():
        p.close()


def _pull_one(peer: Peer, sub: int, timeout: float = 10.0):
    return wait_for(lambda: peer.pull(sub, 1, wait_ms=200).messages, "a redelivered message",
                    timeout)[0]


def test_nack_retries_with_backoff_then_dead_letters(make_broker):
    broker = make_broker(consumers=FAST)
    _publish(broker.port, "jobs", [("L1", 1)])
    cons = open_peer(broker.port)
    sub = cons.subscribe("jobs", "w").sub_id
    deliveries = []
    for _ in range(4):                                 # 1 delivery + 3 retries
        m = _pull_one(cons, sub)
        assert m.message_id == "L1:1" and m.topic == "jobs"
        deliveries.append(m.delivery)
        cons.nack(sub, [m.lease], reason="handler failed")
    assert deliveries == [1, 2, 3, 4]
    # the 4th nack exceeds max_retries=3: dead-lettered, not redelivered
    assert cons.pull(sub, 10, wait_ms=300).messages == []
    [d] = wait_for(lambda: cons.admin("dlq.list", cluster="w")["messages"], "a dead letter")
    assert d["msg_id"] == "L1:1" and d["reason"] == "handler failed"
    assert d["deliveries"] == 4 and d["retries"] == 4 and d["topic"] == "jobs"
    assert bytes.fromhex(d["payload_hex"]) == b"L1/1"
    info = cons.admin("clusters", cluster="w")["clusters"][0]
    assert info["dlq_size"] == 1 and info["backlog"] == 0
    # replay: the message comes back to the cluster, fresh
    r = cons.admin("dlq.replay", cluster="w", offset=0)
    assert r["ok"] and r["replayed"] == 1
    m = _pull_one(cons, sub)
    assert m.message_id == "L1:1" and m.payload == b"L1/1"
    cons.ack(sub, [m.lease])


def test_retry_delay_follows_levels(make_broker, tmp_path):
    # a level an hour long: after the nack the message is scheduled, not ready, and a
    # pull finds nothing -- held until its due time, whatever the machine's speed
    held = make_broker(data_dir=str(tmp_path / "held"),
                       consumers={"retry_levels_s": [3600], "max_retries": 5})
    _publish(held.port, "slow", [("L2", 1)])
    cons = open_peer(held.port)
    sub = cons.subscribe("slow", "w").sub_id
    cons.nack(sub, [_pull_one(cons, sub).lease])
    assert cons.pull(sub, 10, wait_ms=300).messages == []
    (info,) = cons.admin("clusters", cluster="w")["clusters"]
    assert (info["retry_scheduled"], info["ready"], info["inflight"]) == (1, 0, 0)
    # levels in ms with time_scale 0.001 (300 s -> 300 ms): redelivered once due
    broker = make_broker(data_dir=str(tmp_path / "due"),
                         consumers={"time_scale": 0.001, "retry_levels_s": [300],
                                    "max_retries": 5})
    _publish(broker.port, "slow", [("L2", 1)])
    cons = open_peer(broker.port)
    sub = cons.subscribe("slow", "w").sub_id
    m = _pull_one(cons, sub)
    cons.nack(sub, [m.lease])
    m2 = _pull_one(cons, sub)
    assert m2.delivery == 2
    assert json.loads(m2.headers)["retries"] == 1
    cons.ack(sub, [m2.lease])


def test_retries_survive_a_restart(make_broker, tmp_path):
    data = str(tmp_path / "d")
    b1 = make_broker(data_dir=data, consumers={"time_scale": 0.001, "retry_levels_s": [2000],
                                               "max_retries": 5})
    _publish(b1.port, "r", [("L3", 1), ("L3", 2)])
    cons = open_peer(b1.port)
    sub = cons.subscribe("r", "w").sub_id
    got = cons.pull(sub, 10).messages
    assert len(got) == 2
    first = [m for m in got if m.seq == 1][0]
    cons.ack(sub, [m.lease for m in got if m.seq == 2])
    cons.nack(sub, [first.lease])                     # due in 2 s
    time.sleep(0.2)
    b1.stop()
    b2 = make_broker(data_dir=data, consumers={"time_scale": 0.001,
                                               "retry_levels_s": [2000], "max_retries": 5})
    cons2 = open_peer(b2.port)
    sub2 = cons2.subscribe("r", "w").sub_id
    m = _pull_one(cons2, sub2, timeout=15)
    assert m.message_id == "L3:1" and m.delivery == 2
    cons2.ack(sub2, [m.lease])
    assert cons2.pull(sub2, 10, wait_ms=200).messages == []   # seq 2 not redelivered


def test_per_lock_ordering_never_two_of_one_lock_in_flight(make_broker):
    broker = make_broker(consumers={"time_scale": 0.001, "retry_levels_s": [50]})
    items = [(sn, seq) for seq in range(10) for sn in ("A", "B", "C")]
    _publish(broker.port, "ord", items)
    m1, m2 = open_peer(broker.port), open_peer(broker.port)
    s1 = m1.subscribe("ord", "o", ordered=True).sub_id
    s2 = m2.subscribe("ord", "o", ordered=True).sub_id
    processed: dict[str, list[int]] = {"A": [], "B": [], "C": []}
    nacked_once = False
    for _ in range(400):
        g1 = m1.pull(s1, 10).messages
        g2 = m2.pull(s2, 10).messages
        inflight = [m.sn for m in g1 + g2]
        assert len(inflight) == len(set(inflight)), f"two of one lock in flight: {inflight}"
        for peer, sub, got in ((m1, s1, g1), (m2, s2, g2)):
            for m in got:
                if m.sn == "B" and m.seq == 3 and not nacked_once:
                    nacked_once = True                  # fail once: B must wait for it
                    peer.nack(sub, [m.lease])
                    continue
                processed[m.sn].append(m.seq)
                peer.ack(sub, [m.lease])
        if all(len(v) == 10 for v in processed.values()):
            break
        if not g1 and not g2:
            time.sleep(0.01)
    assert nacked_once
    assert processed == {sn: list(range(10)) for sn in "ABC"}


def test_retry_levels_keep_restart_redelivery_small(make_broker, tmp_path):
    """A long retry does not hold back the saved position of short ones: after a
    restart a finished short retry is not delivered again (one topic per level)."""
    data = str(tmp_path / "d")
    cfg = {"time_scale": 0.001, "retry_levels_s": [20, 2500], "max_retries": 5}
    b1 = make_broker(data_dir=data, consumers=cfg)
    _publish(b1.port, "lv", [("L5", 1), ("L5", 2)])
    cons = open_peer(b1.port)
    sub = cons.subscribe("lv", "w").sub_id
    got = {m.seq: m for m in cons.pull(sub, 10).messages}
    cons.nack(sub, [got[1].lease], delay_ms=2500)     # level 1: due in 2.5 s
    cons.nack(sub, [got[2].lease])                    # level 0: due in 20 ms
    again = _pull_one(cons, sub)
    assert again.seq == 2 and again.delivery == 2
    assert again.lease[0] >> 63 == 1                  # a retry-topic lease
    cons.ack(sub, [again.lease])
    time.sleep(0.3)                                   # positions saved (every 20 ms here)
    b1.stop()
    b2 = make_broker(data_dir=data, consumers=cfg)
    cons2 = open_peer(b2.port)
    sub2 = cons2.subscribe("lv", "w").sub_id
    m = _pull_one(cons2, sub2, timeout=15)
    assert (m.seq, m.delivery) == (1, 2)              # only the long retry comes back
    cons2.ack(sub2, [m.lease])
    assert cons2.pull(sub2, 10, wait_ms=300).messages == []
    info = cons2.admin("clusters", cluster="w")["clusters"][0]
    assert info["backlog"] == 0 and info["retry_scheduled"] == 0
