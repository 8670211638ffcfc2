"""Preallocated segments: zeros ahead of the newest segment's last record, written by
the commit that needs them, cut off a segment at its roll, read as the records' end."""

from __future__ import annotations

import os
import shutil

import pytest

from lockmq import accel
from lockmq.replication.logcopy import LogCopy
from lockmq.store import Store, StoreConfig, writer
from lockmq.store.inspect import check_dir, iter_records
from lockmq.store.names import list_segments, segment_name

from .helpers import config, payload_for, rec, run

KiB = 1024
PATHS = ["python", pytest.param("compiled", marks=pytest.mark.skipif(
    not accel.COMPILED, reason=f"lockmq._core not in use: {accel.DESCRIPTION}"))]


def _files(data_dir) -> list[tuple[int, bytes]]:
    """(base, contents) of every segment file, oldest first."""
    seg_dir = os.path.join(data_dir, "message.log")
    out = []
    for base in list_segments(seg_dir):
        with open(os.path.join(seg_dir, segment_name(base)), "rb") as f:
            out.append((base, f.read()))
    return out


@pytest.fixture(params=PATHS)
def commit_path(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(writer, "_commit_write", None)
    return request.param


def test_zeros_are_written_ahead_once_per_half_chunk(data_dir, commit_path):
    """One record per commit: the file grows in steps of about half of
    preallocate_bytes, not at every commit, and always ends in zeros."""
    sizes = []

    async def main():
        s = Store.open(config(data_dir, segment_bytes=1 << 20, preallocate_bytes=16 * KiB))
        for i in range(400):
            await s.append([rec("t", "S", i)])
            ((_base, data),) = _files(data_dir)
            sizes.append(len(data))
            assert len(data) >= s.log_end + 8 * KiB and not any(data[s.log_end:])
        assert [r.seq for r in s.read("t", 0, 1000)] == list(range(400))
        log_end = s.log_end
        await s.close()
        return log_end
    log_end = run(main())
    grew = sum(1 for a, b in zip(sizes, sizes[1:]) if b != a)
    # ~40 KiB of records: the first commit and one more every ~8 KiB
    assert 3 <= grew <= log_end // (8 * KiB) + 1, sizes


def test_no_preallocation_keeps_the_file_at_its_last_record(data_dir, commit_path):
    async def main():
        s = Store.open(config(data_dir, segment_bytes=1 << 20, preallocate_bytes=0))
        for i in range(20):
            await s.append([rec("t", "S", i)])
            assert os.path.getsize(os.path.join(data_dir, "message.log",
                                                segment_name(0))) == s.log_end
        await s.close()
    run(main())


def test_a_roll_cuts_the_closed_segment_to_its_last_record(data_dir, commit_path):
    async def main():
        s = Store.open(config(data_dir, segment_bytes=4 * KiB, preallocate_bytes=2 * KiB))
        for i in range(0, 300, 3):   # some commits roll, some roll twice
            await s.append([rec("t", "S", i + k, size=40 + 60 * k) for k in range(3)])
        assert len(s._segments) > 5
        files = _files(data_dir)
        for (base, data), (nxt, _) in zip(files, files[1:]):
            assert base + len(data) == nxt   # no zeros left in a closed segment
        active, data = files[-1]
        assert len(data) > s.log_end - active and not any(data[s.log_end - active:])
        assert [r.seq for r in s.read("t", 0, 1000)] == list(range(300))
        await s.close()
    run(main())
    assert check_dir(str(data_dir)).ok


def test_a_crash_leaves_zeros_that_recovery_reads_as_the_end(data_dir, tmp_path):
    """The image of a store that is still open: not a damaged tail (nothing cut, no
    warning), and the reopened store writes its next records over the zeros."""
    image = tmp_path / "image"

    async def crash():
        s = Store.open(config(data_dir, segment_bytes=1 << 20))
        for i in range(50):
            await s.append([rec("t", "S", i)])
        shutil.copytree(data_dir, image)   # the files as a power cut leaves them
        log_end = s.log_end
        await s.close()
        return log_end
    log_end = run(crash())
    assert len(_files(image)[-1][1]) > log_end

    async def reopen():
        s = Store.open(config(image, segment_bytes=1 << 20))
        assert s.log_end == log_end
        assert s.recovery.bytes_cut == 0 and s.recovery.cut_reason == ""
        await s.append([rec("t", "S", i) for i in range(50, 60)])
        got = s.read("t", 0, 100)
        assert [r.seq for r in got] == list(range(60))
        assert all(r.payload == payload_for("S", r.seq) for r in got)
        await s.close()
    run(reopen())
    rep = check_dir(str(image))
    assert rep.ok and rep.log_bytes < len(_files(image)[-1][1]), rep.problems
    assert [r.seq for r in iter_records(str(image))] == list(range(60))


def test_a_standby_copy_cuts_the_zeros_of_a_former_primary(data_dir):
    """A data directory that was a primary's has zeros after its last record; the
    standby's copy writes and closes segments itself, so it starts at the end."""
    async def primary():
        s = Store.open(config(data_dir, segment_bytes=1 << 20))
        await s.append([rec("t", "S", i) for i in range(10)])
        log_end = s.log_end
        await s.close()
        return log_end
    log_end = run(primary())
    assert len(_files(data_dir)[-1][1]) > log_end
    copy = LogCopy(config(data_dir, segment_bytes=1 << 20))
    try:
        assert copy.end == log_end
        assert len(_files(data_dir)[-1][1]) == log_end
    finally:
        copy.close()


def test_preallocate_bytes_is_checked():
    with pytest.raises(ValueError, match="preallocate_bytes must be >= 0"):
        StoreConfig(preallocate_bytes=-1).validate()
    with pytest.raises(ValueError, match="preallocate_bytes must be an integer"):
        StoreConfig(preallocate_bytes=1.5).validate()   # type: ignore[arg-type]
