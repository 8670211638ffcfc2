"""A lost or damaged positions file is detected and repaired from the second copy
(``positions.copy``), loudly (issue 34: deleting consume-c1.log replayed 20,000
acknowledged records with one INFO line)."""

from __future__ import annotations

import os

from lockmq.store import Store
from lockmq.store.positions import PositionsFile

from .helpers import config, fill, run


def _store_with_positions(data_dir, saves=5):
    async def main():
        s = Store.open(config(data_dir))
        await fill(s, "t", "A", range(100))
        s.claim_cluster("c1", "svc", "t", {"t": 0})
        for k in range(1, saves + 1):
            await s.save_positions("c1", {"t": k * 10})
        await s.close()
    run(main())


def _reopen(data_dir):
    s = Store.open(config(data_dir))
    return s, s.load_positions("c1"), list(s.positions_report)


def test_a_deleted_positions_file_is_restored_from_the_copy(data_dir):
    _store_with_positions(data_dir)
    os.unlink(data_dir / "consume-c1.log")
    s, pos, report = _reopen(data_dir)
    assert pos == {"t": 50}
    assert s.cluster_meta("c1") == {"owner": "svc", "topic": "t"}
    assert any("was missing: restored from the copy" in r for r in report)
    s.close_sync()
    s, pos, report = _reopen(data_dir)      # repaired: quiet now
    assert pos == {"t": 50} and not report
    s.close_sync()


def test_an_unreadable_positions_file_is_restored_or_reported_loudly(data_dir):
    _store_with_positions(data_dir, saves=1)
    path = data_dir / "consume-c1.log"
    with open(path, "wb") as f:              # compacted into garbage
        f.write(b"\x13" * 200)
    s, pos, report = _reopen(data_dir)
    assert pos == {"t": 10} and any("unreadable" in r and "restored" in r for r in report)
    assert os.path.exists(str(path) + ".damaged")
    s.close_sync()
    os.unlink(data_dir / "positions.copy")
    with open(path, "wb") as f:
        f.write(b"\x13" * 200)
    s, pos, report = _reopen(data_dir)
    assert pos == {} and any("RESTARTS FROM NOTHING" in r for r in report)
    assert "c1" not in s.clusters()
    s.close_sync()


def test_damage_in_the_middle_of_a_positions_file_costs_no_later_save(data_dir):
    _store_with_positions(data_dir)
    os.unlink(data_dir / "positions.copy")   # only the file itself to go by
    path = data_dir / "consume-c1.log"
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    pf = PositionsFile(str(data_dir), "c1")
    assert pf.state == "damaged" and pf.positions == {"t": 50}
    pf.close()
    s, pos, report = _reopen(data_dir)
    assert pos == {"t": 50} and any("damaged" in r for r in report)
    s.close_sync()
    assert PositionsFile(str(data_dir), "c1").state == "ok"   # rewritten clean


def test_a_deleted_cluster_stays_deleted(data_dir):
    _store_with_positions(data_dir)
    s = Store.open(config(data_dir))
    assert s.delete_cluster("c1")
    s.close_sync()
    s, pos, report = _reopen(data_dir)
    assert pos == {} and not report and "c1" not in s.clusters()
    s.close_sync()


def test_store_check_names_a_missing_positions_file(data_dir):
    from lockmq.store.inspect import check_dir
    _store_with_positions(data_dir)
    assert check_dir(str(data_dir)).ok
    os.unlink(data_dir / "consume-c1.log")
    rep = check_dir(str(data_dir))
    assert not rep.ok and "consume-c1.log: missing" in rep.problems[0]
