"""The CPython fast path of the consumer bodies (protocol/_fast.py) is the same codec
as the portable one (_consume.py): the shared vectors pass with either, random bodies
give the same bytes and objects, and MicroPython never loads it."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from lockmq import protocol as p
from lockmq.protocol import _fast
from lockmq.protocol._crc import crc16_table

from . import vector_checks
from lockmq.testing.micropython import PROTOCOL, build_mpy_lib, run_micropython


@pytest.fixture
def portable():
    """Switch the fast path off for one test (it is on for every other)."""
    _fast.install(False)
    try:
        yield
    finally:
        _fast.install(True)


def test_fast_path_is_on_under_cpython() -> None:
    assert p.Ack.decode is _fast._ack_decode
    assert p.Messages.encode is _fast._messages_encode
    assert p.Messages.decode is _fast._messages_decode


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "portable"])
def test_vectors_pass_on_both_paths(fast: bool) -> None:
    _fast.install(fast)
    try:
        assert (p.Ack.decode is _fast._ack_decode) is fast
        passed, failures = vector_checks.run(str(PROTOCOL / "vectors.json"), [crc16_table])
    finally:
        _fast.install(True)
    assert failures == []
    assert passed > 100


_leases = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 0xFFFF)), max_size=30)
_message = st.builds(p.Message, st.integers(0, 2**64 - 1), st.integers(0, 0xFFFF),
                     st.text("ABC-0123", min_size=1, max_size=20), st.integers(0, 2**32 - 1),
                     st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
                     st.sampled_from(["locks", "$devices", "a.b-c"]), st.binary(max_size=64),
                     st.sampled_from([b"", b'{"retries":1}']))


def _both(fn):
    """``fn()`` with the fast path, then with the portable one."""
    fast = fn()
    _fast.install(False)
    try:
        return fast, fn()
    finally:
        _fast.install(True)


@given(st.integers(0, 2**32 - 1), _leases, st.integers(0, 2**32 - 1), st.text(max_size=30))
def test_lease_bodies_decode_alike(sub_id, leases, delay, reason) -> None:
    ack = p.Ack(sub_id, leases).encode()
    nack = p.Nack(sub_id, leases, delay, reason).encode()
    fast, portable = _both(lambda: (p.Ack.decode(ack), p.Nack.decode(nack)))
    assert fast == portable == (p.Ack(sub_id, leases), p.Nack(sub_id, leases, delay, reason))


@given(st.integers(0, 2**32 - 1), st.lists(_message, max_size=10))
def test_messages_encode_alike(sub_id, messages) -> None:
    fast, portable = _both(lambda: p.Messages(sub_id, messages).encode())
    assert fast == portable
    assert p.Messages.decode(fast) == p.Messages(sub_id, messages)


@given(st.integers(0, 2**32 - 1), st.lists(_message, max_size=10), st.data())
def test_messages_decode_alike_whole_cut_or_with_trailing_bytes(sub_id, messages,
                                                                 data) -> None:
    body = p.Messages(sub_id, messages).encode()
    fast, portable = _both(lambda: p.Messages.decode(body))
    assert fast == portable == p.Messages(sub_id, messages)
    cut = data.draw(st.integers(0, len(body) - 1))
    for bad in (body[:cut], body + b"\x00"):
        for on in (True, False):
            _fast.install(on)
            try:
                with pytest.raises(p.BadBody):
                    p.Messages.decode(bad)
            finally:
                _fast.install(True)


def test_messages_decode_refuses_a_name_that_is_not_utf8() -> None:
    body = bytearray(p.Messages(1, [p.Message(1, 1, "AB", 1, 0, 0, "t", b"x")]).encode())
    body[6 + 30 + 1] = 0xFF   # the SN's first byte (after the fixed fields)
    with pytest.raises(p.BadBody, match="UTF-8"):
        p.Messages.decode(bytes(body))


@pytest.mark.parametrize("body", [b"", b"\x00\x00\x00\x01\x00",
                                  b"\x00\x00\x00\x01\x00\x02" + b"\x00" * 19,
                                  b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x03ab"])
def test_truncated_lease_bodies_are_bad_body_on_both_paths(body: bytes, portable) -> None:
    for on in (False, True):
        _fast.install(on)
        with pytest.raises(p.BadBody):
            p.Ack.decode(body)
        with pytest.raises(p.BadBody):
            p.Nack.decode(body)


def test_micropython_does_not_load_the_fast_paths(tmp_path: Path) -> None:
    # (neither _fast.py nor the frame MACs' _macfast.py: both are CPython's)
    lib = build_mpy_lib(tmp_path, compile_mpy=False)
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\n"
        "from lockmq import protocol\n"
        "import lockmq.protocol._consume\n"
        "from lockmq.protocol import _session, _mac\n"
        "print('fast' if 'lockmq.protocol._fast' in sys.modules\n"
        "      or 'lockmq.protocol._macfast' in sys.modules else 'portable')\n")
    proc = run_micropython(script, [], tmp_path, [lib, tmp_path], "512K")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "portable"


@given(st.integers(0, 1), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
def test_publish_ack_frame_is_the_generic_encoding(status: int, offset: int,
                                                   opaque: int) -> None:
    generic = p.encode_frame(p.Op.PUBLISH_ACK, "", p.PublishAck(status, offset).encode(),
                             opaque, p.Flag.RESPONSE)
    assert _fast.publish_ack_frame(status, offset, opaque) == generic


@given(st.text(max_size=40), st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1),
       st.binary(max_size=64))
def test_publish_fields_match_publish_decode(topic: str, seq: int, ts: int,
                                             payload: bytes) -> None:
    if len(topic.encode()) > 255:
        return
    body = p.Publish(topic, seq, ts, payload).encode()
    d = p.Publish.decode(body)
    assert _fast.publish_fields(body) == (d.topic, d.seq, d.lock_ts_ms, d.payload)
    for bad in (body[:12 + len(topic.encode())], b""):
        with pytest.raises(p.BadBody):
            p.Publish.decode(bad)
        with pytest.raises(p.BadBody):
            _fast.publish_fields(bad)


def test_publish_fields_refuse_a_topic_that_is_not_utf8() -> None:
    body = b"\x02\xff\xfe" + bytes(12)
    with pytest.raises(p.BadBody, match="UTF-8"):
        _fast.publish_fields(body)
