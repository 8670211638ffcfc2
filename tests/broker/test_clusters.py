"""Consumer clusters over real TCP: competing members, leases, redelivery, fan-out."""

from __future__ import annotations

import threading

import pytest
from lockmq.protocol import ErrorCode, Op, Pull, Role, Unsubscribe, decode_body
from lockmq.testing import Refused, drain, open_peer


def _publish(port: int, topic: str, n: int, sn: str = "LOCK-P", start: int = 0) -> None:
    p = open_peer(port, sn=sn, role=Role.LOCK)
    for seq in range(start, start + n):
        p.publish(topic, seq, f"{sn}/{seq}".encode())
    p.close()


def test_members_compete_and_every_message_is_processed_once(broker):
    _publish(broker.port, "ev", 300)
    members = [open_peer(broker.port, sn=f"svc{i}") for i in range(3)]
    subs = [m.subscribe("ev", "workers").sub_id for m in members]
    # each member pulls small batches in turn until the topic is drained
    seen: list[str] = []
    per_member = [0, 0, 0]
    for _ in range(200):
        progressed = False
        for i, (m, s) in enumerate(zip(members, subs)):
            got = m.pull(s, 10).messages
            if got:
                progressed = True
                m.ack(s, [x.lease for x in got])
                seen.extend(x.message_id for x in got)
                per_member[i] += len(got)
        if not progressed:
            break
    assert sorted(seen) == sorted(f"LOCK-P:{i}" for i in range(300))
    assert len(set(seen)) == 300
    assert all(n > 0 for n in per_member)


def test_idle_member_is_notified_when_messages_arrive(broker):
    cons = open_peer(broker.port)
    sub = cons.subscribe("late", "c1").sub_id
    assert cons.pull(sub, 10).messages == []          # idle now
    _publish(broker.port, "late", 3)
    note = cons.wait_unsolicited(Op.NOTIFY)
    assert note.sub_id == sub and note.available >= 1
    assert len(drain(cons, sub, 3)) == 3


def test_long_poll_pull_is_answered_when_a_message_arrives(broker):
    cons = open_peer(broker.port)
    sub = cons.subscribe("lp", "c1").sub_id
    op = cons.send(Op.PULL, Pull(sub, 10, 5000).encode())
    _publish(broker.port, "lp", 1)
    f = cons.wait(op)
    msgs = decode_body(f.opcode, f.body).messages
    assert len(msgs) == 1


def test_several_clusters_each_get_every_message(broker):
    _publish(broker.port, "fan", 50)
    a, b = open_peer(broker.port), open_peer(broker.port)
    sa = a.subscribe("fan", "analytics").sub_id
    sb = b.subscribe("fan", "alarms").sub_id
    assert len({m.message_id for m in drain(a, sa, 50)}) == 50
    assert len({m.message_id for m in drain(b, sb, 50)}) == 50


def test_consumer_killed_holding_leases_releases_them_at_once(make_broker):
    # a long visibility timeout: only the release on disconnect can redeliver in time
    broker = make_broker(consumers={"visibility_timeout_ms": 600_000})
    _publish(broker.port, "k", 20)
    victim = open_peer(broker.port)
    sv = victim.subscribe("k", "grp").sub_id
    held = victim.pull(sv, 15).messages
    assert len(held) == 15
    survivor = open_peer(broker.port)
    ss = survivor.subscribe("k", "grp").sub_id
    victim.sock.close()                       # killed: no ack, no unsubscribe
    got = drain(survivor, ss, 20)
    assert {m.message_id for m in got} == {f"LOCK-P:{i}" for i in range(20)}
    redelivered = [m for m in got if m.delivery == 2]
    assert len(redelivered) == 15


def test_unacked_message_is_redelivered_after_visibility_timeout(make_broker):
    broker = make_broker(consumers={"visibility_timeout_ms": 200})
    _publish(broker.port, "vt", 1)
    cons = open_peer(broker.port)
    sub = cons.subscribe("vt", "g").sub_id
    first = cons.pull(sub, 10).messages
    assert len(first) == 1 and first[0].delivery == 1
    again = []
    for _ in range(100):
        again = cons.pull(sub, 10, wait_ms=1000).messages
        if again:
            break
    assert again and again[0].message_id == first[0].message_id and again[0].delivery == 2
    # the old lease is gone: acking it is a clear error
    with pytest.raises(Refused) as ei:
        cons.ack(sub, [first[0].lease])
    assert ei.value.code == ErrorCode.UNKNOWN_LEASE
    cons.ack(sub, [again[0].lease])


def test_ack_of_unknown_lease_is_an_error(broker):
    cons = open_peer(broker.port)
    sub = cons.subscribe("x", "g").sub_id
    with pytest.raises(Refused) as ei:
        cons.ack(sub, [(12345, 1)])
    assert ei.value.code == ErrorCode.UNKNOWN_LEASE
    with pytest.raises(Refused) as ei:
        cons.ack(999, [(1, 1)])
    assert ei.value.code == ErrorCode.UNKNOWN_SUBSCRIPTION


def test_member_and_cluster_caps_are_enforced_and_visible(make_broker):
    broker = make_broker(consumers={"max_inflight_per_member": 5,
                                    "max_inflight_per_cluster": 8})
    _publish(broker.port, "cap", 30)
    a, b = open_peer(broker.port), open_peer(broker.port)
    sa = a.subscribe("cap", "g").sub_id
    sb = b.subscribe("cap", "g").sub_id
    ga = a.pull(sa, 100).messages
    assert len(ga) == 5                                   # member cap
    assert a.pull(sa, 100).messages == []
    gb = b.pull(sb, 100).messages
    assert len(gb) == 3                                   # cluster cap: 8 in flight
    st = a.admin("stats")["clusters"]["g"]
    assert st["member_cap_hits"] >= 1 and st["cluster_cap_hits"] >= 1
    a.ack(sa, [m.lease for m in ga])
    got = len(ga) + len(gb)
    b.ack(sb, [m.lease for m in gb])
    got += len(drain(a, sa, 30 - got))
    assert got == 30


def test_members_join_and_leave_mid_stream(broker):
    total = 400
    t = threading.Thread(target=_publish, args=(broker.port, "churn", total))
    t.start()
    seen: set[str] = set()
    for round_ in range(6):
        m = open_peer(broker.port, sn=f"m{round_}")
        s = m.subscribe("churn", "g").sub_id
        for _ in range(3):
            got = m.pull(s, 25, wait_ms=300).messages
            if got:
                m.ack(s, [x.lease for x in got])
                seen.update(x.message_id for x in got)
        if round_ % 2:
            m.request(Op.UNSUBSCRIBE, Unsubscribe(s).encode())
        m.close()
    t.join(30)
    last = open_peer(broker.port)
    s = last.subscribe("churn", "g").sub_id
    seen.update(x.message_id for x in drain(last, s, total - len(seen)))
    assert seen == {f"LOCK-P:{i}" for i in range(total)}


def test_many_producers_and_consumers_concurrently(broker):
    """8 locks pipelining while 4 members consume at the same time: every message
    arrives, none twice (nothing failed, so nothing is redelivered)."""
    from lockmq.protocol import Publish, encode_frame

    n_locks, per_lock = 8, 250
    done = threading.Event()
    seen: list[str] = []
    lock = threading.Lock()

    def producer(i: int) -> None:
        p = open_peer(broker.port, sn=f"L{i}", role=Role.LOCK)
        for start in range(0, per_lock, 25):
            ops = []
            frames = []
            for seq in range(start, start + 25):
                op = p.next_opaque()
                ops.append(op)
                frames.append(encode_frame(Op.PUBLISH, p.sn, Publish("mix", seq, 0, b"m").encode(), op))
            p.raw(b"".join(frames))
            for op in ops:
                assert p.wait(op).opcode == Op.PUBLISH_ACK
        p.close()

    def consumer(i: int) -> None:
        c = open_peer(broker.port, sn=f"c{i}")
        sub = c.subscribe("mix", "g").sub_id
        while not done.is_set():
            got = c.pull(sub, 50, wait_ms=100).messages
            if got:
                c.ack(sub, [m.lease for m in got])
                with lock:
                    seen.extend(m.message_id for m in got)
                    if len(seen) >= n_locks * per_lock:
                        done.set()
        c.close()

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(n_locks)]
    threads += [threading.Thread(target=consumer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    done.wait(60)
    done.set()
    for t in threads:
        t.join(30)
    assert len(seen) == n_locks * per_lock
    assert set(seen) == {f"L{i}:{s}" for i in range(n_locks) for s in range(per_lock)}


def test_window_cap_holds_reading_behind_the_oldest_unfinished_message(make_broker):
    broker = make_broker(consumers={"max_window": 10, "visibility_timeout_ms": 600_000})
    _publish(broker.port, "win", 30)
    c = open_peer(broker.port)
    sub = c.subscribe("win", "g").sub_id
    first = c.pull(sub, 1).messages             # offset 0 stays leased
    rest = []
    for _ in range(5):
        got = c.pull(sub, 100).messages
        c.ack(sub, [m.lease for m in got])
        rest += got
    assert len(rest) == 9                       # offsets 1..9: window of 10 reached
    info = c.admin("clusters", cluster="g")["clusters"][0]
    assert info["cluster_capped"] and info["stats"]["cluster_cap_hits"] >= 1
    c.ack(sub, [first[0].lease])                # the oldest finished: reading goes on
    more = drain(c, sub, 20)
    assert len(more) == 20


def test_reset_replays_or_skips(broker):
    _publish(broker.port, "rs", 10)
    c = open_peer(broker.port)
    sub = c.subscribe("rs", "g").sub_id
    assert len(drain(c, sub, 10)) == 10
    r = c.admin("clusters.reset", cluster="g", to="earliest")
    assert r["ok"] is False and "members" in r["message"]        # a member is connected
    c.request(Op.UNSUBSCRIBE, Unsubscribe(sub).encode())
    r = c.admin("clusters.reset", cluster="g", to=4)
    assert r["ok"] and (r["before"], r["after"]) == (10, 4)
    sub = c.subscribe("rs", "g").sub_id
    assert [m.seq for m in drain(c, sub, 6)] == [4, 5, 6, 7, 8, 9]
    c.request(Op.UNSUBSCRIBE, Unsubscribe(sub).encode())
    _publish(broker.port, "rs", 5, start=10)
    assert c.admin("clusters.reset", cluster="g", to="latest")["after"] == 15
    sub = c.subscribe("rs", "g").sub_id
    assert c.pull(sub, 10).messages == []                        # the backlog was skipped
