"""Ingest counts new rows from the files the run itself wrote (pyarrow only, no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from lockmq.spark.ingest import _parquet_files, _rows_added


def _write(path, rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"message_id": [f"s:{i}" for i in range(rows)]}), str(path))


def test_only_the_files_added_since_the_listing_are_counted(tmp_path):
    table = tmp_path / "events"
    _write(table / "date=2026-11-23" / "part-0-old.parquet", 7)
    before = _parquet_files(str(table))
    _write(table / "date=2026-11-23" / "part-1-new.parquet", 3)
    _write(table / "date=2026-11-24" / "part-2-new.parquet", 2)
    _write(table / "_temporary" / "0" / "part-3-aborted.parquet", 100)   # not committed
    (table / "date=2026-11-24" / ".part-2-new.parquet.crc").write_bytes(b"crc")
    assert _rows_added(str(table), before) == 5
    assert _rows_added(str(table), _parquet_files(str(table))) == 0


def test_an_old_file_is_never_opened(tmp_path):
    """The whole table's footers were read twice per run before; now only new ones."""
    table = tmp_path / "events"
    (table / "date=2026-11-23").mkdir(parents=True)
    (table / "date=2026-11-23" / "part-0-old.parquet").write_bytes(b"not parquet")
    before = _parquet_files(str(table))
    _write(table / "date=2026-11-24" / "part-1-new.parquet", 4)
    assert _rows_added(str(table), before) == 4
