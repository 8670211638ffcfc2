"""The compiled ingest (broker/ingest.py, ``[broker] ingest = true``): the plain
listener's new sockets below Python up to the lock's AUTH, and the one path back.

A peer must not be able to tell the two listeners apart: the handshake tests of
test_handshakes.py and test_pipelined_handshake.py run here again against a broker with
the ingest, and every refusal is compared byte for byte with the uvloop listener's.
(Auth required, forged and unknown locks: tests/security/test_e2e.py runs all its
checks both ways.)"""

from __future__ import annotations

import socket
import time
from typing import Any, Callable

import pytest

from lockmq.broker.ingest import IngestServer
from lockmq.protocol import Connect, ErrorCode, ErrorReply, FrameDecoder, Op, PublishAck, Role, encode_frame
from lockmq.testing import BrokerThread, Peer, open_peer, wait_for

from .test_handshakes import \
    test_silent_peers_are_dropped_while_an_authenticated_one_stays  # noqa: F401
from .test_pipelined_handshake import (  # noqa: F401
    test_a_pipelined_request_the_lock_may_not_send_is_refused_after_connect_ack,
    test_a_service_may_pipeline_too,
    test_publishes_in_the_auth_write_are_stored_and_answered_after_connect_ack)

pytestmark = pytest.mark.skipif(not IngestServer.available(),
                                reason="the ingest needs the compiled core")


@pytest.fixture
def make_broker(make_broker: Callable[..., BrokerThread]) -> Callable[..., BrokerThread]:
    """The conftest's brokers, with the ingest on (the imported tests run on them)."""
    def make(**settings: Any) -> BrokerThread:
        settings["broker"] = {"ingest": True, **settings.get("broker", {})}
        return make_broker(**settings)
    return make


def _stats(b: BrokerThread) -> dict[str, int]:
    return b.call(lambda: dict(b.broker.stats.c))


def _first_answer(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Everything the broker sends a new socket that sent ``data``, until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        if data:
            s.sendall(data)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not got:
                break
            out += got
        return out


def test_a_lock_is_challenged_by_the_ingest_and_authenticated_by_the_python_path(
        make_broker: Callable[..., BrokerThread]) -> None:
    b = make_broker()
    assert isinstance(b.broker.servers[0], IngestServer)
    with open_peer(b.port, sn="LOCK-I1", role=Role.LOCK) as lock:
        assert lock.publish("t.ingest", 1).status == PublishAck.STORED
    c = _stats(b)
    assert c["ingest_challenges"] == 1 and c["ingest_handbacks"] == 1
    assert c["handshakes_ok"] == 1 and c["frames_in"] >= 3 and c["frames_out"] >= 3
    wait_for(lambda: b.call(lambda: b.broker.servers[0].held) == 0, "nothing held")


@pytest.mark.parametrize("data", [
    b"\x00" * 40,                                                       # not a frame
    encode_frame(Op.PUBLISH, "LOCK-1", b"\x00" * 20, 5),                # before CONNECT
    encode_frame(Op.CONNECT, "", Connect(Role.LOCK, 30, "fw").encode(), 1),   # no SN
    encode_frame(Op.CONNECT, "LOCK-1", b"\x01\x00", 1),                 # a broken body
    encode_frame(Op.CONNECT, "x" * 40, b"\x00" * 2000, 1),              # over the pre-auth limit
], ids=["garbage", "publish-first", "no-sn", "bad-body", "oversized"])
def test_a_bad_first_frame_gets_the_answer_of_the_python_listener(
        make_broker: Callable[..., BrokerThread], data: bytes) -> None:
    ingest = make_broker(data_dir=None)
    plain = make_broker(data_dir=str(ingest.data_dir) + "-plain", broker={"ingest": False})
    assert not isinstance(plain.broker.servers[0], IngestServer)
    got, want = _first_answer(ingest.port, data), _first_answer(plain.port, data)
    assert got == want and got   # (an ERROR, then the close)
    assert _stats(ingest)["bad_frames"] + _stats(ingest)["session_violations"] == \
        _stats(plain)["bad_frames"] + _stats(plain)["session_violations"]


def test_over_max_connections_the_refusal_is_the_python_listeners(
        make_broker: Callable[..., BrokerThread], tmp_path: Any) -> None:
    answers = []
    for ingest in (True, False):
        b = make_broker(data_dir=str(tmp_path / f"d-{ingest}"),
                        broker={"ingest": ingest, "max_connections": 2})
        held = [Peer(b.port, sn=f"LOCK-M{i}") for i in range(2)]
        try:
            for p in held:
                p.hello(Role.LOCK)   # (both counted: one waits for its AUTH)
            answers.append(_first_answer(b.port, b""))
            assert _stats(b)["connections_refused"] == 1
        finally:
            for p in held:
                p.close()
    assert answers[0] == answers[1]
    dec = FrameDecoder(65536)
    dec.feed(answers[0])
    err = ErrorReply.decode(dec.next_frame().body)
    assert err.code == ErrorCode.TOO_MANY_CONNECTIONS


def test_a_socket_held_at_stop_is_closed_and_its_admission_given_back(
        make_broker: Callable[..., BrokerThread]) -> None:
    b = make_broker()
    s = socket.create_connection(("127.0.0.1", b.port), timeout=10)
    try:
        wait_for(lambda: b.call(lambda: b.broker.servers[0].held) == 1, "held by the ingest")
        guard = b.broker.guard
        assert b.call(lambda: guard.connections.total) == 1
        b.stop()
        assert s.recv(100) == b""
        assert guard.connections.total == 0
    finally:
        s.close()
