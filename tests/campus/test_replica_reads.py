"""How replication reads the commit log: through ``Store.segment_at`` (the store's one
public view of its segments), never the store's private segment list."""

from __future__ import annotations

import asyncio

from lockmq.store import NewRecord, Store
from lockmq.store.config import StoreConfig


def test_segment_at_names_the_segment_and_its_end_across_rolls(tmp_path) -> None:
    async def run() -> None:
        store = Store.open(StoreConfig(data_dir=str(tmp_path), segment_bytes=1024))
        try:
            for seq in range(40):   # ~100 B each: several 1 KiB segments
                await store.append([NewRecord("ev", "lk", seq, 0, b"x" * 64)])
            end = store.log_end
            seg, seg_end = store.segment_at(0)
            assert seg.base == 0 and 0 < seg_end < end
            nxt, _ = store.segment_at(seg_end)          # a segment's end is the next base
            assert nxt.base == seg_end
            assert store.segment_at(seg_end - 1)[0].base == 0
            active, active_end = store.segment_at(end)  # the log end: the active segment
            assert active_end == end and active.base <= end
            first = seg.pread(4, 0)                     # raw bytes: a record's length
            assert 0 < int.from_bytes(first, "little") < 1024
        finally:
            await store.close()

    asyncio.run(run())
