"""Crash recovery: torn and corrupt tails (many seeds), lost checkpoints and indexes."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from lockmq.store import Store
from lockmq.store.names import list_segments, segment_name
from lockmq.store.inspect import check_dir

from .helpers import config, payload_for, rec, run

SEG = 2048


def _crash_image(data_dir, tmp_path):
    """Build a directory as a crash would leave it: a checkpoint after phase 1, then a
    phase-2 tail that no checkpoint covers, and the active segment's preallocated
    zeros after it. Returns (image dir, checkpoint offset, [(offset, topic, sn, seq)]
    of every acknowledged record, the log end)."""
    cfg = dict(segment_bytes=SEG, checkpoint_interval_ms=10**9, checkpoint_bytes=10**12)
    acked = []

    async def main():
        s = Store.open(config(data_dir, **cfg))
        for i in range(60):
            r = [rec("a" if i % 3 else "b", f"S{i % 4}", i)]
            a = (await s.append(r))[0]
            acked.append((a.offset, a.topic, r[0].sn, r[0].seq))
        await s.close()
        s = Store.open(config(data_dir, **cfg))
        cp_end = s.log_end
        for i in range(60, 160):
            r = [rec("a" if i % 3 else "b", f"S{i % 4}", i, size=10 + i % 50)]
            a = (await s.append(r))[0]
            acked.append((a.offset, a.topic, r[0].sn, r[0].seq))
        image = tmp_path / "image"
        shutil.copytree(data_dir, image)  # the state at the crash: store still open
        log_end = s.log_end
        await s.close()
        return image, cp_end, log_end
    image, cp_end, log_end = run(main())
    return image, cp_end, acked, log_end


def _file_and_pos(image, offset):
    seg_dir = os.path.join(image, "message.log")
    bases = list_segments(seg_dir)
    base = max(b for b in bases if b <= offset)
    return os.path.join(seg_dir, segment_name(base)), offset - base


@pytest.fixture(scope="module")
def _crash_image_once(tmp_path_factory):
    base = tmp_path_factory.mktemp("crash")
    return _crash_image(base / "data", base)


@pytest.fixture
def crash_image(_crash_image_once, tmp_path):
    """A private copy of the crash image (tests damage it)."""
    image0, cp_end, acked, log_end = _crash_image_once
    image = tmp_path / "copy"
    shutil.copytree(image0, image)
    return image, cp_end, acked, log_end


@pytest.mark.parametrize("seed", range(40))
def test_random_tail_damage_is_cut_only_at_the_active_end(crash_image, tmp_path, seed):
    """Damage after the checkpoint: a torn end of the active segment is cut; damage
    anywhere else is quarantined and every intact record after it is kept, at its
    queue offset (issue 34: one flipped byte in a closed segment cut everything
    after it before)."""
    image0, cp_end, acked, end = crash_image
    image = tmp_path / f"img{seed}"
    shutil.copytree(image0, image)
    rnd = random.Random(seed)
    seg_dir = os.path.join(image, "message.log")
    bases = list_segments(seg_dir)
    last = os.path.join(seg_dir, segment_name(bases[-1]))
    kind = rnd.choice(["truncate", "flip", "zeros", "garbage"])
    p = rnd.randrange(cp_end, end)
    path, fpos = _file_and_pos(image, p)
    hit = (p, p + 1)   # commit-log bytes the damage touches
    if kind == "truncate":
        with open(path, "r+b") as f:
            f.truncate(fpos)
        for b in bases:  # a crash loses whole later segments too
            if b > p:
                os.unlink(os.path.join(seg_dir, segment_name(b)))
        hit = (p, 1 << 62)
    elif kind == "flip":
        with open(path, "r+b") as f:
            f.seek(fpos)
            byte = f.read(1)[0]
            f.seek(fpos)
            f.write(bytes([byte ^ (1 << rnd.randrange(8))]))
    elif kind == "zeros":
        n = rnd.randint(1, 300)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(fpos)
            f.write(bytes(min(n, size - fpos)))
        hit = (p, p + min(n, size - fpos))
    else:  # garbage where the preallocated zeros were
        with open(last, "r+b") as f:
            f.seek(end - bases[-1])
            f.write(rnd.randbytes(rnd.randint(1, 200)))
        hit = (end, end)
    offsets = sorted(acked)
    sizes = {}
    for (o1, *_), (o2, *_) in zip(offsets, offsets[1:]):
        sizes[o1] = o2 - o1
    sizes[offsets[-1][0]] = end - offsets[-1][0]
    qoff = {}
    for topic in ("a", "b"):
        for q, r in enumerate(r for r in offsets if r[1] == topic):
            qoff[r[0]] = q
    damaged = [r for r in offsets if r[0] < hit[1] and r[0] + sizes[r[0]] > hit[0]]
    intact = [r for r in offsets if r not in damaged]
    remaining = list_segments(seg_dir)
    active = remaining[-1]
    # torn: the damage reaches the end of the active segment's records
    torn = damaged and damaged[0][0] >= active and not any(
        r[0] > damaged[0][0] for r in intact)
    keep = intact
    cut_at = damaged[0][0] if torn else end
    with open(os.path.join(seg_dir, segment_name(active)), "rb") as f:
        end_after_damage = max(cut_at, active + len(f.read().rstrip(b"\0")))

    async def check():
        s = Store.open(config(image, segment_bytes=SEG))
        rep = s.recovery
        assert not rep.full_scan and rep.scanned_from == cp_end
        if kind == "garbage":
            assert s.log_end == end and rep.bytes_cut == end_after_damage - end
        elif torn:
            assert s.log_end == cut_at and not rep.damage
            assert rep.bytes_cut == end_after_damage - cut_at
            assert (rep.bytes_cut > 0) == (rep.records_cut > 0)
        else:
            assert s.log_end == end and rep.bytes_cut == 0
            assert rep.damage and rep.damage[0].start <= damaged[0][0]
            assert rep.damage[-1].end >= damaged[-1][0] + sizes[damaged[-1][0]]
        for topic in ("a", "b"):
            want = [r for r in keep if r[1] == topic]
            got = s.read(topic, 0, 1000)
            assert [(g.offset, g.sn, g.seq) for g in got] == [(w[0], w[2], w[3]) for w in want]
            # queue offsets do not move: a damaged record keeps its own
            assert [g.queue_offset for g in got] == [qoff[w[0]] for w in want]
            for g in got:
                assert g.payload == payload_for(g.sn, g.seq, len(g.payload))
        kept_ids = {(r[2], r[3]) for r in keep}
        lost = [r for r in offsets if (r[2], r[3]) not in kept_ids]
        # a lost record is new again (the lock will resend it); a kept one is a duplicate
        probe = [rec(r[1], r[2], r[3]) for r in lost[:3]] + [rec(keep[-1][1], keep[-1][2],
                                                                 keep[-1][3])]
        res = await s.append(probe)
        assert [a.duplicate for a in res] == [False] * len(lost[:3]) + [True]
        await s.close()
    run(check())
    rep = check_dir(str(image))
    assert rep.ok == (torn or kind == "garbage" or not damaged), rep.problems


def test_recovery_reads_only_the_tail(crash_image):
    image, cp_end, acked, log_end = crash_image
    seg_dir = os.path.join(image, "message.log")
    active = list_segments(seg_dir)[-1]
    with open(os.path.join(seg_dir, segment_name(active)), "rb") as f:
        data = f.read()
    assert len(data) == SEG and not any(data[log_end - active:])   # preallocated zeros
    s = Store.open(config(image, segment_bytes=SEG))
    assert s.log_end == log_end   # the zeros are where the records end, not a cut
    assert s.recovery.scanned_from == cp_end
    assert s.recovery.scanned_records == 100 and not s.recovery.bytes_cut
    assert s.recovery.scanned_bytes == s.log_end - cp_end
    s.close_sync()
    s = Store.open(config(image, segment_bytes=SEG))  # the open wrote a new checkpoint
    assert s.recovery.scanned_records == 0
    s.close_sync()


@pytest.mark.parametrize("damage", ["no-checkpoint", "bad-checkpoint", "index-deleted",
                                    "index-garbage", "index-torn-entry", "index-ahead"])
def test_indexes_are_rebuilt_from_the_log(crash_image, damage):
    image, _cp_end, acked, _log_end = crash_image
    if damage == "no-checkpoint":
        os.unlink(os.path.join(image, "checkpoint"))
    elif damage == "bad-checkpoint":
        with open(os.path.join(image, "checkpoint"), "r+b") as f:
            f.seek(10)
            f.write(b"\xff")
    elif damage == "index-deleted":
        os.unlink(os.path.join(image, "offset-a.log"))
    elif damage == "index-garbage":
        with open(os.path.join(image, "offset-a.log"), "r+b") as f:
            f.write(b"nonsense")
    elif damage == "index-torn-entry":
        with open(os.path.join(image, "offset-a.log"), "ab") as f:
            f.write(b"\x01\x02\x03")
    elif damage == "index-ahead":
        with open(os.path.join(image, "offset-b.log"), "ab") as f:
            f.write(bytes(16 * 5))
    s = Store.open(config(image, segment_bytes=SEG))
    for topic in ("a", "b"):
        want = sorted((o, sn, seq) for o, t, sn, seq in acked if t == topic)
        got = s.read(topic, 0, 1000)
        assert [(g.offset, g.sn, g.seq) for g in got] == want
    assert s.last_seq("S0") == max(seq for _o, _t, sn, seq in acked if sn == "S0")
    s.close_sync()
    assert check_dir(str(image)).ok


def test_empty_and_fresh_directories(data_dir):
    s = Store.open(config(data_dir))
    assert s.log_end == 0 and s.topics() == [] and s.recovery.bytes_cut == 0
    s.close_sync()
    s = Store.open(config(data_dir))
    assert s.log_end == 0
    s.close_sync()


@pytest.mark.parametrize("rebuild", ["checkpoint", "no-checkpoint", "no-index"])
def test_lost_tail_of_a_closed_segment_is_quarantined_and_the_rest_kept(crash_image, rebuild):
    """A closed segment that lost its end: the missing bytes are damage, every later
    segment stays, and the lost records keep their queue offsets -- from the index,
    or (rebuilding without one) from the next segment's queue start."""
    image, cp_end, acked, log_end = crash_image
    seg_dir = os.path.join(image, "message.log")
    bases = list_segments(seg_dir)
    assert len(bases) >= 3 and bases[-2] > cp_end
    victim = bases[-2]
    inside = sorted(o for o, *_ in acked if victim < o < bases[-1])
    boundary = inside[len(inside) // 2]  # drop the second half of the segment, cleanly
    with open(os.path.join(seg_dir, segment_name(victim)), "r+b") as f:
        f.truncate(boundary - victim)
    if rebuild != "checkpoint":
        os.unlink(os.path.join(image, "checkpoint"))
    if rebuild == "no-index":
        for t in ("a", "b"):
            os.unlink(os.path.join(image, f"offset-{t}.log"))
    s = Store.open(config(image, segment_bytes=SEG))
    rep = s.recovery
    assert s.log_end == log_end and not rep.bytes_cut
    assert list_segments(seg_dir) == bases
    [d] = rep.damage
    assert (d.start, d.end, d.segment) == (boundary, bases[-1], victim)
    lost = [(o, t) for o, t, _sn, _seq in acked if boundary <= o < bases[-1]]
    assert d.records == len(lost) == sum(len(q) for q in d.topics.values())
    for topic in ("a", "b"):
        mine = sorted(o for o, t, *_ in acked if t == topic)
        want = [(q, o) for q, o in enumerate(mine) if not boundary <= o < bases[-1]]
        got = s.read(topic, 0, 1000)
        assert [(g.queue_offset, g.offset) for g in got] == want
        assert sorted(d.topics.get(topic, [])) == [q for q, o in enumerate(mine)
                                                   if boundary <= o < bases[-1]]
    s.close_sync()
    rep = check_dir(str(image))
    assert not rep.ok and any("missing" in p for p in rep.problems)
    s = Store.open(config(image, segment_bytes=SEG))   # the damage list survives
    assert [x.start for x in s.damage] == [boundary] and not s.recovery.damage
    s.close_sync()


def test_an_idle_store_checkpoints_so_a_crash_rereads_nothing(data_dir, tmp_path):
    import asyncio

    async def main():
        s = Store.open(config(data_dir, checkpoint_interval_ms=50))
        await s.append([rec("t", "A", i) for i in range(50)])
        for _ in range(200):  # bounded wait for the background checkpoint
            await asyncio.sleep(0.02)
            if s.stats["checkpoints"] >= 2:
                break
        image = tmp_path / "image"
        shutil.copytree(data_dir, image)  # a crash now: no close
        await s.close()
        return image
    image = run(main())
    s = Store.open(config(image))
    assert s.recovery.scanned_records == 0 and s.queue_end("t") == 50
    assert s.last_seq("A") == 49
    s.close_sync()
