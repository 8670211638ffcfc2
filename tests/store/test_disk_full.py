"""A full disk: refuse with StoreFull, keep every acknowledged record, never corrupt.

Uses a small tmpfs mounted by the test (needs root and a kernel that allows it;
skipped with the reason otherwise).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from lockmq.store import Store, StoreFull
from lockmq.store.inspect import check_dir

from .helpers import config, payload_for, rec, run


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_enospc_refuses_writes_and_keeps_acknowledged_records(small_fs):
    data = small_fs / "data"
    acked = []

    async def fill_up():
        s = Store.open(config(data, segment_bytes=64 * 1024, checkpoint_interval_ms=50))
        full = 0
        for i in range(3000):
            batch = [rec("t", f"S{i % 7}", i * 10 + k, size=700) for k in range(5)]
            try:
                res = await s.append(batch)
            except StoreFull as exc:
                assert "disk full" in str(exc)  # the real ENOSPC path, not the reserve
                full += 1
                if full >= 5:
                    break
                continue
            acked.extend((a.queue_offset, r.sn, r.seq) for a, r in zip(res, batch))
        assert full >= 5, "the file system never filled up"
        assert s.stats["store_full"] >= 5
        # still readable while full
        assert len(s.read("t", 0, 10**6)) == len(acked)
        await s.close()
    run(fill_up())
    assert acked

    async def reopen():
        s = Store.open(config(data, segment_bytes=64 * 1024))
        got = s.read("t", 0, 10**6)
        assert [(g.queue_offset, g.sn, g.seq) for g in got] == acked
        assert all(g.payload == payload_for(g.sn, g.seq, 700) for g in got)
        with pytest.raises(StoreFull):
            await s.append([rec("t", "X", 1, size=700) for _ in range(1)] +
                           [rec("t", "X", k, size=700) for k in range(2, 200)])
        await s.close()
    run(reopen())
    assert check_dir(str(data)).ok


def test_disk_reserve_refuses_before_the_disk_is_full(small_fs):
    data = small_fs / "data"

    async def main():
        s = Store.open(config(data, min_free_bytes=256 * 1024))
        stored = 0
        with pytest.raises(StoreFull, match="reserve"):
            for i in range(1000):
                await s.append([rec("t", "S", i, size=2000)])
                stored += 1
        st = os.statvfs(data)
        assert st.f_bavail * st.f_frsize >= 200 * 1024  # the reserve is still there
        assert s.queue_end("t") == stored
        await s.close()
    run(main())
    assert check_dir(str(data)).ok


@pytest.mark.parametrize("reserve", [0, 128 * 1024])
def test_no_room_for_the_zeros_ahead_still_stores_records(small_fs, reserve):
    """512 KiB of disk and 1 MiB of zeros wanted ahead: the records go in without
    them, until the records themselves fill the disk (or reach the reserve)."""
    data = small_fs / "data"

    async def main():
        s = Store.open(config(data, segment_bytes=4 << 20, preallocate_bytes=1 << 20,
                              min_free_bytes=reserve))
        stored = 0
        with pytest.raises(StoreFull):
            for i in range(1000):
                await s.append([rec("t", "S", i, size=1000)])
                stored += 1
        assert stored > 100   # hundreds of KB of records, not none
        got = s.read("t", 0, 10**6)
        assert [g.seq for g in got] == list(range(stored))
        await s.close()
        return stored
    stored = run(main())

    async def reopen():
        s = Store.open(config(data, segment_bytes=4 << 20))
        assert s.queue_end("t") == stored
        await s.close()
    run(reopen())
    assert check_dir(str(data)).ok
