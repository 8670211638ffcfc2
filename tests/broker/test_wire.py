"""The broker's hot-path codecs equal the protocol's own (byte for byte)."""

from __future__ import annotations

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
