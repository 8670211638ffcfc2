"""The consumer read's compiled decoding (``_core.read_run``, used by
``store/reads.py decode_entries``) reads what ``decode_record`` reads: the same
records from any run of index entries, and the same ``CorruptRecord`` -- raised by
decode_record itself, where the compiled loop stops -- for damaged bytes, a record of
another topic, or one outside the read."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

import struct
import zlib

from lockmq import accel
from lockmq.store import NewRecord, reads
from lockmq.store.errors import CorruptRecord
from lockmq.store.records import encode_record

from ..protocol.helpers import FUZZ

COMPILED = accel.speedups.read_run if accel.COMPILED else None
NOT_BUILT = pytest.mark.skipif(COMPILED is None, reason="lockmq._core is not built "
                               "(or LOCKMQ_PURE_PYTHON is set): pure path only")
TOPIC = "lock.events"

_record = st.builds(
    NewRecord, st.sampled_from([TOPIC, TOPIC, TOPIC, "other", "$devices"]),
    st.sampled_from(["LK-0001", "LK-0002", "BENCH-000001"]),
    st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1), st.binary(max_size=60),
    st.sampled_from([None, None, None, {"retries": 2}, {"reason": "é"}]))


def decoded(data: bytes, base: int, entries: list, i: int, j: int,
            compiled: bool) -> tuple[list, str]:
    """decode_entries' records and its error ("" when none), on one path."""
    saved = reads._read_run
    reads._read_run = COMPILED if compiled else None
    out: list = []
    try:
        reads.decode_entries(data, base, entries, i, j, 7, TOPIC, TOPIC.encode(), out)
        err = ""
    except CorruptRecord as exc:
        err = str(exc)
    finally:
        reads._read_run = saved
    return out, err


@settings(max_examples=300 * FUZZ, deadline=None)
@given(st.lists(_record, min_size=1, max_size=10), st.integers(0, 2**40),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
       st.integers(0, 30), st.booleans(), st.data())
@NOT_BUILT
def test_the_compiled_read_decodes_as_decode_record(records: list, base: int, damage: list,
                                                    cut: int, others_too: bool, data) -> None:
    encoded = [encode_record(r, 1_700_000_000_000_000 + k, 1 << 20)
               for k, r in enumerate(records)]
    entries, pos = [], base
    for r, b in zip(records, encoded):
        if r.topic == TOPIC or others_too:   # (another topic's entry: CorruptRecord)
            entries.append((pos, len(b), 0))
        pos += len(b)
    blob = bytearray(b"".join(encoded))
    for at, byte in damage:
        blob[at % len(blob)] = byte
    blob = bytes(blob[:max(0, len(blob) - cut)])
    i = data.draw(st.integers(0, len(entries)))
    j = data.draw(st.integers(i, len(entries)))
    want = decoded(blob, base, entries, i, j, compiled=False)
    assert decoded(blob, base, entries, i, j, compiled=True) == want
    if not damage and not cut and not others_too:
        assert want[1] == "" and [r.queue_offset for r in want[0]] == list(range(7 + i, 7 + j))


@NOT_BUILT
def test_a_read_stops_where_the_data_ends() -> None:
    b = encode_record(NewRecord(TOPIC, "LK-1", 1, 0, b"x"), 5, 1 << 20)
    out: list = []
    got = COMPILED(b + b[:10], 100, [(100, len(b), 0), (100 + len(b), len(b), 0)], 0, 2, 0,
                   TOPIC, TOPIC.encode(), reads.StoredRecord, {}, 10, out)
    assert got == 1 and out[0].sn == "LK-1" and out[0].offset == 100
    assert COMPILED(b, 101, [(100, len(b), 0)], 0, 1, 0, TOPIC, TOPIC.encode(),
                    reads.StoredRecord, {}, 10, []) == 0   # (before the read)


@NOT_BUILT
def test_an_sn_that_is_not_ascii_reads_as_decode_record_reads_it() -> None:
    b = bytearray(encode_record(NewRecord(TOPIC, "LK-1", 1, 0, b"x"), 5, 1 << 20))
    b[40 + len(TOPIC)] = 0xFF   # the SN's first byte, the CRC made anew: a valid record
    struct.pack_into("<I", b, 4, zlib.crc32(bytes(b[8:])))
    entries = [(0, len(b), 0)]
    got = decoded(bytes(b), 0, entries, 0, 1, compiled=True)
    assert got == decoded(bytes(b), 0, entries, 0, 1, compiled=False)
    assert got[0][0].sn == "\ufffdK-1"
