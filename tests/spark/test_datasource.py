"""The `lockmq` PySpark data source: batch and streaming reads of real-engine logs."""

from __future__ import annotations

import os

import pytest

from lockmq.spark import generate
from lockmq.spark.layout import complete_end, list_segments
from lockmq.spark.logwriter import encode


def _stream_once(spark, src, out, ckpt, **options):
    reader = spark.readStream.format("lockmq")
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (reader.load(src).writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    assert q.awaitTermination(180)
    assert q.exception() is None
    return [p for p in q.recentProgress if p["numInputRows"] > 0]


def test_batch_read_matches_generated_records(spark, store_log, fleet_records):
    df = spark.read.format("lockmq").option("minPartitionBytes", 0).load(store_log)
    assert df.rdd.getNumPartitions() >= 2  # 21 small segments packed, not 21 tasks
    assert df.rdd.getNumPartitions() <= os.cpu_count() + 1
    rows = df.select("message_id", "topic", "lock_ts", "payload", "event_type", "error").collect()
    assert len(rows) == len(fleet_records)
    assert all(r.error is None for r in rows)
    want = {f"{r.sn}:{r.seq}": r for r in fleet_records}
    assert {r.message_id for r in rows} == set(want)
    for r in rows[::97]:
        g = want[r.message_id]
        assert bytes(r.payload) == g.payload and r.topic == g.topic
        assert round(r.lock_ts.timestamp() * 1000) == g.lock_ts_ms  # µs timestamps, UTC session
    n_events = sum(1 for r in fleet_records if r.topic == generate.EVENT_TOPIC)
    assert df.filter("event_type IS NOT NULL").count() == n_events
    ids = spark.read.format("lockmq").option("columns", "message_id,error").load(store_log)
    assert ids.columns == ["message_id", "error"]
    assert sorted(r.message_id for r in ids.collect()) == sorted(r.message_id for r in rows)


def test_registered_by_spark_itself(spark, store_log):
    """A session nobody called register() on (a new session has none of the parent's
    registrations) finds the source through the top-level ``pyspark_lockmq`` module."""
    from pyspark.sql.datasource import DataSource

    class Probe(DataSource):
        @classmethod
        def name(cls):
            return "lockmq_probe"

    spark.dataSource.register(Probe)
    fresh = spark.newSession()
    with pytest.raises(Exception, match="lockmq_probe"):  # the parent's registrations are not there
        fresh.read.format("lockmq_probe").load()
    assert fresh.read.format("lockmq").load(store_log).filter("error IS NULL").count() == \
        spark.read.format("lockmq").load(store_log).filter("error IS NULL").count() > 0


def test_schema_and_sql(spark, store_log):
    df = spark.read.format("lockmq").load(store_log)
    assert df.schema["lock_ts"].dataType.typeName() == "timestamp"
    df.createOrReplaceTempView("lockmq_log")
    (n,) = spark.sql("SELECT count(DISTINCT sn) FROM lockmq_log WHERE topic = 'lock.events'").first()
    assert n == 12


def test_stream_limits_torn_tail_rerun_and_retention(spark, tmp_path, fleet_records):
    """Three availableNow runs over one checkpoint, on a log the real engine writes."""
    src = str(tmp_path / "data")
    half = len(fleet_records) // 2
    generate.write_store(src, fleet_records[:half], segment_bytes=64 * 1024)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    # 1: read limit -> several micro-batches of at most 2000 records
    batches = _stream_once(spark, src, out, ckpt, maxRecordsPerTrigger=2000)
    assert len(batches) == -(-half // 2000)
    assert all(b["numInputRows"] <= 2000 for b in batches)
    assert spark.read.parquet(out).count() == half
    # 2: a writer is in the middle of a record on the live segment, over the zeros
    #    preallocated after its last record: nothing new to read
    seg = list_segments(src)[-1]
    with open(seg.path, "rb") as f:
        data = f.read()
    at = complete_end(data, 0, len(data))   # the records' end
    assert at < len(data)
    rec = encode("lock.events", "LATE1", 1, 1_767_225_600_000, 1_767_225_600_000_000, b"tail")
    with open(seg.path, "r+b") as f:
        f.seek(at)
        f.write(rec[:21])
    assert _stream_once(spark, src, out, ckpt, maxRecordsPerTrigger=2000) == []
    # 3: the record completes, more records arrive (new segments), and retention
    #    deletes the two oldest segments between runs
    with open(seg.path, "r+b") as f:
        f.seek(at + 21)
        f.write(rec[21:])
    for old in list_segments(src)[:2]:
        os.remove(old.path)
    generate.write_store(src, fleet_records[half:], segment_bytes=64 * 1024)
    batches = _stream_once(spark, src, out, ckpt, maxBytesPerTrigger=300_000)
    assert len(batches) >= 2
    got = spark.read.parquet(out)
    assert got.count() == len(fleet_records) + 1
    assert got.select("message_id").distinct().count() == len(fleet_records) + 1
    late = got.filter("sn = 'LATE1'").collect()
    assert len(late) == 1 and late[0].error is None and bytes(late[0].payload) == b"tail"


def test_batch_offsets_options(spark, store_log):
    segs = list_segments(store_log)
    key = os.path.abspath(store_log)
    start = segs[5].base
    df = (spark.read.format("lockmq").option("startingOffsets", f'{{"{key}": {start}}}')
          .option("endingOffsets", f'{{"{key}": {segs[7].base}}}').load(store_log))
    offs = [r.offset for r in df.select("offset").collect()]
    assert min(offs) == start and max(offs) < segs[7].base
    with pytest.raises(Exception, match="offsets must be"):
        spark.read.format("lockmq").option("startingOffsets", "bogus").load(store_log).count()
