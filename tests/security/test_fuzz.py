"""Hostile input, property-based: random and mutated frames at the decoder, at the
Guard and at a live ``lockmq broker``. No crash, no hang, memory bounded.

Kept to ~30 s on a 2-core machine; ``tests/security/fuzz_atheris.py`` is the
coverage-guided version, run on demand.
"""

from __future__ import annotations

import os
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockmq.protocol import (BODY_TYPES, Auth, AuthMethod, Connect, FrameDecoder, Op, Publish,
                             Role, auth_proof, encode_frame)
from lockmq.security import SecurityConfig, SecurityError
from lockmq.testing import Peer, SecureBroker
from lockmq.testing.fuzz import decode_stream


OPCODES = sorted(BODY_TYPES) + [Op.OK, Op.ADMIN_REQUEST, 0x7777]
FAST = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def valid_stream(key: bytes = b"k" * 32, sn: str = "FUZZ-1") -> bytes:
    """A plausible lock session: CONNECT, AUTH (to a made-up nonce), two PUBLISHes."""
    cn = os.urandom(16)
    return (encode_frame(Op.CONNECT, sn, Connect(Role.LOCK, 30, "fw").encode(), 1)
            + encode_frame(Op.AUTH, sn, Auth(AuthMethod.DEVICE_HMAC, cn,
                                             auth_proof(key, b"n" * 16, cn, sn, b"t" * 32)).encode(), 2)
            + encode_frame(Op.PUBLISH, sn, Publish("lock.events", 1, 0, b"x" * 24).encode(), 3)
            + encode_frame(Op.PUBLISH, sn, Publish("lock.events", 2, 0, b"y" * 24).encode(), 4))


@st.composite
def mutated(draw) -> bytes:
    """A valid stream with bit flips, cuts, insertions and duplications."""
    data = bytearray(valid_stream())
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "dup", "set"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del data[i:i + draw(st.integers(1, 16))]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "dup":
            data[i:i] = data[i:i + draw(st.integers(1, 32))]
        elif kind == "set" and data:
            data[i] = draw(st.sampled_from([0, 0xFF, 0x7F, 0x80]))
    return bytes(data)


@st.composite
def crc_valid_frames(draw) -> bytes:
    """Frames with a correct checksum but random opcode/SN/body: reach the body decoders."""
    return encode_frame(draw(st.sampled_from(OPCODES)),
                        draw(st.text(alphabet="AZaz09-._", max_size=20)),
                        draw(st.binary(max_size=200)), draw(st.integers(0, 2**32 - 1)),
                        draw(st.integers(0, 255)))


hostile = st.one_of(st.binary(max_size=300), mutated(), crc_valid_frames(),
                    st.lists(crc_valid_frames(), min_size=2, max_size=5).map(b"".join))


@FAST
@given(data=hostile, chunk=st.integers(1, 64))
def test_decoder_and_bodies_raise_only_protocol_errors(data: bytes, chunk: int) -> None:
    dec = FrameDecoder(4096)
    frames = sum(1 for _ in decode_stream(dec, data, chunk))
    assert dec.buffered() <= 4096 + chunk
    assert frames <= len(data) // 15 + 1


@pytest.fixture(scope="module")
def fuzz_guard(tmp_path_factory):
    from lockmq.security import Guard
    d = tmp_path_factory.mktemp("fuzzguard")
    g = Guard(SecurityConfig(data_dir=str(d)))
    g.registry.add("FUZZ-1")
    yield g
    g.close()


@FAST
@given(sn=st.one_of(st.text(max_size=80), st.binary(max_size=80)),
       method=st.one_of(st.integers(-1, 300), st.text(max_size=8), st.none()),
       cnonce=st.binary(max_size=80), proof=st.binary(max_size=300),
       use_nonce=st.booleans(), ip=st.sampled_from(["10.0.0.1", "::1", "fe80::1", "junk", ""]))
def test_guard_authenticate_never_crashes(fuzz_guard, sn, method, cnonce, proof, use_nonce, ip):
    nonce = fuzz_guard.challenge() if use_nonce else os.urandom(16)
    body = {"method": method, "cnonce": cnonce, "proof": proof}
    try:
        fuzz_guard.authenticate(sn, body, nonce, ip)
    except SecurityError as exc:
        assert exc.code and exc.public_message
    else:  # pragma: no cover - only a real proof may pass
        raise AssertionError("a random answer authenticated")


# -- at a live broker --------------------------------------------------------------------

@pytest.fixture(scope="module")
def live(tmp_path_factory):
    env = SecureBroker(tmp_path_factory.mktemp("fuzzbroker"), {
        "broker": {"handshake_timeout_s": 1.0, "max_frame": 65536},
        "security": {"limit_exempt_addresses": [], "connect_rate": 10000.0,
                     "connect_burst": 10000, "auth_fail_per_address": 1_000_000}})
    key = env.add_locks("FUZZ-OK")["FUZZ-OK"]
    yield env.start(), key
    env.close()


def _throw(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            s.settimeout(0.05)
            while s.recv(65536):
                pass
        except OSError:
            pass


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=hostile)
def test_live_broker_survives_hostile_frames(live, data: bytes) -> None:
    broker, _ = live
    _throw(broker.port, data)
    assert broker.proc.poll() is None


@pytest.mark.slow  # a long fuzz run; test_live_broker_survives_hostile_frames runs by default
@pytest.mark.timeout(120)
def test_live_broker_still_serves_and_memory_is_bounded(live):
    """After the hostile run (and a few more rounds), a real lock still works and the
    broker's memory has not grown with the number of hostile connections."""
    broker, key = live
    # oversized-length frames and half-frames left hanging
    for i in range(200):
        _throw(broker.port, struct.pack(">BIHB", 1, 2**31, Op.PUBLISH, 0))
        _throw(broker.port, valid_stream()[: 7 + i % 40])
    base = broker.rss_kib()
    for i in range(600):
        _throw(broker.port, os.urandom(64) if i % 2 else valid_stream()[:-3])
    grown = broker.rss_kib() - base
    assert grown < 32 * 1024, f"broker RSS grew by {grown} kB over 600 hostile connections"
    w = Peer(broker.port, "FUZZ-OK")
    try:
        w.auth_lock(key)
        assert w.publish("lock.events", 1) is not None
    finally:
        w.close()
    m = broker.metrics()
    assert m.get("lockmq_connections", 0) < 50      # hostile sockets were all closed
