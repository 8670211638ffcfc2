"""The JVM-free decoder against the real storage engine and the protocol codec."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from lockmq.protocol import LockEvent
from lockmq.spark import generate, plan
from lockmq.spark.decoder import SCHEMA, DecodeStats, LogCorruptError, decode_buffer, decode_file, projected
from lockmq.spark.layout import find_logs, list_segments
from lockmq.spark.logwriter import LogWriter, encode


def _decode_dir(d: str, stats: DecodeStats | None = None) -> pa.Table:
    parts, _, _, _ = plan.plan([d], None, None, min_partitions=3, min_partition_bytes=0)
    batches = [b for pp in parts for p in pp
               for b in decode_file(p.path, p.base, p.gateway_id, p.start, p.end, stats=stats)]
    return pa.Table.from_batches(batches, schema=SCHEMA)


def test_decodes_what_the_store_wrote(tmp_path, fleet_records):
    """Every record the engine acknowledged, at the offset it reported, field by field."""
    import time

    d = str(tmp_path / "data")
    t0 = time.time_ns() // 1000
    appended = generate.write_store(d, fleet_records, segment_bytes=64 * 1024)
    t1 = time.time_ns() // 1000
    by_offset = {a.offset: r for a, r in zip(appended, fleet_records)}
    assert len(by_offset) == len(fleet_records)
    stats = DecodeStats()
    tab = _decode_dir(d, stats)
    assert stats.corrupt == 0 and stats.torn_bytes == 0
    assert sorted(tab["offset"].to_pylist()) == sorted(by_offset)
    for row in tab.to_pylist():
        r = by_offset[row["offset"]]
        assert (row["topic"], row["sn"], row["seq"], row["payload"]) == (r.topic, r.sn, r.seq, r.payload)
        assert row["message_id"] == f"{r.sn}:{r.seq}"
        assert t0 <= round(row["broker_ts"].timestamp() * 1_000_000) <= t1
        assert round(row["lock_ts"].timestamp() * 1000) == r.lock_ts_ms
        assert row["flags"] & 1 == r.topic.startswith("$")
        if r.topic == generate.EVENT_TOPIC:
            ev = LockEvent.decode(r.payload)
            assert (row["event_type"] is not None) and round(row["event_ts"].timestamp() * 1000) == ev.ts_ms
            assert row["credential_id"] == (ev.credential.hex() or None)
            assert row["value"] == ev.value
        else:
            assert row["event_type"] is None


def test_lock_event_columns_match_protocol_codec(tmp_path):
    from lockmq.protocol import EventType, Method, Result

    evs = [LockEvent(EventType.UNLOCK, 1_700_000_000_123, Method.PIN, Result.OK, 7, b"\x01\x02"),
           LockEvent(EventType.FAILED_ATTEMPT, 1, Method.CARD, Result.DENIED_SCHEDULE, 65535, b"\xff" * 8),
           LockEvent(EventType.LOW_BATTERY, 1_700_000_000_000, value=12),
           LockEvent(200, 2**64 - 1, 9, 9)]
    buf = b"".join(encode("lock.events", "SN1", i, 5, 6, e.encode()) for i, e in enumerate(evs))
    buf += encode("$devices", "$broker", 0, 0, 0, evs[0].encode())  # system topic: not an event
    buf += encode("lock.events", "SN1", 9, 0, 0, b"\x01\x00")  # not a LockEvent
    tab = pa.Table.from_batches(list(decode_buffer(buf, 0)))
    rows = tab.to_pylist()
    assert [r["event_type"] for r in rows] == ["unlock", "failed_attempt", "low_battery", "code:200", None, None]
    assert [r["method"] for r in rows[:4]] == ["pin", "card", "none", "code:9"]
    assert [r["result"] for r in rows[:4]] == ["ok", "denied_schedule", "ok", "code:9"]
    assert [r["value"] for r in rows[:4]] == [7, 65535, 12, 0]
    assert [r["credential_id"] for r in rows[:4]] == ["0102", "ff" * 8, None, None]
    assert rows[0]["event_ts"].timestamp() == 1_700_000_000.123
    assert rows[3]["event_ts"] is None  # u64 past int64 microseconds: null, not an overflow
    assert rows[5]["lock_ts"] is None  # 0 = unknown


def _write(d, n, segment_bytes=4096):
    w = LogWriter(d, segment_bytes)
    for i in range(n):
        w.append("lock.events", f"SN{i % 3}", i, 1_700_000_000_000 + i, 1_700_000_000_000_000 + i, b"p" * (i % 9))
    w.close()
    return w


def test_corrupt_record_is_counted_not_fatal(tmp_path):
    d = str(tmp_path / "data")
    _write(d, 300)
    segs = list_segments(d)
    victim = segs[1]
    with open(victim.path, "r+b") as f:  # flip one payload byte of the 3rd record
        data = f.read()
        pos = 0
        for _ in range(2):
            pos += 4 + int.from_bytes(data[pos:pos + 4], "little")
        f.seek(pos + 30)
        f.write(bytes([data[pos + 30] ^ 0xFF]))
    stats = DecodeStats()
    tab = _decode_dir(d, stats)
    assert stats.corrupt == 1
    good = tab.filter(pa.compute.is_null(tab["error"]))
    bad = tab.filter(pa.compute.is_valid(tab["error"])).to_pylist()
    assert good.num_rows == 299
    assert len(bad) == 1 and bad[0]["offset"] == victim.base + pos and "crc" in bad[0]["error"]
    with pytest.raises(LogCorruptError):
        list(decode_file(victim.path, victim.base, mode="FAILFAST"))
    assert sum(b.num_rows for b in decode_file(victim.path, victim.base, mode="DROPMALFORMED")) > 0


def test_garbage_length_resyncs_to_next_record(tmp_path):
    recs = [encode("t", "SN", i, 1, 1, b"x" * 10) for i in range(20)]
    buf = bytearray(b"".join(recs))
    buf[len(recs[0]) * 5: len(recs[0]) * 5 + 4] = (7).to_bytes(4, "little")  # record 5's length
    stats = DecodeStats()
    tab = pa.Table.from_batches(list(decode_buffer(bytes(buf), 0, stats=stats)))
    assert stats.corrupt == 1
    assert sorted(s for s in tab["seq"].to_pylist() if s is not None) == [i for i in range(20) if i != 5]


def test_projected_columns_equal_the_full_decode(tmp_path):
    """The id pass of ingest decodes only message_id and error: the same values as a
    full decode, corrupt rows included (as null ids with their error)."""
    recs = [encode("lock.events", f"SN{i % 3}", i, 1, 1, b"x" * 10) for i in range(20)]
    buf = bytearray(b"".join(recs))
    buf[len(recs[0]) * 5: len(recs[0]) * 5 + 4] = (7).to_bytes(4, "little")  # record 5's length
    full = pa.Table.from_batches(list(decode_buffer(bytes(buf), 0)))
    schema, ddl = projected(("error", "message_id"))
    assert schema.names == ["message_id", "error"] and ddl == "message_id STRING, error STRING"
    ids = pa.Table.from_batches(list(decode_buffer(bytes(buf), 0, schema=schema)), schema=schema)
    assert ids.to_pylist() == full.select(["message_id", "error"]).to_pylist()
    assert ids.column("error").null_count == 19
    with pytest.raises(ValueError, match="unknown column"):
        projected(("message_id", "nope"))


def test_torn_last_record_is_not_read_until_complete(tmp_path):
    d = str(tmp_path / "data")
    _write(d, 50, segment_bytes=1 << 20)
    (seg,) = list_segments(d)
    logs = find_logs(d)
    end_before = plan.latest(logs)[logs[0].key]
    assert end_before == seg.end
    rec = encode("lock.events", "SN9", 1000, 1, 1_700_000_001_000_000, b"late")
    with open(seg.path, "ab") as f:
        f.write(rec[:17])
    assert plan.latest(logs)[logs[0].key] == end_before  # the torn record is left alone
    stats = DecodeStats()
    rows = list(decode_file(seg.path, seg.base, closed=False, stats=stats))
    assert sum(b.num_rows for b in rows) == 50 and stats.torn_bytes == 17 and stats.corrupt == 0
    with open(seg.path, "ab") as f:
        f.write(rec[17:])
    assert plan.latest(logs)[logs[0].key] == end_before + len(rec)
    tab = pa.Table.from_batches(list(decode_file(seg.path, seg.base, start=end_before - seg.base)))
    assert tab["seq"].to_pylist() == [1000]


def test_body_still_being_written_is_torn_not_corrupt(tmp_path):
    """A live segment whose last record has its length but not yet all its bytes right."""
    d = str(tmp_path / "data")
    _write(d, 10, segment_bytes=1 << 20)
    (seg,) = list_segments(d)
    rec = encode("lock.events", "SN9", 1000, 1, 1, b"late")
    with open(seg.path, "ab") as f:
        f.write(rec[:-4] + b"\0\0\0\0")  # full length on disk, last bytes not yet written
    logs = find_logs(d)
    assert plan.latest(logs)[logs[0].key] == seg.end


def test_zero_filled_tail_is_end_of_data(tmp_path):
    d = str(tmp_path / "data")
    _write(d, 10, segment_bytes=1 << 20)
    (seg,) = list_segments(d)
    with open(seg.path, "ab") as f:
        f.write(b"\0" * 4096)
    stats = DecodeStats()
    assert sum(b.num_rows for b in decode_file(seg.path, seg.base, stats=stats)) == 10
    assert stats.corrupt == 0
    logs = find_logs(d)
    assert plan.latest(logs)[logs[0].key] == seg.end


@pytest.mark.parametrize("visible", [2, 6, 17, 40])
def test_record_being_written_over_preallocated_zeros_is_torn(tmp_path, visible):
    """The engine's newest segment has zeros after its last record; a record that
    a writer has put only ``visible`` bytes of over them (its length field, or part
    of it) is torn while the segment is live, and read once it is whole."""
    d = str(tmp_path / "data")
    generate.write_store(d, [generate.GenRecord("lock.events", "SN1", i, 1, 1, b"p%d" % i)
                             for i in range(30)], segment_bytes=1 << 20)
    (seg,) = list_segments(d)
    with open(seg.path, "rb") as f:
        data = f.read()
    logs = find_logs(d)
    end = plan.latest(logs)[logs[0].key]
    assert len(data) > end - seg.base and not any(data[end - seg.base:])
    rec = encode("lock.events", "SN9", 1000, 1, 1_700_000_001_000_000, b"late")
    with open(seg.path, "r+b") as f:
        f.seek(end - seg.base)
        f.write(rec[:visible])
    assert plan.latest(logs)[logs[0].key] == end
    stats = DecodeStats()
    rows = list(decode_file(seg.path, seg.base, closed=False, stats=stats))
    assert sum(b.num_rows for b in rows) == 30 and stats.corrupt == 0
    assert 0 < stats.torn_bytes <= visible
    closed = DecodeStats()   # the same bytes in a closed segment are damage
    list(decode_file(seg.path, seg.base, closed=True, stats=closed))
    assert closed.corrupt == 1
    with open(seg.path, "r+b") as f:
        f.seek(end - seg.base + visible)
        f.write(rec[visible:])
    assert plan.latest(logs)[logs[0].key] == end + len(rec)
    tab = pa.Table.from_batches(list(decode_file(seg.path, seg.base, start=end - seg.base,
                                                 closed=False)))
    assert tab["seq"].to_pylist() == [1000]


def test_packing_many_small_segments(tmp_path):
    d = str(tmp_path / "data")
    _write(d, 3000, segment_bytes=4096)
    logs = find_logs(d)
    segs = logs[0].segments()
    assert len(segs) > 40
    items, missing = plan.pieces(logs, plan.earliest(logs), plan.latest(logs))
    parts = plan.pack(items, max_partition_bytes=64 << 20, min_partitions=2, min_partition_bytes=0)
    assert len(parts) == 2
    parts = plan.pack(items, max_partition_bytes=40_000, min_partitions=1)
    total = sum(s.size for s in segs)
    assert len(parts) == -(-total // 40_000) or len(parts) == -(-total // 40_000) + 1
    # every record exactly once, whatever the cut
    n = sum(b.num_rows for pp in parts for p in pp
            for b in decode_file(p.path, p.base, None, p.start, p.end))
    assert n == 3000


def test_packing_fills_every_core_in_the_last_wave(tmp_path):
    """A log of ~3 maximum partitions on 2 cores is cut in 4 equal ones, not 3 (one
    core would idle through the third)."""
    d = str(tmp_path / "data")
    _write(d, 3000, segment_bytes=1 << 30)
    logs = find_logs(d)
    items, _ = plan.pieces(logs, plan.earliest(logs), plan.latest(logs))
    total = sum(p.size for p in items)
    parts = plan.pack(items, max_partition_bytes=total // 3 + 1, min_partitions=2, min_partition_bytes=0)
    assert len(parts) == 4
    assert max(sum(p.size for p in pp) for pp in parts) <= total // 4 + 200  # equal, to a record


def test_split_big_segment_on_record_boundaries(tmp_path):
    d = str(tmp_path / "data")
    _write(d, 5000, segment_bytes=1 << 30)
    logs = find_logs(d)
    items, _ = plan.pieces(logs, plan.earliest(logs), plan.latest(logs))
    assert len(items) == 1
    parts = plan.pack(items, max_partition_bytes=64 << 20, min_partitions=4, min_partition_bytes=0)
    assert len(parts) >= 4
    stats = DecodeStats()
    seqs = [s for pp in parts for p in pp
            for b in decode_file(p.path, p.base, None, p.start, p.end, stats=stats)
            for s in b.column("seq").to_pylist()]
    assert sorted(seqs) == list(range(5000)) and stats.corrupt == 0


def test_read_limits(tmp_path):
    d = str(tmp_path / "data")
    _write(d, 400, segment_bytes=4096)
    logs = find_logs(d)
    start, end = plan.earliest(logs), plan.latest(logs)
    cut = plan.limit_offsets(logs, start, end, max_records=123)
    items, _ = plan.pieces(logs, start, cut)
    n = sum(b.num_rows for p in items for b in decode_file(p.path, p.base, None, p.start, p.end))
    assert n == 123
    cut2 = plan.limit_offsets(logs, start, end, max_bytes=10_000)
    assert 0 < cut2[logs[0].key] <= 10_000
    one = plan.limit_offsets(logs, start, end, max_bytes=1)  # always progress by a record
    assert one[logs[0].key] > 0


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such log directory"):
        find_logs(str(tmp_path / "nope"))


def test_retention_gap_is_skipped_and_counted(tmp_path):
    d = str(tmp_path / "data")
    _write(d, 600, segment_bytes=4096)
    logs = find_logs(d)
    start = plan.earliest(logs)
    gone = list_segments(d)[:3]
    for s in gone:
        os.remove(s.path)
    items, missing = plan.pieces(logs, start, plan.latest(logs))
    assert missing == sum(s.size for s in gone)
    assert items[0].base == gone[-1].end


def test_split_points_come_from_the_topic_indexes(tmp_path, fleet_records):
    d = str(tmp_path / "data")
    generate.write_store(d, fleet_records, segment_bytes=8 << 20)  # one segment, indexes beside it
    logs = plan.discover([d])
    idx = plan.TopicIndexes(logs[0].key)
    tab = _decode_dir(d)
    assert idx.starts.tolist() == sorted(tab["offset"].to_pylist())
    items, _ = plan.pieces(logs, plan.earliest(logs), plan.latest(logs))
    assert len(items) == 1
    cutter = plan._Cutter(items[0], idx)
    cut = cutter.cut(0, items[0].size // 2)
    assert cutter.from_index == 1 and cut in idx.starts.tolist()
    parts = plan.pack(items, min_partitions=4, min_partition_bytes=0)
    assert len(parts) == 4
    got = sorted(o for pp in parts for p in pp for b in decode_file(p.path, p.base, None, p.start, p.end)
                 for o in b.column("offset").to_pylist())
    assert got == sorted(tab["offset"].to_pylist())
    # a stale index entry (not a record start) is not trusted: the cut falls back to walking
    stale = plan.TopicIndexes(logs[0].key)
    stale._starts = idx.starts + 3
    c2 = plan._Cutter(items[0], stale)
    assert c2.cut(0, items[0].size // 2) in idx.starts.tolist() and c2.from_index == 0
