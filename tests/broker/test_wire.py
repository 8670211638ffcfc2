"""The broker's MESSAGES encoder (leases -> bytes) equals the protocol's codec.

The broker has no codec of its own: it walks its leases and packs each message with
the protocol's batch API (``lockmq.protocol.batch``); ACK and NACK are decoded by
the protocol's classes (tests/protocol/test_consume_codec.py)."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st

from lockmq.broker.clusters import Lease, Source
from lockmq.broker.consumers import encode_leases
from lockmq.protocol import Message, Messages
from lockmq.store import StoredRecord

_msg = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 0xFFFF),
                 st.text("ABCDEF0123456789-", min_size=1, max_size=20), st.integers(0, 2**32 - 1),
                 st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
                 st.sampled_from(["locks", "$devices", "a.b-c"]), st.binary(max_size=64),
                 st.booleans())


@given(st.lists(_msg, max_size=20), st.integers(0, 3))
def test_encode_leases_matches_protocol(items, retries):
    leases, ref = [], []
    for qo, d, sn, seq, lts, bts, t, p, has_headers in items:
        rec = StoredRecord(0, qo, t, sn, seq, lts, bts, {"a": 1} if has_headers else None, p)
        lease = Lease(Source(t, 0), qo, rec, retries=retries)
        lease.wire, lease.deliveries = qo, d
        leases.append(lease)
        hdr = {"a": 1} if has_headers else {}
        if retries:
            hdr["retries"] = retries
        ref.append(Message(qo, d, sn, seq, lts, bts, t, p,
                           json.dumps(hdr, separators=(",", ":")).encode() if hdr else b""))
    body = encode_leases(7, leases)
    assert body == Messages(7, ref).encode()
    assert Messages.decode(body) == Messages(7, ref)   # the portable decoder agrees


_plain = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 0xFFFF),
                   st.sampled_from(["LK-1", "é" * 3, "S" * 255]), st.integers(0, 2**32 - 1),
                   st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                   st.sampled_from(["locks", "ü.x", "t" * 255]), st.binary(max_size=64))


@given(st.lists(_plain, max_size=20), st.sampled_from(["", "headers", "empty headers",
                                                        "retries", "too long", "delivery"]))
def test_the_compiled_encoder_writes_the_python_ones_bytes(items, odd):
    """``_core.encode_leases`` writes every batch without headers or retries as the
    Python loop does, and leaves every other one (None) to it."""
    from lockmq.broker import consumers

    if consumers._encode_leases_c is None:
        return   # (not built, or LOCKMQ_PURE_PYTHON: the Python loop is all there is)
    leases = []
    for qo, d, sn, seq, lts, bts, t, p in items:
        rec = StoredRecord(0, qo, t, sn, seq, lts, bts, None, p)
        lease = Lease(Source(t, 0), qo, rec)
        lease.wire, lease.deliveries = qo, d
        leases.append(lease)
    if leases and odd:
        last = leases[-1]
        if odd == "headers":
            last.rec = last.rec._replace(headers={"a": 1})
        elif odd == "empty headers":
            last.rec = last.rec._replace(headers={})
        elif odd == "retries":
            last.retries = 1
        elif odd == "too long":
            last.rec = last.rec._replace(sn="é" * 128)   # 256 bytes of UTF-8
        else:
            last.deliveries = 0x10000
    got = consumers._encode_leases_c(7, leases)
    if odd in ("", "empty headers") or not leases:
        assert got == consumers._encode_leases_py(7, leases)
    else:
        assert got is None


def test_more_leases_than_a_messages_body_counts_are_the_python_ones():
    from lockmq.broker import consumers

    rec = StoredRecord(0, 1, "t", "LK", 1, 0, 0, None, b"")
    leases = [Lease(Source("t", 0), 1, rec) for _ in range(0x10000)]
    if consumers._encode_leases_c is not None:
        assert consumers._encode_leases_c(7, leases) is None
