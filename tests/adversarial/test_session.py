"""Attacks on the session itself, over real TCP against ``lockmq broker`` with
``auth = "required"``: what an unauthenticated peer can make the broker hold, and
which identities can be claimed. Each test also shows the legitimate path working."""
from __future__ import annotations

import socket
import time

import pytest

from lockmq.protocol import Connect, ErrorCode, Op, Role, decode_body, encode_frame
from lockmq.security import Permissions
from lockmq.testing import Peer, SecureBroker, Refused, read_until_closed


pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = SecureBroker(tmp_path_factory.mktemp("session"),
                       {"broker": {"handshake_timeout_s": 2.0}})
    keys = env.add_locks("LOCK-0001")
    token = env.token("svc", Permissions(publish=("billing.*",)))
    yield env.start(), keys, token
    env.close()


def _legit_lock_publishes(broker, keys, seq: int) -> None:
    w = Peer(broker.port, "LOCK-0001")
    try:
        w.auth_lock(keys["LOCK-0001"])
        assert w.publish("lock.events", seq) is not None
    finally:
        w.close()


def test_unauthenticated_floods_get_one_answer_and_cost_nothing(env):
    """Item 5: frames before login (unknown opcodes, requests) used to get an answer
    each, queued up to the 4 MiB buffer of a peer that never reads, and close() at the
    auth timeout waited for a drain that never came (10 sockets: +54 MiB)."""
    broker, keys, _ = env
    mark = broker.mark()
    rss_before = broker.rss_kib()
    unknown = encode_frame(0x7777, "", b"x" * 200)
    publish = encode_frame(Op.PUBLISH, "LOCK-0001", b"y" * 200)
    socks = []
    for i in range(10):
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        frame = unknown if i % 2 == 0 else publish
        try:     # ~1 MiB of frames, never reading an answer
            for _ in range(20):
                s.sendall(frame * 256)
        except (BrokenPipeError, ConnectionResetError):
            pass     # closed already: what we want
        socks.append(s)
    for i, s in enumerate(socks):
        got = read_until_closed(s, timeout=10)
        s.close()
        # one ERROR frame at most (the rest of the flood was never answered)
        assert len(got) < 512, len(got)
        if got:
            frame = __import__("lockmq.protocol").protocol.FrameDecoder()
            frame.feed(got)
            err = decode_body(Op.ERROR, frame.next_frame().body)
            assert err.code == ErrorCode.NOT_AUTHENTICATED
    broker.wait_log(r"session_violation.*state=CONNECTING", start=mark)
    assert broker.rss_kib() - rss_before < 16 * 1024
    _legit_lock_publishes(broker, keys, 1)


def test_auth_timeout_drops_a_peer_that_never_reads(env):
    """Item 5: a peer that sends CONNECT and then only sends (never reads, never
    authenticates) is dropped at the auth timeout."""
    broker, keys, _ = env
    mark = broker.mark()
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(encode_frame(Op.CONNECT, "LOCK-0001", Connect(Role.LOCK, 30, "x").encode(), 1))
    started = time.monotonic()
    read_until_closed(s, timeout=15)
    s.close()
    assert time.monotonic() - started < 15
    broker.wait_log(r"AUTH_TIMEOUT|not finished in time|auth_timeout", start=mark)
    _legit_lock_publishes(broker, keys, 2)


@pytest.mark.parametrize("claimed", ["$broker", "LOCK-0001\n", "LOCK-0001 ", "a:1", "\x00x"])
def test_reserved_and_lookalike_ids_cannot_be_claimed(env, claimed):
    """Item 12 (session part) and item 1: `$` ids, control characters, spaces and the
    message-id separator are refused at CONNECT, for any role, before any token check."""
    broker, _, token = env
    mark = broker.mark()
    w = Peer(broker.port, claimed)
    try:
        with pytest.raises(Refused) as ei:
            w.auth_token(token)
        assert ei.value.code == ErrorCode.INVALID_ARGUMENT
        assert "refused" in ei.value.err.message
        assert w.read(5) is None      # and the connection is closed
    finally:
        w.close()
    broker.wait_log(r"session_violation.*code=8", start=mark)
    good = Peer(broker.port, "billing-worker-1")
    try:
        good.auth_token(token)
        assert good.publish("billing.invoices", 1) is not None
    finally:
        good.close()
