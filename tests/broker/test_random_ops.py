"""Random interleavings of pull / ack / nack / member crash over real TCP.

Invariants: every message ends acked exactly once or dead-lettered; a message is
never delivered again after its ack; nothing is lost.
"""

from __future__ import annotations

import random
import re
import time

import pytest
from lockmq.protocol import ErrorCode, Role
from lockmq.testing import Peer, Refused, open_peer


def _apply(call, sub: int, msgs: list) -> set:
    """ACK/NACK ``msgs``; returns the leases the broker refused (expired meanwhile on
    a slow machine) -- the others were applied."""
    try:
        call(sub, [m.lease for m in msgs])
    except Refused as exc:
        assert exc.code == ErrorCode.UNKNOWN_LEASE
        return {(int(q), int(d)) for q, d in re.findall(r"\((\d+),(\d+)\)", exc.err.message)}
    return set()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_member_behaviour_keeps_the_invariants(make_broker, seed):
    rng = random.Random(seed)
    broker = make_broker(consumers={"time_scale": 0.001, "retry_levels_s": [5, 20],
                                    "max_retries": 2, "visibility_timeout_ms": 300})
    n = 150
    prod = open_peer(broker.port, sn="R", role=Role.LOCK)
    for seq in range(n):
        prod.publish("rnd", seq, str(seq).encode())
    ordered = seed == 3                               # one run with per-lock ordering

    def join(i: int) -> tuple[Peer, int]:
        p = open_peer(broker.port, sn=f"m{i}")
        return p, p.subscribe("rnd", "g", ordered=ordered).sub_id

    members = [join(i) for i in range(3)]
    acked: dict[str, int] = {}
    next_id = 3
    deadline = time.monotonic() + 60
    steps = 0
    while time.monotonic() < deadline and steps < 3000:
        steps += 1
        k = rng.randrange(len(members))
        peer, sub = members[k]
        got = peer.pull(sub, rng.randint(1, 20), wait_ms=20).messages
        for m in got:
            assert m.message_id not in acked, f"{m.message_id} delivered after its ack"
        roll = rng.random()
        if roll < 0.05:                               # crash holding its leases
            peer.sock.close()
            members[k] = join(next_id)
            next_id += 1
            continue
        acks = [m for m in got if rng.random() < 0.8]
        nacks = [m for m in got if m not in acks and rng.random() < 0.5]
        if acks:
            refused = _apply(peer.ack, sub, acks)
            for m in acks:
                if m.lease not in refused:
                    acked[m.message_id] = acked.get(m.message_id, 0) + 1
        if nacks:
            _apply(lambda s_, ls: peer.nack(s_, ls, reason="random"), sub, nacks)
        # the rest is left to expire (visibility timeout)
        if not got:
            dl = members[0][0].admin("dlq.list", cluster="g", limit=1000)["messages"]
            dead = {d["msg_id"] for d in dl}
            if len(acked) + len(dead - set(acked)) >= n:
                break
    dl = members[0][0].admin("dlq.list", cluster="g", limit=1000)["messages"]
    dead = {d["msg_id"] for d in dl}
    everything = {f"R:{i}" for i in range(n)}
    assert set(acked) | dead == everything, sorted(everything - set(acked) - dead)[:10]
    assert all(c == 1 for c in acked.values())
    assert not set(acked) & dead
    assert all(d["reason"] in ("random", "lease expired") for d in dl)
