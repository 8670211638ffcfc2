"""`lockmq export` says what it did, and what to do when it did nothing (no Spark needed)."""

from __future__ import annotations

from lockmq.export import export
from lockmq.spark import generate


def test_all_in_the_active_segment_names_include_active(tmp_path, fleet_records, capsys):
    from lockmq.cli import main

    data = str(tmp_path / "data")
    generate.write_store(data, fleet_records[:120], segment_bytes=1 << 20)
    res = export(data, str(tmp_path / "exp"), gateway_id="g")
    assert res.exported == [] and res.active_records == 120
    assert "--include-active" in res.summary() and "120 record(s)" in res.summary()
    assert main(["export", data, str(tmp_path / "exp"), "--gateway-id", "g"]) == 0
    assert "--include-active" in capsys.readouterr().out


def test_a_repeated_include_active_export_of_an_unchanged_segment_says_so(tmp_path, fleet_records):
    data, dest = str(tmp_path / "data"), str(tmp_path / "exp")
    generate.write_store(data, fleet_records[:120], segment_bytes=1 << 20)
    first = export(data, dest, gateway_id="g", include_active=True)
    assert first.records == 120 and "active segment's complete records included" in first.summary()
    again = export(data, dest, gateway_id="g", include_active=True)
    assert again.exported == [] and again.records == 0
    assert "unchanged since the last export (120 records)" in again.summary()
    generate.write_store(data, fleet_records[120:130], segment_bytes=1 << 20)
    assert export(data, dest, gateway_id="g", include_active=True).records == 130  # grown: copied again


def test_tar_export_skips_an_unchanged_active_segment_too(tmp_path, fleet_records):
    data, dest = str(tmp_path / "data"), str(tmp_path / "gw.tar")
    generate.write_store(data, fleet_records[:50], segment_bytes=1 << 20)
    assert export(data, dest, gateway_id="g", include_active=True).records == 50
    assert "unchanged" in export(data, dest, gateway_id="g", include_active=True).summary()


def test_nothing_new_with_closed_segments_already_there(tmp_path, fleet_records):
    data, dest = str(tmp_path / "data"), str(tmp_path / "exp")
    generate.write_store(data, fleet_records[:3000], segment_bytes=64 * 1024)
    first = export(data, dest, gateway_id="g")
    assert first.exported and "included" not in first.summary()
    again = export(data, dest, gateway_id="g")
    assert again.exported == [] and f"{len(first.exported)} segment(s) already there" in again.summary()
