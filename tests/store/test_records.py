"""The commit-log record codec and the dedup table, without files."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockmq.store import InvalidRecord, NewRecord
from lockmq.store.dedup import DedupTable
from lockmq.store.records import (HEADER_SIZE, check_record, decode_record, encode_record,
                                  scan, validate_topic)


def test_layout_matches_format_md():
    b = encode_record(NewRecord("locks", "SN1", 7, 123, b"abc", None), 456, 1 << 20)
    assert len(b) == HEADER_SIZE + len("locks") + len("SN1") + 3
    assert int.from_bytes(b[0:4], "little") == len(b) - 4
    assert int.from_bytes(b[4:8], "little") == zlib.crc32(b[8:])
    assert b[8] == 1 and b[9] == 0  # format, flags
    assert int.from_bytes(b[10:12], "little") == 5 and b[12] == 3
    assert int.from_bytes(b[16:20], "little") == 7
    assert int.from_bytes(b[24:32], "little") == 123
    assert int.from_bytes(b[32:40], "little") == 456
    assert b[40:45] == b"locks" and b[45:48] == b"SN1" and b[48:] == b"abc"


def test_system_topic_and_headers_flags():
    b = encode_record(NewRecord("$dlq.c1", "SN1", 1, 0, b"", {"reason": "nack", "n": 3}), 1, 999)
    assert b[9] == 0x03
    r = decode_record(b)
    assert r.headers == {"reason": "nack", "n": 3} and r.topic == "$dlq.c1"


@settings(max_examples=150, deadline=None)
@given(topic=st.from_regex(r"[A-Za-z0-9._$%-]{1,128}", fullmatch=True),
       sn=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=255),
       seq=st.integers(0, 2**32 - 1), ts=st.integers(0, 2**63 - 1),
       payload=st.binary(max_size=300),
       headers=st.none() | st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
def test_round_trip(topic, sn, seq, ts, payload, headers):
    b = encode_record(NewRecord(topic, sn, seq, ts, payload, headers), 99, 1 << 20)
    r = decode_record(b, 0, 5, 6)
    assert (r.topic, r.sn, r.seq, r.lock_ts_ms, r.broker_ts_us, r.payload, r.headers,
            r.offset, r.queue_offset) == (topic, sn, seq, ts, 99, payload, headers, 5, 6)


@pytest.mark.parametrize("bad", [
    NewRecord("", "SN", 1), NewRecord("a/b", "SN", 1), NewRecord("x" * 129, "SN", 1),
    NewRecord("t", "", 1), NewRecord("t", "é", 1), NewRecord("t", "s" * 256, 1),
    NewRecord("t", "SN", -1), NewRecord("t", "SN", 2**32), NewRecord("t", "SN", 1.0),
    NewRecord("t", "SN", 1, -5), NewRecord("t", "SN", 1, payload="text"),
    NewRecord("t", "SN", 1, headers=["x"]), NewRecord("t", "SN", 1, headers={"x": object()}),
    NewRecord("t", "SN", 1, payload=b"x" * 2000),
])
def test_bad_records_are_refused_with_a_reason(bad):
    with pytest.raises(InvalidRecord) as info:
        encode_record(bad, 1, 1024)
    assert str(info.value)


def test_validate_topic_accepts_the_allowed_alphabet():
    assert validate_topic("A-z_0.9$%") == "A-z_0.9$%"


def test_scan_stops_at_first_bad_byte():
    recs = [encode_record(NewRecord("t", "S", i, 0, bytes([i]) * 10), 1, 999) for i in range(5)]
    buf = bytearray(b"".join(recs))
    assert [r.seq for r in scan(buf, 0, len(buf))] == [0, 1, 2, 3, 4]
    flip = len(recs[0]) * 2 + 45
    buf[flip] ^= 0x40
    got = list(scan(buf, 0, len(buf)))
    assert [r.seq for r in got] == [0, 1]
    assert check_record(buf, got[-1].pos + got[-1].size, len(buf)) == "checksum mismatch"
    assert check_record(buf, 0, 20) == "truncated header"


def test_dedup_in_order_out_of_order_and_window():
    d = DedupTable(window=8, max_sns=10)
    assert not d.contains("A", 5)
    d.add("A", 5)
    assert d.contains("A", 5) and not d.contains("A", 4) and not d.contains("A", 6)
    d.add("A", 7)
    assert not d.contains("A", 6) and d.contains("A", 7) and d.contains("A", 5)
    d.add("A", 6)
    assert d.contains("A", 6)
    # below the window: not known to be stored, so new -- never acked as a duplicate
    # (SPEC 2 "Sequence numbers"; it was counted as one, which lost a wrapped lock's events)
    assert not d.contains("A", 7 - 9)
    assert d.last_seq("A") == 7 and d.last_seq("B") is None


def test_dedup_lru_cap():
    d = DedupTable(window=4, max_sns=3)
    for sn in "ABCD":
        d.add(sn, 1)
    assert len(d) == 3 and d.last_seq("A") is None and d.evicted == 1
    d.add("B", 2)  # B becomes most recent
    d.add("E", 1)
    assert d.last_seq("B") == 2 and d.last_seq("C") is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 60)), max_size=200))
def test_dedup_matches_a_set_within_the_window(ops):
    window = 16
    d = DedupTable(window=window, max_sns=100)
    model: dict[str, set[int]] = {}
    for sn, seq in ops:
        seen = model.setdefault(sn, set())
        hw = max(seen) if seen else None
        expect = seq in seen and (hw is None or seq >= hw - window)
        assert d.contains(sn, seq) == expect
        d.add(sn, seq)
        seen.add(seq)
    e = DedupTable(window=window, max_sns=100)
    e.load(DedupTable.encode(d.items()))
    for sn in "abc":
        for seq in range(0, 70):
            assert e.contains(sn, seq) == d.contains(sn, seq)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 40)), max_size=300),
       st.integers(0, 40))
def test_dedup_add_many_equals_add_one_by_one(ops, run):
    """The batch path (with its in-order shortcut) keeps exactly what add() keeps,
    including the LRU order and evictions."""
    ops = ops + [("e", k) for k in range(run)]
    one, many = DedupTable(window=8, max_sns=3), DedupTable(window=8, max_sns=3)
    for sn, seq in ops:
        one.add(sn, seq)
    many.add_many(ops)
    assert many.items() == one.items() and many.evicted == one.evicted


def test_dedup_never_drops_system_ids_and_keeps_their_last_seq():
    d = DedupTable(window=8, max_sns=10)
    d.add("$broker", 0xFFFFFFFF)          # what v0.1's "$broker" attack left behind
    assert not d.contains("$broker", 0) and not d.contains("$broker", 0xFFFFFFFF)
    d.add("$broker", 0)                   # the broker numbers on from the last written
    assert d.last_seq("$broker") == 0
    d.add_many([("$broker", 1), ("$broker", 2)])
    assert d.last_seq("$broker") == 2 and not d.contains("$broker", 2)
    d.add("LOCK-1", 5)                    # producers are deduplicated as before
    assert d.contains("LOCK-1", 5)
