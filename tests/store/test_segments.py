"""Segment / SegmentList own a segment's files; names.py owns every file name."""

from __future__ import annotations

import os

from lockmq.store import Store
from lockmq.store.names import (index_file_name, index_topic, positions_cluster,
                                positions_file_name, qstart_name, segment_base, segment_name)
from lockmq.store.segment import Segment, SegmentList

from .helpers import config, fill, run


def test_every_name_parses_back_and_other_names_are_refused():
    assert segment_name(4096) == "00000000000000004096.log"
    assert qstart_name(4096) == "00000000000000004096.qstart"
    assert segment_base(segment_name(4096)) == 4096
    assert index_topic(index_file_name("lock.events")) == "lock.events"
    assert positions_cluster(positions_file_name("$billing")) == "$billing"
    for stranger in ("4096.log", qstart_name(4096), "offset-.log", "consume-a.tmp",
                     "checkpoint", "00000000000000004096.log.tmp"):
        assert segment_base(stranger) is None
        assert index_topic(stranger) is None
        assert positions_cluster(stranger) is None


def test_a_segment_writes_reads_cuts_and_deletes_its_log_and_sidecar(tmp_path):
    seg_dir = str(tmp_path)
    seg = Segment.create(seg_dir, 1000)
    seg.write_at(b"hello world", 0)
    seg.write_qstart({"t": 7, "u": 0})
    seg.sync()
    assert seg.size() == 11 and seg.pread(5, 6) == b"world"
    assert Segment(seg_dir, 1000).read_qstart() == {"t": 7, "u": 0}
    seg.truncate(5, durable=True)
    with seg.mapped() as (mm, size):
        assert size == 5 and mm[:] == b"hello"
    seg.delete()
    assert os.listdir(seg_dir) == []


def test_a_damaged_or_missing_sidecar_reads_as_none(tmp_path):
    seg = Segment.create(str(tmp_path), 0)
    assert seg.read_qstart() is None
    seg.write_qstart({"t": 1})
    path = os.path.join(str(tmp_path), qstart_name(0))
    with open(path, "r+b") as f:
        f.write(b"[")  # the CRC no longer matches
    assert seg.read_qstart() is None
    seg.close()


def test_segment_list_finds_segments_and_never_deletes_the_active_one(tmp_path):
    seg_dir = str(tmp_path / "message.log")
    segs = SegmentList.open(seg_dir)  # an empty log starts with one empty segment at 0
    assert segs.bases == [0] and os.listdir(seg_dir) == [segment_name(0)]
    for base in (100, 250):
        new = Segment.create(seg_dir, base)
        new.write_qstart({})
        new.close()
        segs.roll(new)
    assert [segs.index_of(o) for o in (0, 99, 100, 249, 250, 10**9)] == [0, 0, 1, 1, 2, 2]
    assert segs.end_of(0, 300) == 100 and segs.end_of(2, 300) == 300
    gone = segs.delete_oldest(10)
    assert [b for b, _size in gone] == [0, 100] and segs.bases == [250]
    assert segs.active.base == 250 and sorted(os.listdir(seg_dir)) == [
        segment_name(250), qstart_name(250)]


def test_clusters_are_listed_by_name(data_dir):
    s = Store.open(config(data_dir))
    for name in ("a.b", "a", "b"):
        s.claim_cluster(name, "token:x", "t")
    assert s.clusters() == ["a", "a.b", "b"]
    s.close_sync()


def test_retention_deletes_a_segment_with_its_sidecar(data_dir):
    async def main():
        s = Store.open(config(data_dir, segment_bytes=1024, retention_ms=1))
        await fill(s, "t", "A", range(100), batch=5)
        seg_dir = os.path.join(str(data_dir), "message.log")
        before = sorted(os.listdir(seg_dir))
        rep = s.enforce_retention({}, now_ms=10**15)
        after = sorted(os.listdir(seg_dir))
        # the kept segment started at a roll (log_start > 0): it has its sidecar
        assert rep.deleted_segments and after == [segment_name(s.log_start),
                                                  qstart_name(s.log_start)]
        for base in rep.deleted_segments:
            assert segment_name(base) in before and qstart_name(base) not in after
        await s.close()
    run(main())


def test_backup_copies_the_run_of_segments_that_have_their_sidecars(tmp_path):
    """The backup keeps the run of segments from the first usable one: a segment
    whose sidecar is not written yet (being created) ends it, and every descriptor
    of a segment it leaves out is closed."""
    from lockmq.store.backup import _open_segments

    seg_dir = str(tmp_path)
    for base, sidecar in ((0, False), (100, True), (200, False), (300, True)):
        seg = Segment.create(seg_dir, base)
        if sidecar:
            seg.write_qstart({"t": base})
        seg.close()
    fds_before = len(os.listdir("/proc/self/fd"))
    kept = _open_segments(seg_dir)
    try:
        assert [(b, side >= 0) for b, _log, side in kept] == [(0, False), (100, True)]
        assert len(os.listdir("/proc/self/fd")) == fds_before + 3
    finally:
        for _b, log_fd, side_fd in kept:
            os.close(log_fd)
            if side_fd >= 0:
                os.close(side_fd)
    os.unlink(os.path.join(seg_dir, segment_name(0)))   # retention took the first one
    kept = _open_segments(seg_dir)
    assert [b for b, _log, _side in kept] == [100]
    for _b, log_fd, side_fd in kept:
        os.close(log_fd)
        os.close(side_fd)


def test_segment_at_refuses_an_offset_outside_the_log(data_dir):
    """Before the log start (deleted by retention) or past its end there is no
    segment: an error, not the active segment (a raw-log copier reading it would
    send the wrong bytes)."""
    import pytest

    async def main():
        s = Store.open(config(data_dir, segment_bytes=1024, retention_ms=1))
        await fill(s, "t", "A", range(100), batch=5)
        s.enforce_retention({}, now_ms=10**15)
        start, end = s.log_start, s.log_end
        assert start > 0
        assert s.segment_at(start)[0].base == start and s.segment_at(end)[1] == end
        for bad in (start - 1, 0, -1, end + 1):
            with pytest.raises(ValueError):
                s.segment_at(bad)
        await s.close()
    run(main())
