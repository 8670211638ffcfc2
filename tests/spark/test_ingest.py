"""The ingest job and `lockmq export`, on logs written by the real storage engine."""

from __future__ import annotations

import json
import os
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lockmq.export import ExportError, export
from lockmq.spark import generate
from lockmq.spark.ingest import ingest, load_state
from lockmq.spark.layout import list_segments


def test_ingest_then_rerun_adds_nothing(spark, store_log, fleet_records, tmp_path):
    wh = str(tmp_path / "wh")
    res = ingest(spark, [store_log], wh, gateway_id="gw-test")
    assert (res.read, res.new, res.duplicates, res.corrupt) == (len(fleet_records), len(fleet_records), 0, 0)
    events = spark.read.parquet(os.path.join(wh, "events"))
    assert events.count() == len(fleet_records)
    assert events.select("message_id").distinct().count() == len(fleet_records)
    assert {r.gateway_id for r in events.select("gateway_id").distinct().collect()} == {"gw-test"}
    dates = sorted(n for n in os.listdir(os.path.join(wh, "events")) if n.startswith("date="))
    assert dates  # partitioned by the UTC date of broker time
    one = next(p for p in os.scandir(os.path.join(wh, "events", dates[0])) if p.name.endswith(".parquet"))
    schema = pq.read_schema(one.path)
    assert schema.field("lock_ts").type in (pa.timestamp("us", tz="UTC"), pa.timestamp("us"))
    assert load_state(wh)["segments"]
    again = ingest(spark, [store_log], wh, gateway_id="gw-test")
    assert (again.read, again.new) == (0, 0)
    assert spark.read.parquet(os.path.join(wh, "events")).count() == len(fleet_records)


def test_dedup_across_two_overlapping_exports(spark, tmp_path, fleet_records):
    data = str(tmp_path / "gw1-data")
    n1 = len(fleet_records) * 2 // 3
    generate.write_store(data, fleet_records[:n1], segment_bytes=64 * 1024)
    exp_a, exp_b = str(tmp_path / "landing" / "a"), str(tmp_path / "landing" / "b")
    first = export(data, exp_a, gateway_id="gw-1")
    assert first.exported and export(data, exp_a, gateway_id="gw-1").exported == []  # twice: nothing new
    generate.write_store(data, fleet_records[n1:], segment_bytes=64 * 1024)
    second = export(data, exp_b, gateway_id="gw-1")  # a second box copy: overlaps all of A
    assert set(first.exported) < set(second.exported)
    manifest = json.load(open(os.path.join(exp_b, "manifest.json")))
    assert manifest["gateway_id"] == "gw-1" and all(len(s["sha256"]) == 64 for s in manifest["segments"].values())

    wh = str(tmp_path / "wh")
    ra = ingest(spark, [exp_a], wh)
    rb = ingest(spark, [exp_b], wh)
    assert ra.new == first.records and ra.duplicates == 0
    # B's copies of A's segments are the same segments (same gateway, base, first
    # record): recognised and not read again, so they are no duplicates either
    assert rb.read == rb.new == second.records - first.records
    assert rb.duplicates == 0
    events = spark.read.parquet(os.path.join(wh, "events"))
    assert events.count() == second.records == events.select("message_id").distinct().count()
    assert {r.gateway_id for r in events.select("gateway_id").distinct().collect()} == {"gw-1"}
    assert not os.path.isdir(os.path.join(wh, "duplicates"))
    # (dedup of copies met within one run: tests/spark/test_reports.py, two gateways)


def test_export_tar_and_parquet_without_java(tmp_path, fleet_records):
    data = str(tmp_path / "data")
    generate.write_store(data, fleet_records[:4000], segment_bytes=64 * 1024)
    tar = str(tmp_path / "out" / "gw.tar")
    os.makedirs(os.path.dirname(tar))
    r1 = export(data, tar, gateway_id="gw-9", parquet=str(tmp_path / "pq"))
    assert r1.exported and export(data, tar, gateway_id="gw-9").exported == []
    with tarfile.open(tar) as tf:
        names = tf.getnames()
        tf.extractall(tmp_path / "x", filter="data")
    assert "manifest.json" in names and len([n for n in names if n.startswith("message.log/")]) == len(r1.exported)
    for seg in list_segments(str(tmp_path / "x")):
        with open(seg.path, "rb") as a, open(os.path.join(data, "message.log", os.path.basename(seg.path)), "rb") as b:
            assert a.read() == b.read(seg.size)
    tab = pq.read_table(str(tmp_path / "pq"))
    assert tab.num_rows == r1.records
    assert tab.schema.field("broker_ts").type == pa.timestamp("us", tz="UTC")
    assert set(tab.column("gateway_id").to_pylist()) == {"gw-9"}
    with pytest.raises(ExportError, match="gateway"):
        export(data, tar, gateway_id="someone-else")
    with pytest.raises(ExportError, match="no such data directory"):
        export(str(tmp_path / "nope"), str(tmp_path / "d2"))


def test_export_include_active_then_grown(tmp_path, fleet_records):
    data = str(tmp_path / "data")
    generate.write_store(data, fleet_records[:100], segment_bytes=1 << 20)
    dest = str(tmp_path / "exp")
    assert export(data, dest, gateway_id="g").exported == []  # only the active segment exists
    r = export(data, dest, gateway_id="g", include_active=True)
    assert r.records == 100
    generate.write_store(data, fleet_records[100:150], segment_bytes=1 << 20)
    assert export(data, dest, gateway_id="g", include_active=True).records == 150  # re-copied, grown


def test_cli_export(tmp_path, fleet_records, capsys):
    from lockmq.cli import main

    data = str(tmp_path / "data")
    generate.write_store(data, fleet_records[:3000], segment_bytes=64 * 1024)
    assert main(["export", data, str(tmp_path / "e"), "--gateway-id", "gw"]) == 0
    assert "exported" in capsys.readouterr().out
    assert main(["export", data, str(tmp_path / "e"), "--gateway-id", "gw"]) == 0
    assert "nothing new" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "e")]) == 1


def test_cli_ingest_and_report(spark, store_log, fleet_records, tmp_path, capsys):
    """`lockmq spark ingest` / `report` in this process (they reuse the running session)."""
    from lockmq.cli import main
    from lockmq.spark import ingest_job

    wh = str(tmp_path / "wh")
    assert main(["spark", "ingest", store_log, "--warehouse", wh, "--gateway-id", "gw-cli"]) == 0
    assert f"{len(fleet_records)} new" in capsys.readouterr().out
    assert ingest_job.main([store_log, "--warehouse", wh]) == 0  # the spark-submit entry: nothing new
    assert " 0 new" in capsys.readouterr().out
    assert main(["spark", "report", "--warehouse", wh, "--only", "daily_activity", "--only", "seq_gaps"]) == 0
    out = capsys.readouterr().out
    assert "daily_activity" in out and "seq_gaps" in out
    assert os.path.isdir(os.path.join(wh, "reports", "daily_activity"))
    assert not spark.sparkContext._jsc.sc().isStopped()
