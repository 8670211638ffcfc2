"""The compiled ingest's handshake (host/rust/src/handshake.rs, through
``lockmq._core.serve_connect``) against the Python session it mirrors
(``protocol/_server_session.py``): on the shared session vectors and on random and
damaged input, every CONNECT the core serves is one the session takes, answered with
the same CHALLENGE bytes and the same transcript; a lock's well-formed CONNECT is
always served; anything else is left to the session (the core answers nothing)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockmq.protocol import Connect, Flag, Frame, FrameDecoder, Op, ProtocolError, Role, \
    encode_frame
from lockmq.protocol._server_session import ServerSession

from .helpers import FUZZ, NOT_BUILT, SPEEDUPS

pytestmark = NOT_BUILT
serve = SPEEDUPS.serve_connect if SPEEDUPS is not None else None

VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "session_vectors.json"
MAX_FRAME = 4096
NONCE = bytes(range(16))
SN_CHARS = "ABCXYZabcxyz0189._-"


def python_answer(data: bytes, nonce: bytes, time_ms: int, broker_id: str,
                  max_frame: int = MAX_FRAME) -> tuple[bytes, bytes] | None:
    """What the Python path answers ``data`` (all a socket sent) with, when it is one
    whole CONNECT and nothing else, of a lock, taken by the session: (CHALLENGE bytes,
    transcript); None otherwise."""
    dec = FrameDecoder(max_frame)
    try:
        dec.feed(data)
        frame = dec.next_frame()
    except ProtocolError:
        return None
    if frame is None or dec.buffered() or frame.opcode != Op.CONNECT:
        return None
    s = ServerSession()
    try:
        s.receive(frame)
    except ProtocolError:
        return None
    if s.role != Role.LOCK or frame.flags:
        return None
    out = s.challenge(nonce, time_ms, frame.opaque, broker_id=broker_id)
    return out, s.transcript


def check(data: bytes, nonce: bytes = NONCE, time_ms: int = 1_700_000_000_000,
          broker_id: str = "", max_frame: int = MAX_FRAME) -> bool:
    got = serve(data, max_frame, nonce, time_ms, broker_id)
    want = python_answer(data, nonce, time_ms, broker_id, max_frame)
    if got is None:
        assert want is None, f"the core left a CONNECT the session serves: {data.hex()}"
        return False
    assert want is not None, f"the core served what the session refuses: {data.hex()}"
    frame, body, transcript = got
    assert frame == want[0]
    assert transcript == want[1]
    assert body in frame
    return True


def lock_connect(sn: str, keepalive: int = 30, client: str = "fw", proto: int = 1,
                 max_frame: int = 0, flags: int = 0, opaque: int = 1,
                 role: int = Role.LOCK) -> bytes:
    return encode_frame(Op.CONNECT, sn, Connect(role, keepalive, client, proto,
                                                max_frame).encode(), opaque, flags)


def test_a_lock_connect_is_answered_as_the_session_answers_it() -> None:
    assert check(lock_connect("LOCK-0001"))
    assert check(lock_connect("LOCK-0001", max_frame=8192, opaque=0xFFFFFFFF))
    assert check(lock_connect("l.1_x-Y"), broker_id="gw-7")   # (the broker's id sent)
    assert check(lock_connect("A" * 64, client="ü" * 20))


def test_everything_else_is_left_to_the_session() -> None:
    for data in (lock_connect("LOCK-1", flags=Flag.MAC),      # frame MACs: Python's
                 lock_connect("svc", role=Role.SERVICE),
                 lock_connect("ops", role=Role.ADMIN),
                 lock_connect("", role=Role.LOCK),
                 lock_connect("-LOCK"),
                 lock_connect("LOCK-1") * 2,                    # (bytes after the CONNECT)
                 lock_connect("LOCK-1")[:-1],                   # (not whole yet)
                 encode_frame(Op.AUTH, "LOCK-1", b"\x01" * 30, 2),
                 encode_frame(Op.CONNECT, "LOCK-1", b"\x01\x00", 1),
                 b"\x00" * 40):
        assert not check(data)
    assert not check(lock_connect("LOCK-1"), max_frame=20)      # (over the pre-auth limit)


def test_the_session_vectors_connects() -> None:
    """The first CONNECT of each case of the shared vectors (a new socket's): served
    exactly when it is a lock's the session takes (the vectors' expectation), with the
    session's CHALLENGE."""
    cases = json.loads(VECTORS.read_text())["server"]
    seen = 0
    for case in cases:
        for step in case["steps"][:1]:
            if step.get("op") != "CONNECT":
                continue
            body = Connect(step["role"], 30, "vectors").encode()
            data = Frame(Op.CONNECT, step.get("sn", ""), step.get("flags", 0), 1, body).encode()
            served = check(data)
            assert served == (step["expect"] == "ok" and step["role"] == Role.LOCK
                              and not step.get("flags", 0)), case["name"]
            seen += 1
    assert seen >= 8


@st.composite
def connects(draw: st.DrawFn) -> bytes:
    sn = draw(st.one_of(st.text(SN_CHARS, min_size=1, max_size=64),
                        st.text(max_size=70)))
    body = draw(st.one_of(
        st.builds(lambda *a: Connect(*a).encode(), st.sampled_from([1, 1, 1, 2, 3, 0, 9]),
                  st.integers(0, 0xFFFF), st.text(max_size=40), st.integers(0, 255),
                  st.one_of(st.just(0), st.integers(32, 0xFFFFFFFF))),
        st.binary(max_size=60)))
    flags = draw(st.sampled_from([0, 0, 0, Flag.MAC, Flag.ONEWAY, 0x80]))
    op = draw(st.sampled_from([Op.CONNECT] * 6 + [Op.AUTH, Op.PUBLISH, 0x7777]))
    try:
        data = encode_frame(op, sn, body, draw(st.integers(0, 0xFFFFFFFF)), flags)
    except ProtocolError:
        data = draw(st.binary(max_size=80))
    # damage: a byte changed, cut, or more bytes behind it
    how = draw(st.sampled_from(["none", "none", "flip", "cut", "extra"]))
    if how == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    elif how == "cut":
        data = data[:draw(st.integers(0, len(data)))]
    elif how == "extra":
        data += draw(st.binary(min_size=1, max_size=20))
    return data


@settings(max_examples=400 * FUZZ, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(connects(), st.binary(min_size=16, max_size=16), st.integers(0, 2**64 - 1),
       st.sampled_from(["", "gw-1", "x" * 255]))
def test_random_and_damaged_connects_agree(data: bytes, nonce: bytes, time_ms: int,
                                           broker_id: str) -> None:
    check(data, nonce, time_ms, broker_id)
