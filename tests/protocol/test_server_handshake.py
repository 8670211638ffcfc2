"""The broker's handshake fast paths (protocol/_server_session.py) are the portable
codec: CHALLENGE and CONNECT_ACK packed whole give encode_frame's bytes, CONNECT and
AUTH bodies read in one go give the bodies' decode results and errors -- under
CPython and under the real MicroPython (the packers' fallback there)."""
from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings, strategies as st

from lockmq.protocol import (Auth, Connect, ConnectAck, Flag, Op, Challenge, ServerSession,
                             encode_frame)
from lockmq.protocol._server_session import decode_auth, decode_connect
from lockmq.testing.micropython import build_mpy_lib, run_micropython

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, (1 << 64) - 1)
nonce = st.binary(min_size=16, max_size=16)


def _outcome(decode, body: bytes):
    """What ``decode(body)`` gives: its fields, or its error's type and message."""
    try:
        got = decode(body)
    except Exception as exc:  # noqa: BLE001 -- the comparison is the point
        return ("error", type(exc), str(exc))
    return ("ok", [(getattr(got, k), type(getattr(got, k))) for k in got.__slots__])


@given(nonce, u64, u32, u8)
def test_challenge_is_encode_frame_of_challenge(n: bytes, t: int, opaque: int, methods: int) -> None:
    got = ServerSession().challenge(n, t, opaque, methods)
    assert got == encode_frame(Op.CHALLENGE, "", Challenge(n, t, methods).encode(), opaque,
                               Flag.RESPONSE)


@given(st.binary(max_size=40).filter(lambda b: len(b) != 16))
def test_a_bad_nonce_is_refused_as_challenge_refuses_it(n: bytes) -> None:
    assert _outcome(lambda b: ServerSession().challenge(b, 0, 1), n) == \
        _outcome(lambda b: Challenge(b, 0), n)
    assert _outcome(lambda b: ServerSession().challenge(b, 0, 1), n)[0] == "error"


@given(u16, u32, u64, u32, u32, u32)
def test_connect_ack_is_encode_frame_of_connect_ack(hb: int, mf: int, t: int, last: int,
                                                    sid: int, opaque: int) -> None:
    s = ServerSession()
    s.state = 1   # CHALLENGED
    ack = ConnectAck(hb, mf, t, last, sid)
    assert s.accept(1, "LOCK-1", ack, opaque) == encode_frame(
        Op.CONNECT_ACK, "", ack.encode(), opaque, Flag.RESPONSE)


@settings(max_examples=300)
@given(u8, u16, st.text(max_size=8), u8, st.one_of(st.just(0), u32), st.data())
def test_connect_bodies_decode_as_connect_decode(role, keepalive, client, proto, max_frame,
                                                 data) -> None:
    body = Connect(role, keepalive, client, proto, max_frame).encode()
    cut = data.draw(st.integers(0, len(body)))
    extra = data.draw(st.binary(max_size=6))
    for b in (body, body[:cut], body + extra, body[:5] + b"\xff\xfe" + body[7:]):
        assert _outcome(decode_connect, b) == _outcome(Connect.decode, b)


@settings(max_examples=300)
@given(u8, nonce, st.binary(max_size=40), st.data())
def test_auth_bodies_decode_as_auth_decode(method, cnonce, proof, data) -> None:
    body = Auth(method, cnonce, proof).encode()
    cut = data.draw(st.integers(0, len(body)))
    for b in (body, body[:cut], body + b"x", data.draw(st.binary(max_size=60))):
        assert _outcome(decode_auth, b) == _outcome(Auth.decode, b)


def test_handshake_answers_are_the_same_bytes_under_micropython(tmp_path: Path) -> None:
    lib = build_mpy_lib(tmp_path, compile_mpy=True)
    script = tmp_path / "mpy_handshake.py"
    script.write_text(
        "import binascii\n"
        "from lockmq.protocol._server_session import ServerSession, decode_connect, decode_auth\n"
        "from lockmq.protocol._bodies import ConnectAck\n"
        "s = ServerSession()\n"
        "print(binascii.hexlify(s.challenge(bytes(range(16)), 1763780000123, 77, 3)).decode())\n"
        "s.state = 1\n"
        "print(binascii.hexlify(s.accept(1, 'L', ConnectAck(30, 65536, 5, 41, 7), 78)).decode())\n"
        "c = decode_connect(bytes([1, 0, 30, 1, 3]) + b'abc' + bytes([0, 0, 16, 0]))\n"
        "print(c.role, c.keepalive_s, c.client, c.proto_max, c.max_frame)\n"
        "a = decode_auth(bytes([1]) + bytes(range(16)) + bytes([0, 2, 9, 8]))\n"
        "print(a.method, binascii.hexlify(a.cnonce).decode(), binascii.hexlify(a.proof).decode())\n")
    proc = run_micropython(script, [], tmp_path, [lib, tmp_path], "256K")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.split()
    want_ch = encode_frame(Op.CHALLENGE, "", Challenge(bytes(range(16)), 1763780000123, 3).encode(),
                           77, Flag.RESPONSE).hex()
    want_ack = encode_frame(Op.CONNECT_ACK, "", ConnectAck(30, 65536, 5, 41, 7).encode(), 78,
                            Flag.RESPONSE).hex()
    assert lines[:2] == [want_ch, want_ack]
    assert lines[2:7] == ["1", "30", "abc", "1", str(16 << 8)]
    assert lines[7:] == ["1", bytes(range(16)).hex(), "0908"]
