"""Consume positions: durable, merged, and never torn by a crash mid-save."""

from __future__ import annotations

import os
import random

import pytest

from lockmq.store import Store
from lockmq.store.positions import PositionsFile, parse

from .helpers import config, run


def test_save_load_merge_and_reopen(data_dir):
    async def main():
        s = Store.open(config(data_dir))
        assert s.load_positions("c1") == {}
        await s.save_positions("c1", {"locks": 5, "alarms": 1})
        await s.save_positions("c1", {"locks": 9})
        await s.save_positions("c2", {"locks": 2})
        assert s.load_positions("c1") == {"locks": 9, "alarms": 1}
        assert s.clusters() == ["c1", "c2"]
        with pytest.raises(ValueError):
            await s.save_positions("c1", {"locks": -1})
        with pytest.raises(ValueError):
            s.load_positions("bad/name")
        await s.close()
        s = Store.open(config(data_dir))
        assert s.load_positions("c1") == {"locks": 9, "alarms": 1}
        assert s.load_positions("c2") == {"locks": 2}
        s.close_sync()
    run(main())
    assert os.path.exists(os.path.join(data_dir, "consume-c1.log"))


def test_every_torn_prefix_loads_a_whole_earlier_save(tmp_path):
    pf = PositionsFile(str(tmp_path), "c")
    states = [{}]
    for i in range(12):
        pf.save({f"t{i % 3}": i * 7, "x": i})
        states.append(dict(pf.positions))
    pf.close()
    data = (tmp_path / "consume-c.log").read_bytes()
    seen = set()
    for cut in range(len(data) + 1):
        _gen, pos, _good = parse(data[:cut])
        assert pos in states
        seen.add(len(pos))
    # and a torn tail is dropped on open so that the next save appends after a good one
    rnd = random.Random(7)
    for _ in range(30):
        cut = rnd.randrange(len(data))
        (tmp_path / "consume-c.log").write_bytes(data[:cut])
        pf = PositionsFile(str(tmp_path), "c")
        before = pf.load()
        assert before in states
        pf.save({"new": 1})
        pf.close()
        again = PositionsFile(str(tmp_path), "c").load()
        assert again == {**before, "new": 1}


def test_flipped_byte_in_the_last_save_falls_back(tmp_path):
    pf = PositionsFile(str(tmp_path), "c")
    pf.save({"a": 1})
    pf.save({"a": 2})
    pf.close()
    path = tmp_path / "consume-c.log"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    assert PositionsFile(str(tmp_path), "c").load() == {"a": 1}


def test_file_is_compacted(tmp_path):
    pf = PositionsFile(str(tmp_path), "c", compact_bytes=2000)
    for i in range(500):
        pf.save({"t": i})
    pf.close()
    assert os.path.getsize(tmp_path / "consume-c.log") <= 2000
    assert PositionsFile(str(tmp_path), "c").load() == {"t": 499}


def test_owner_and_topic_are_kept_across_saves_reopen_and_go_with_delete(data_dir):
    async def main():
        s = Store.open(config(data_dir))
        assert s.cluster_meta("billing") == {}
        s.claim_cluster("billing", "token:billing", "lock.events", {"lock.events": 3})
        await s.save_positions("billing", {"lock.events": 7, "$retry.billing.0": 1})
        assert s.cluster_meta("billing") == {"owner": "token:billing", "topic": "lock.events"}
        await s.close()
        s = Store.open(config(data_dir))
        assert s.cluster_meta("billing") == {"owner": "token:billing", "topic": "lock.events"}
        assert s.load_positions("billing") == {"lock.events": 7, "$retry.billing.0": 1}
        assert s.delete_cluster("billing") and not s.delete_cluster("billing")
        assert s.cluster_meta("billing") == {} and s.clusters() == []
        s.close_sync()
    run(main())


def test_system_records_are_stored_whatever_the_dedup_table_says(data_dir):
    from lockmq.store import NewRecord

    async def main():
        s = Store.open(config(data_dir))
        await s.append([NewRecord("x", "$broker", 0xFFFFFFFF, 0, b"poison")])
        await s.close()
        s = Store.open(config(data_dir))      # the poisoned entry survives a restart ...
        res = await s.append([NewRecord("$devices", "$broker", 0, 0, b"online"),
                              NewRecord("$devices", "$broker", 1, 0, b"offline")])
        assert [a.duplicate for a in res] == [False, False]   # ... and changes nothing
        assert s.queue_end("$devices") == 2 and s.last_seq("$broker") == 1
        await s.close()
    run(main())
