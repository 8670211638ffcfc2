"""Handshake deadlines (broker/handshakes.py): one loop-wide timer instead of one per
connection -- every peer that does not authenticate in time is still dropped, no
peer is dropped before its deadline, and a peer that authenticated is never
touched; the ``$devices`` record of a handshake is the bytes ``json.dumps`` made."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from hypothesis import given, strategies as st

from lockmq.broker.devices import event_json
from lockmq.broker.handshakes import HandshakeDeadlines
from lockmq.protocol import ErrorCode, ErrorReply, PublishAck, Role
from lockmq.testing import Peer, open_peer, wait_for_async


class FakeConn:
    """Records when the sweep called its handshake timeout."""

    def __init__(self) -> None:
        self.timed_out_at: float | None = None

    def _handshake_timeout(self) -> None:
        self.timed_out_at = time.monotonic()


def test_expired_handshakes_are_swept_never_early_and_discarded_ones_never() -> None:
    async def main() -> None:
        hs = HandshakeDeadlines()
        first, kept, second, later = FakeConn(), FakeConn(), FakeConn(), FakeConn()
        added = time.monotonic()
        hs.add(first, 0.05)
        hs.add(kept, 0.05)
        hs.add(second, 0.05)
        hs.discard(kept)        # authenticated in time
        await wait_for_async(lambda: first.timed_out_at and second.timed_out_at,
                             "both timed out", timeout=10)
        hs.add(later, 0.05)     # the timer re-arms once the dict was empty
        later_added = time.monotonic()
        await wait_for_async(lambda: later.timed_out_at, "the later one timed out", timeout=10)
        assert kept.timed_out_at is None
        assert first.timed_out_at >= added + 0.05 and second.timed_out_at >= added + 0.05
        assert later.timed_out_at >= later_added + 0.05
        assert len(hs) == 0

    asyncio.run(main())


def test_a_sweep_takes_only_the_expired_front() -> None:
    async def main() -> None:
        hs = HandshakeDeadlines()
        short, long_ = FakeConn(), FakeConn()
        hs.add(short, 0.02)
        hs.add(long_, 30.0)
        await wait_for_async(lambda: short.timed_out_at, "the short one timed out", timeout=10)
        assert long_.timed_out_at is None and len(hs) == 1
        hs.discard(long_)

    asyncio.run(main())


def test_silent_peers_are_dropped_while_an_authenticated_one_stays(make_broker: Any) -> None:
    broker = make_broker(broker={"handshake_timeout_s": 0.5})
    silent = [Peer(broker.port) for _ in range(5)]
    half = [Peer(broker.port, sn=f"LOCK-H{i}") for i in range(3)]
    for p in half:
        p.hello(Role.LOCK)      # CONNECT answered, AUTH never sent
    with open_peer(broker.port, sn="LOCK-OK", role=Role.LOCK) as ok:
        for p in silent + half:
            seen = p.wait_closed(timeout=10)
            errors = [f for f in seen if isinstance(f, ErrorReply)]
            assert errors and errors[-1].code == ErrorCode.AUTH_TIMEOUT
            p.close()
        # long past the handshake timeout: the authenticated lock is served
        assert ok.publish("t.after", 0).status == PublishAck.STORED


@given(st.text(max_size=20), st.sampled_from(["online", "offline", "evicted", "broker_start"]),
       st.integers(0, 1 << 62), st.text(max_size=30), st.text(max_size=20))
def test_devices_records_are_the_bytes_json_dumps_made(sn: str, event: str, ts: int, peer: str,
                                                       reason: str) -> None:
    body: dict[str, Any] = {"sn": sn, "event": event, "ts_ms": ts, "peer": peer}
    if not sn:
        del body["sn"]
    if reason:
        body["reason"] = reason
    assert event_json(sn, event, ts, peer, reason) == \
        json.dumps(body, separators=(",", ":")).encode()
