"""The broker's hot-path codecs equal the protocol's own (byte for byte)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from lockmq.broker.wire import decode_ack, decode_nack, encode_messages
from lockmq.protocol import Ack, BadBody, Message, Messages, Nack

_msg = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 0xFFFF),
                 st.text("ABCDEF0123456789-", min_size=1, max_size=20), st.integers(0, 2**32 - 1),
                 st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
                 st.sampled_from(["locks", "$devices", "a.b-c"]), st.binary(max_size=64),
                 st.sampled_from([b"", b'{"retries":1}']))


@given(st.integers(0, 2**32 - 1), st.lists(_msg, max_size=20))
def test_encode_messages_matches_protocol(sub_id, items):
    ref = Messages(sub_id, [Message(qo, d, sn, seq, lts, bts, t, p, h)
                            for qo, d, sn, seq, lts, bts, t, p, h in items]).encode()
    assert encode_messages(sub_id, items) == ref


@given(st.integers(0, 2**32 - 1), st.lists(st.tuples(st.integers(0, 2**64 - 1),
                                                     st.integers(0, 0xFFFF)), max_size=30),
       st.integers(0, 2**32 - 1), st.text(max_size=30))
def test_lease_decoders_match_protocol(sub_id, leases, delay, reason):
    assert decode_ack(Ack(sub_id, leases).encode()) == (sub_id, leases)
    assert decode_nack(Nack(sub_id, leases, delay, reason).encode()) == (sub_id, delay, reason,
                                                                         leases)


@pytest.mark.parametrize("body", [b"", b"\x00\x00\x00\x01\x00", b"\x00\x00\x00\x01\x00\x02" + b"\x00" * 19])
def test_truncated_ack_is_bad_body(body):
    with pytest.raises(BadBody):
        decode_ack(body)


@given(st.lists(_msg, max_size=20), st.integers(0, 3))
def test_encode_leased_matches_protocol(items, retries):
    from lockmq.broker.clusters import Lease, Source
    from lockmq.store import StoredRecord

    leases, ref = [], []
    for qo, d, sn, seq, lts, bts, t, p, h in items:
        rec = StoredRecord(0, qo, t, sn, seq, lts, bts, {"a": 1} if h else None, p)
        lease = Lease(Source(t, 0), qo, rec, retries=retries)
        lease.wire, lease.deliveries = qo, d
        leases.append(lease)
        hdr = {"a": 1} if h else {}
        if retries:
            hdr["retries"] = retries
        ref.append(Message(qo, d, sn, seq, lts, bts, t, p,
                           json.dumps(hdr, separators=(",", ":")).encode() if hdr else b""))
    from lockmq.broker.wire import encode_leased
    assert encode_leased(7, leases) == Messages(7, ref).encode()
