"""The broker's MESSAGES encoder (leases -> bytes) equals the protocol's codec.

The broker has no codec of its own: it walks its leases and packs each message with
the protocol's fast path (``lockmq.protocol._fast``); ACK and NACK are decoded by
the protocol's classes (tests/protocol/test_fast_path.py)."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st

from lockmq.broker.clusters import Lease, Source
from lockmq.broker.connection import encode_leases
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
