"""Damage is not a torn tail (issue 34): a flipped byte or a lost file end anywhere
but at the end of the active segment costs only the damaged records; every intact
acknowledged record after it stays readable at its queue offset, and the store says
exactly what was lost."""

from __future__ import annotations

import os
import shutil

import pytest

from lockmq.store import Store
from lockmq.store.inspect import check_dir
from lockmq.store.names import list_segments, segment_name

from .helpers import config, payload_for, rec, run

SEG = 4096
N = 600


@pytest.fixture(scope="module")
def _stopped_store(tmp_path_factory):
    """A cleanly stopped store of several segments, two topics; every record acked."""
    d = tmp_path_factory.mktemp("dmg") / "data"
    acked = []

    async def main():
        s = Store.open(config(d, segment_bytes=SEG))
        for i in range(0, N, 20):
            recs = [rec("a" if k % 3 else "b", f"L{k % 5}", k) for k in range(i, i + 20)]
            for r, a in zip(recs, await s.append(recs)):
                acked.append((a.offset, a.topic, a.queue_offset, r.sn, r.seq))
        await s.close()
    run(main())
    return d, acked


@pytest.fixture
def store_dir(_stopped_store, tmp_path):
    d0, acked = _stopped_store
    d = tmp_path / "data"
    shutil.copytree(d0, d)
    return d, acked


def _flip(d, offset):
    seg_dir = os.path.join(d, "message.log")
    base = max(b for b in list_segments(seg_dir) if b <= offset)
    with open(os.path.join(seg_dir, segment_name(base)), "r+b") as f:
        f.seek(offset - base)
        b = f.read(1)[0]
        f.seek(offset - base)
        f.write(bytes([b ^ 0x40]))


def _victim(d, acked):
    """A record in the middle of a closed segment (not the first, not the last)."""
    bases = list_segments(os.path.join(d, "message.log"))
    assert len(bases) >= 5
    seg = bases[len(bases) // 2]
    inside = [r for r in acked if seg < r[0] < bases[bases.index(seg) + 1] - 100]
    return inside[len(inside) // 2]


def _read_all(s):
    return {t: s.read(t, 0, 10 * N) for t in ("a", "b")}


@pytest.mark.parametrize("checkpoint", [True, False])
def test_a_flipped_byte_in_a_closed_segment_costs_one_record(store_dir, checkpoint):
    d, acked = store_dir
    victim = _victim(d, acked)
    _flip(d, victim[0] + 45)            # a byte of its topic/sn/payload
    if not checkpoint:
        os.unlink(os.path.join(d, "checkpoint"))
    s = Store.open(config(d, segment_bytes=SEG))
    assert s.recovery.bytes_cut == 0
    if not checkpoint:   # the scan finds it at open
        assert s.recovery.full_scan and len(s.recovery.damage) == 1
    got = _read_all(s)
    for t in ("a", "b"):
        want = [(q, o, sn, seq) for o, tt, q, sn, seq in acked if tt == t and o != victim[0]]
        assert [(r.queue_offset, r.offset, r.sn, r.seq) for r in got[t]] == want
        for r in got[t]:
            assert r.payload == payload_for(r.sn, r.seq)
    # a read from the damaged queue offset itself goes on with the next record
    nxt = s.read(victim[1], victim[2], 1)
    assert nxt and nxt[0].queue_offset == victim[2] + 1
    [dmg] = s.damage
    assert dmg.start == victim[0] and dmg.topics == {victim[1]: [victim[2]]}
    assert dmg.acked in ("yes", "probably")
    assert s.damage_at(victim[1], victim[2]) is dmg
    assert s.stats["damaged_records"] == 1
    s.close_sync()
    rep = check_dir(str(d))
    assert not rep.ok and len(rep.problems) == 1, rep.problems
    assert "quarantined by the broker" in rep.problems[0]
    assert f"[{victim[0]}," in rep.problems[0]
    assert rep.records == N - 1
    assert not any("index" in p for p in rep.problems)
    s = Store.open(config(d, segment_bytes=SEG))   # it stays known after a restart
    assert [x.start for x in s.damage] == [victim[0]] and not s.recovery.damage
    s.close_sync()


@pytest.mark.parametrize("flip", [False, True])
def test_a_truncated_index_with_the_checkpoint_intact_loses_nothing(store_dir, flip):
    d, acked = store_dir
    victim = _victim(d, acked)
    if flip:
        _flip(d, victim[0] + 45)
    path = os.path.join(d, "offset-a.log")
    with open(path, "r+b") as f:
        f.truncate(16 + 16 * 50)
    s = Store.open(config(d, segment_bytes=SEG))
    assert s.recovery.full_scan and s.recovery.bytes_cut == 0
    got = _read_all(s)
    for t in ("a", "b"):
        want = [(q, o) for o, tt, q, _sn, _seq in acked
                if tt == t and not (flip and o == victim[0])]
        assert [(r.queue_offset, r.offset) for r in got[t]] == want
    assert len(s.damage) == (1 if flip else 0)
    s.close_sync()


def test_zeros_over_several_records_and_a_lost_checkpoint(store_dir):
    d, acked = store_dir
    victim = _victim(d, acked)
    seg_dir = os.path.join(d, "message.log")
    base = max(b for b in list_segments(seg_dir) if b <= victim[0])
    with open(os.path.join(seg_dir, segment_name(base)), "r+b") as f:
        f.seek(victim[0] - base + 10)
        f.write(bytes(200))   # the header of the next records too
    os.unlink(os.path.join(d, "checkpoint"))
    for t in ("a", "b"):
        os.unlink(os.path.join(d, f"offset-{t}.log"))
    s = Store.open(config(d, segment_bytes=SEG))
    [dmg] = s.recovery.damage
    hit = [r for r in acked if r[0] < victim[0] + 210 and r[0] + 67 > victim[0] + 10]
    got = _read_all(s)
    for t in ("a", "b"):   # queue offsets come back from the next segment's queue start
        want = [(q, o) for o, tt, q, _sn, _seq in acked if tt == t and r_not_in(o, hit)]
        assert [(r.queue_offset, r.offset) for r in got[t]] == want
    for t in ("a", "b"):
        assert sorted(dmg.topics.get(t, [])) == sorted(r[2] for r in hit if r[1] == t)
    s.close_sync()


def r_not_in(offset, recs):
    return all(offset != r[0] for r in recs)


def test_a_deleted_active_segment_does_not_reuse_offsets(store_dir):
    """The checkpoint says more was durable than is on disk: that is damage too, and
    the log goes on after it, so no commit-log or queue offset is given out twice."""
    d, acked = store_dir
    seg_dir = os.path.join(d, "message.log")
    bases = list_segments(seg_dir)
    os.unlink(os.path.join(seg_dir, segment_name(bases[-1])))
    end = max(o for o, *_ in acked) + 67

    async def main():
        s = Store.open(config(d, segment_bytes=SEG))
        [dmg] = s.recovery.damage
        assert dmg.acked == "yes" and dmg.start == bases[-1] and s.log_end >= end
        lost = [r for r in acked if r[0] >= bases[-1]]
        assert dmg.records == len(lost)
        qa = s.queue_end("a")
        res = await s.append([rec("a", "NEW", 1)])
        assert res[0].queue_offset == qa == 1 + max(r[2] for r in acked if r[1] == "a")
        assert res[0].offset >= end
        got = s.read("a", 0, 10 * N)
        assert got[-1].sn == "NEW" and len(got) == len([r for r in acked if r[1] == "a"
                                                        and r[0] < bases[-1]]) + 1
        await s.close()
    run(main())


def test_the_cli_tells_the_truth_and_salvages(store_dir, tmp_path):
    import subprocess
    import sys
    d, acked = store_dir
    victim = _victim(d, acked)
    _flip(d, victim[0] + 45)
    os.unlink(os.path.join(d, "checkpoint"))
    exe = [os.path.join(os.path.dirname(sys.executable), "lockmq")]

    def cli(*a):
        return subprocess.run(exe + list(a), capture_output=True, text=True, timeout=60)
    before = cli("store", "check", str(d))
    assert before.returncode == 1 and "not quarantined yet" in before.stdout
    assert "recovery cuts" not in before.stdout and "CORRUPT: index" not in before.stdout
    Store.open(config(d, segment_bytes=SEG)).close_sync()
    after = cli("store", "check", str(d))
    assert after.returncode == 1 and "quarantined by the broker" in after.stdout
    assert f"{victim[1]} queue offsets {victim[2]}" in after.stdout
    listed = cli("store", "damage", str(d))
    assert listed.returncode == 1 and f"[{victim[0]}, " in listed.stdout
    out = tmp_path / "bytes"
    got = cli("store", "salvage", str(d), str(victim[0]), "--out", str(out))
    assert got.returncode == 0, got.stderr
    assert out.read_bytes()[:4] == (67 - 4).to_bytes(4, "little")


def test_a_lost_oldest_segment_is_not_taken_for_retention(store_dir):
    d, acked = store_dir
    seg_dir = os.path.join(d, "message.log")
    bases = list_segments(seg_dir)
    os.unlink(os.path.join(seg_dir, segment_name(bases[0])))
    s = Store.open(config(d, segment_bytes=SEG))
    [dmg] = s.recovery.damage
    assert (dmg.start, dmg.end) == (bases[0], bases[1]) and "retention left it" in dmg.reason
    lost = [r for r in acked if r[0] < bases[1]]
    assert dmg.records == len(lost)
    for t in ("a", "b"):
        want = [(q, o) for o, tt, q, _sn, _seq in acked if tt == t and o >= bases[1]]
        assert [(r.queue_offset, r.offset) for r in s.read(t, 0, 10 * N)] == want
        assert s.damage_at(t, 0) is dmg
    s.close_sync()
