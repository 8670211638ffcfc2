"""The consumer client's compiled MESSAGES scan (``_core.messages_fields``) reads a
body as the protocol's decoder does: the same fields for every body the decoder takes,
None for every body it refuses (so the client falls back to it and raises its
``BadBody``), and the client's messages are the same on both paths."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from lockmq import protocol as p
from lockmq.client import message as client_message
from lockmq.client.message import Message, messages_from_body
from lockmq.protocol import batch as py_batch

from .helpers import FUZZ, NOT_BUILT, SPEEDUPS

_message = st.builds(p.Message, st.integers(0, 2**64 - 1), st.integers(0, 0xFFFF),
                     st.sampled_from(["LK-0001", "BENCH-000001", "a" * 64, "é"]),
                     st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
                     st.integers(0, 2**64 - 1),
                     st.sampled_from(["locks", "$devices", "", "ü.x", "t" * 255]),
                     st.binary(max_size=64),
                     st.sampled_from([b"", b'{"retries":1}', b"[1]", b"\xff", b"{"]))
_damage = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3)


def decoded_fields(body: bytes) -> tuple | None:
    """What the protocol's decoder reads, in messages_fields' shape; None: BadBody."""
    try:
        got = p.Messages.decode(body)
    except p.BadBody:
        return None
    return got.sub_id, [(m.topic, m.sn, m.seq, m.payload, m.delivery, m.lock_ts_ms,
                         m.broker_ts_us, m.headers, m.queue_offset) for m in got.messages]


def scanned(body: bytes, cap: int = py_batch._CACHE_MAX) -> tuple | None:
    got = SPEEDUPS.messages_fields(body, {}, cap)
    return None if got is None else (got[0], got[1])


@settings(max_examples=300 * FUZZ, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(_message, max_size=8), _damage, st.integers(0, 40),
       st.booleans())
@NOT_BUILT
def test_the_scan_reads_what_the_decoder_reads(sub_id: int, messages: list, damage: list,
                                               cut: int, trailing: bool) -> None:
    whole = p.Messages(sub_id, messages).encode()
    assert scanned(whole) == decoded_fields(whole) is not None
    body = bytearray(whole)
    for at, byte in damage:
        body[at % len(body)] = byte
    body = body[:max(0, len(body) - cut)] + (b"\x00" if trailing else b"")
    for data in (bytes(body), body):
        assert scanned(data) == decoded_fields(bytes(data))


@settings(max_examples=300 * FUZZ, deadline=None)
@given(st.binary(max_size=200))
@NOT_BUILT
def test_the_scan_survives_any_bytes(data: bytes) -> None:
    assert scanned(data) == decoded_fields(data)


@NOT_BUILT
def test_a_count_the_body_cannot_hold_is_refused_before_any_list() -> None:
    assert SPEEDUPS.messages_fields(b"\x00\x00\x00\x01\xff\xff", {}, 10) is None
    assert SPEEDUPS.messages_fields(b"\x00\x00\x00\x01\x00\x00", {}, 10) == (1, [])


@NOT_BUILT
def test_names_are_decoded_once_and_the_cache_is_bounded() -> None:
    body = p.Messages(1, [p.Message(i, 1, "SN-%d" % i, i, 0, 0, "topic", b"x")
                          for i in range(5)]).encode()
    texts: dict[bytes, str] = {}
    first = SPEEDUPS.messages_fields(body, texts, 100)[1]
    assert texts == {b"topic": "topic", **{b"SN-%d" % i: "SN-%d" % i for i in range(5)}}
    again = SPEEDUPS.messages_fields(body, texts, 100)[1]
    assert all(a[0] is b[0] and a[1] is b[1] for a, b in zip(first, again))
    full = {b"old-%d" % i: "old" for i in range(3)}   # at its cap: emptied on a miss
    assert SPEEDUPS.messages_fields(body, full, 3)[1] == first
    assert len(full) <= 3 and b"old-0" not in full


@pytest.fixture(params=["compiled", "pure"])
def path(request, monkeypatch):  # type: ignore[no-untyped-def]
    if request.param == "compiled":
        if client_message._FIELDS is None:
            pytest.skip("lockmq._core is not built (or LOCKMQ_PURE_PYTHON is set)")
    else:
        monkeypatch.setattr(client_message, "_FIELDS", None)
    return request.param


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(_message, max_size=8))
def test_the_client_gets_the_same_messages_on_both_paths(sub_id: int, messages: list) -> None:
    body = p.Messages(sub_id, messages).encode()
    want = [Message.from_wire(m, 9, 3) for m in p.Messages.decode(body).messages]
    assert messages_from_body(body, 9, 3) == want
    saved = client_message._FIELDS
    client_message._FIELDS = None
    try:
        assert messages_from_body(body, 9, 3) == want
    finally:
        client_message._FIELDS = saved


def test_headers_that_are_not_a_json_object_are_kept_raw(path: str) -> None:
    body = p.Messages(1, [p.Message(0, 1, "LK", 1, 0, 0, "t", b"", h)
                          for h in (b'{"reason":"x"}', b"[1]", b"\xff", b"")]).encode()
    got = [m.headers for m in messages_from_body(body, 1, 1)]
    assert got == [{"reason": "x"}, {"_raw": "5b315d"}, {"_raw": "ff"}, {}]
    assert got[3] is not messages_from_body(body, 1, 1)[3].headers   # a dict of its own


def test_a_bad_body_is_the_protocols_bad_body(path: str) -> None:
    good = p.Messages(1, [p.Message(1, 1, "AB", 1, 0, 0, "t", b"x")]).encode()
    with pytest.raises(p.BadBody, match="truncated"):
        messages_from_body(good[:-1], 1, 1)
    with pytest.raises(p.BadBody, match="trailing"):
        messages_from_body(good + b"\x00", 1, 1)
    body = bytearray(good)
    body[6 + 30 + 1] = 0xFF   # the SN's first byte: not UTF-8
    with pytest.raises(p.BadBody, match="UTF-8"):
        messages_from_body(bytes(body), 1, 1)
