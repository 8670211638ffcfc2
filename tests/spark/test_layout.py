"""Spark reads the store's own format: one record encoder, one set of file names."""

from __future__ import annotations

import asyncio
import os

from lockmq.spark.layout import list_segments
from lockmq.spark.logwriter import LogWriter, encode
from lockmq.store import NewRecord, Store, StoreConfig


def test_logwriter_bytes_are_the_engines_bytes(tmp_path):
    recs = [NewRecord("lock.events", "SN1", 1, 1_700_000_000_000, b"\x01\x02"),
            NewRecord("$devices", "$broker", 2, 0, b"{}", {"retry": 1, "why": "caf\u00e9"})]

    async def main():
        s = Store.open(StoreConfig(data_dir=str(tmp_path / "engine"), min_free_bytes=0))
        await s.append(recs)
        stored = s.read("lock.events", 0, 1) + s.read("$devices", 0, 1)
        await s.close()
        return stored

    stored = asyncio.run(main())
    seg = list_segments(str(tmp_path / "engine"))[0]
    with open(seg.path, "rb") as f:
        engine_bytes = f.read()
    ours = b"".join(encode(r.topic, r.sn, r.seq, r.lock_ts_ms, st.broker_ts_us, r.payload,
                           r.headers) for r, st in zip(recs, stored))
    # the same records; the engine's newest segment has preallocated zeros after them
    assert engine_bytes[:len(ours)] == ours and not any(engine_bytes[len(ours):])


def test_logwriter_continues_the_newest_segment(tmp_path):
    w = LogWriter(str(tmp_path), segment_bytes=200)
    for i in range(10):
        w.append("t", "SN", i, 1, 1, b"x" * 20)
    w.close()
    segs = list_segments(str(tmp_path))
    assert len(segs) > 1 and os.path.basename(segs[-1].path) == f"{segs[-1].base:020d}.log"
    again = LogWriter(str(tmp_path), segment_bytes=200)
    assert again.offset == segs[-1].end


def test_logwriter_continues_a_store_after_its_last_record(tmp_path):
    """The engine's newest segment ends in preallocated zeros: the writer goes on
    after the records, not after the zeros."""
    d = str(tmp_path / "engine")

    async def main():
        s = Store.open(StoreConfig(data_dir=d, min_free_bytes=0))
        await s.append([NewRecord("t", "SN1", i, 1, b"x") for i in range(3)])
        await s.close()
        return s.log_end

    end = asyncio.run(main())
    w = LogWriter(d)
    assert w.offset == end
    w.append("t", "SN1", 3, 1, 1, b"y")
    w.close()

    async def reopen():
        s = Store.open(StoreConfig(data_dir=d, min_free_bytes=0))
        seqs = [r.seq for r in s.read("t", 0, 10)]
        await s.close()
        return seqs

    assert asyncio.run(reopen()) == [0, 1, 2, 3]
