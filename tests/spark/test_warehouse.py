"""The warehouse behaves like a table: progress by content, one writer, atomic runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest

from lockmq.export import export
from lockmq.spark import generate, ingest as ingest_mod, warehouse
from lockmq.spark.ingest import ingest
from lockmq.spark.warehouse import WarehouseBusy, WarehouseLock


@pytest.fixture(scope="module")
def landing_src(tmp_path_factory, fleet_records):
    """A gateway's data directory and its export (several closed segments + the active one)."""
    root = tmp_path_factory.mktemp("wh-landing")
    data = str(root / "data")
    generate.write_store(data, fleet_records[:3000], segment_bytes=64 * 1024)
    exp = export(data, str(root / "landing" / "gw-1"), gateway_id="gw-1", include_active=True)
    assert exp.records == 3000
    return str(root / "landing"), 3000


def _rows(wh: str, table: str = "events") -> int:
    path = os.path.join(wh, table)
    return pq.read_table(path).num_rows if os.path.isdir(path) else 0


def test_moved_and_copied_landing_is_recognised(spark, landing_src, tmp_path):
    src, n = landing_src
    landing = str(tmp_path / "landing")
    shutil.copytree(src, landing)
    wh = str(tmp_path / "wh")
    assert ingest(spark, [landing], wh).new == n
    moved = str(tmp_path / "mnt" / "elsewhere")
    os.makedirs(os.path.dirname(moved))
    os.rename(landing, moved)
    again = ingest(spark, [moved], wh)
    assert (again.read, again.new, again.duplicates) == (0, 0, 0)
    copy = str(tmp_path / "copy")
    shutil.copytree(moved, copy)
    both = ingest(spark, [moved, copy], wh)  # the same segments twice: still nothing
    assert (both.read, both.duplicates) == (0, 0)
    assert _rows(wh) == n and _rows(wh, "duplicates") == 0


def test_copies_of_one_segment_in_one_run_are_read_once(spark, landing_src, tmp_path):
    src, n = landing_src
    wh = str(tmp_path / "wh")
    copy = str(tmp_path / "copy")
    shutil.copytree(src, copy)
    res = ingest(spark, [src, copy], wh)
    assert (res.read, res.new, res.duplicates) == (n, n, 0)


def test_second_ingest_fails_clearly_while_another_holds_the_warehouse(spark, landing_src, tmp_path):
    src, n = landing_src
    wh = str(tmp_path / "wh")
    # another process (a real second ingest would be one) takes the warehouse's lock
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from lockmq.spark.warehouse import WarehouseLock\n"
         "with WarehouseLock(sys.argv[1], 'other-run'):\n"
         "    print('held', flush=True); sys.stdin.readline()", wh],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WarehouseBusy, match=r"another ingest .*other-run"):
            ingest(spark, [src], wh)
        assert _rows(wh) == 0
        from lockmq.cli import main
        assert main(["spark", "ingest", src, "--warehouse", wh]) == 1
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert ingest(spark, [src], wh).new == n  # released when its holder ended


def test_ingest_waits_for_the_lock_when_asked(spark, landing_src, tmp_path):
    src, n = landing_src
    wh = str(tmp_path / "wh")
    lock = WarehouseLock(wh, "short-run").__enter__()
    threading.Timer(1.0, lock.__exit__, (None, None, None)).start()
    assert ingest(spark, [src], wh, wait=60).new == n


def test_a_run_that_died_before_its_commit_left_nothing(spark, landing_src, tmp_path, monkeypatch):
    src, n = landing_src
    wh = str(tmp_path / "wh")

    def crash(*_a, **_k):
        raise RuntimeError("power cut")

    monkeypatch.setattr(ingest_mod, "commit", crash)
    with pytest.raises(RuntimeError):
        ingest(spark, [src], wh)
    monkeypatch.undo()
    assert not os.path.isdir(os.path.join(wh, "events"))
    res = ingest(spark, [src], wh)
    assert (res.new, res.duplicates) == (n, 0)
    assert not os.listdir(os.path.join(wh, "_lockmq", "staging")) if os.path.isdir(
        os.path.join(wh, "_lockmq", "staging")) else True


def test_a_commit_cut_half_way_is_finished_by_the_next_run(spark, landing_src, tmp_path, monkeypatch):
    src, n = landing_src
    wh = str(tmp_path / "wh")
    real = warehouse._apply_moves

    def half(root, moves):
        real(root, moves[: len(moves) // 2])
        raise RuntimeError("power cut during the moves")

    monkeypatch.setattr(warehouse, "_apply_moves", half)
    with pytest.raises(RuntimeError):
        ingest(spark, [src], wh)
    monkeypatch.undo()
    assert "commit" in json.load(open(os.path.join(wh, "_lockmq", "state.json")))
    res = ingest(spark, [src], wh)
    assert (res.read, res.new, res.duplicates) == (0, 0, 0)  # the progress was committed with the moves
    assert _rows(wh) == n and _rows(wh, "duplicates") == 0
    assert "commit" not in json.load(open(os.path.join(wh, "_lockmq", "state.json")))


def test_a_version_1_checkpoint_is_carried_over(spark, landing_src, tmp_path):
    src, n = landing_src
    wh = str(tmp_path / "wh")
    assert ingest(spark, [src], wh).new == n
    # what the path-keyed ingest wrote: its position per log folder
    from lockmq.spark import plan
    logs = plan.discover([src])
    warehouse.save_state(wh, {"version": 1, "offsets": plan.latest(logs), "runs": []})
    res = ingest(spark, [src], wh)
    assert (res.read, res.duplicates) == (0, 0)
    assert warehouse.load_state(wh)["version"] == warehouse.STATE_VERSION


def test_a_restarted_log_is_new_data(spark, tmp_path, fleet_records):
    """Same gateway, same base offset, other records (the box was wiped): not skipped."""
    wh = str(tmp_path / "wh")
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    generate.write_store(a, fleet_records[:500], segment_bytes=1 << 20)
    generate.write_store(b, fleet_records[500:900], segment_bytes=1 << 20)
    assert ingest(spark, [a], wh, gateway_id="gw").new == 500
    assert ingest(spark, [b], wh, gateway_id="gw").new == 400


def test_a_warehouse_without_key_index_is_indexed_from_events(spark, landing_src, tmp_path):
    """A warehouse written before the key index: the stored ids are read from
    ``events`` once, so another gateway's copies still count as duplicates."""
    src, n = landing_src
    wh = str(tmp_path / "wh")
    assert ingest(spark, [src], wh).new == n
    shutil.rmtree(os.path.join(wh, "_lockmq", "keys"))
    other = ingest(spark, [src], wh, gateway_id="gw-relabelled")  # other identity: read again
    assert (other.read, other.new, other.duplicates) == (n, 0, n)
    assert warehouse.key_index(wh)  # rebuilt, and kept for the next run
    assert _rows(wh) == n
