"""The ingest job: commit-log segments -> deduplicated Parquet partitioned by date.

    warehouse/
      events/date=YYYY-MM-DD/*.parquet      one row per message id (sn:seq)
      duplicates/date=YYYY-MM-DD/*.parquet  every further copy seen (retransmissions,
                                            overlapping exports, already-ingested ids)
      corrupt/*.parquet                      error rows (CRC mismatch ...) with raw bytes
      _lockmq/state.json                     checkpoint: log position reached per log

A run reads each log from its checkpointed position to its current end (both
fixed on the driver before reading, so the run is deterministic), keeps the
first copy of every message id (earliest broker time, then lowest offset) that
is not already in ``events``, appends it, and only then moves the checkpoint. A
rerun therefore reads nothing new; a run that died before its checkpoint is
redone and the anti-join against ``events`` keeps it from adding anything twice.
Timestamps are written as microseconds (TIMESTAMP_MICROS), dates are UTC dates
of the broker time.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field

from . import plan as planner

STATE_DIR = "_lockmq"
STATE_FILE = "state.json"


@dataclass
class IngestResult:
    """What one ingest run did."""

    run_id: str
    read: int = 0
    new: int = 0
    duplicates: int = 0
    corrupt: int = 0
    missing_bytes: int = 0
    logs: int = 0
    seconds: float = 0.0
    offsets: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for people."""
        return (f"ingest {self.run_id}: {self.logs} log(s), read {self.read} records, "
                f"{self.new} new, {self.duplicates} duplicate(s), {self.corrupt} corrupt, "
                f"{self.missing_bytes} bytes lost to retention, {self.seconds:.1f} s")


def load_state(warehouse: str) -> dict:
    """The checkpoint of a warehouse ({} if it has none)."""
    path = os.path.join(warehouse, STATE_DIR, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {}
    if not isinstance(doc, dict):
        raise ValueError(f"lockmq: {path} is not an ingest checkpoint")
    return doc


def save_state(warehouse: str, state: dict) -> None:
    """Write the checkpoint atomically (temp file, fsync, rename)."""
    d = os.path.join(warehouse, STATE_DIR)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{STATE_FILE}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(d, STATE_FILE))
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _has_table(path: str) -> bool:
    return os.path.isdir(path) and any(n.startswith("date=") or n.endswith(".parquet") for n in os.listdir(path))


def _parquet_files(path: str) -> set[str]:
    """The data files of a Parquet table now: names only, no footer is read (Spark's
    ``_temporary`` and hidden files left out)."""
    found: set[str] = set()
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        found.update(os.path.join(root, f) for f in files
                     if f.endswith(".parquet") and not f.startswith(("_", ".")))
    return found


def _rows_added(path: str, before: set[str]) -> int:
    """Rows in the files this run added to the table at ``path`` (listed as ``before``
    when it started writing): only the new files' footers are read, so the count
    costs what the run wrote, not the size of the whole table."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in _parquet_files(path) - before)


def ingest(spark, sources: list[str], warehouse: str, gateway_id: str | None = None,
           max_partition_bytes: int = planner.DEFAULT_MAX_PARTITION_BYTES) -> IngestResult:
    """Ingest the logs under ``sources`` into ``warehouse`` (see the module docstring)."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    warehouse = os.path.abspath(warehouse)
    os.makedirs(warehouse, exist_ok=True)
    state = load_state(warehouse)
    done: dict[str, int] = state.get("offsets", {})
    logs = planner.discover(sources, gateway_id)
    first = planner.earliest(logs)
    start = {k: max(done.get(k, v), 0) for k, v in first.items()}
    end = planner.latest(logs)
    end = {k: max(v, start[k]) for k, v in end.items()}
    _, missing = planner.pieces(logs, start, end)
    res = IngestResult(run_id=time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6],
                       logs=len(logs), missing_bytes=missing, offsets=end)
    if all(end[k] <= start[k] for k in end):
        res.seconds = time.monotonic() - t0
        return res
    options = {"paths": ",".join(os.path.abspath(s) for s in sources),
               "startingOffsets": json.dumps(start), "endingOffsets": json.dumps(end),
               "maxPartitionBytes": str(max_partition_bytes),
               "minPartitions": str(spark.sparkContext.defaultParallelism)}
    if gateway_id:
        options["gatewayId"] = gateway_id
    # write date partitions without sorting the rows first (falls back to sorting
    # past this many dates per task)
    spark.conf.set("spark.sql.maxConcurrentOutputFileWriters", "64")
    raw = spark.read.format("lockmq").options(**options).load()
    # Pass 1 (ids only, decoded alone): the few message ids that need a decision -- seen more than
    # once in this run, or already in `events` -- and the corrupt rows (null id).
    # Only message_id crosses the shuffle, and nothing is cached: caching all 18
    # decoded columns cost more than decoding the log a second time.
    ids = (spark.read.format("lockmq").options(**options, columns="message_id,error").load()
           .groupBy("message_id").agg(F.count(F.lit(1)).alias("_n"), F.count("error").alias("_bad")))
    events_path = os.path.join(warehouse, "events")
    if _has_table(events_path):
        known = spark.read.parquet(events_path).select("message_id").distinct().withColumn("_known", F.lit(True))
        ids = ids.join(known, "message_id", "left")
    else:
        ids = ids.withColumn("_known", F.lit(None).cast("boolean"))
    # Materialised before anything is written: appending to `events` makes Spark
    # refresh plans that read it, which would turn every new id into a known one.
    flagged = (ids.filter(F.col("message_id").isNull() | (F.col("_n") > 1) | F.col("_known").isNotNull())
               .select("message_id", "_n", "_bad", F.coalesce("_known", F.lit(False)).alias("_known"))
               .localCheckpoint(eager=True))
    bad_row = flagged.filter(F.col("message_id").isNull()).select("_bad").first()
    res.corrupt = int(bad_row["_bad"]) if bad_row else 0
    flagged = flagged.filter(F.col("message_id").isNotNull()).select("message_id", "_known")
    n_flagged = flagged.count()
    hint = F.broadcast(flagged) if n_flagged <= 2_000_000 else flagged
    # Pass 2 (all columns): ids seen once and never before go straight to the writer;
    # of the others, the earliest copy of an id not yet ingested is kept.
    good = raw.filter(F.col("error").isNull()).drop("error").withColumn("date", F.to_date("broker_ts"))
    plain = good.join(hint, "message_id", "left_anti")
    w = Window.partitionBy("message_id").orderBy(F.col("broker_ts").asc_nulls_last(), "gateway_id", "offset")
    special = good.join(hint, "message_id", "inner").withColumn("_copy", F.row_number().over(w))
    if n_flagged:
        # the flagged copies are few: keep them for the duplicates table (no third decode)
        special = special.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        winners = special.filter((F.col("_copy") == 1) & ~F.col("_known")).drop("_copy", "_known")
        cols = [c for c in good.columns if c != "date"] + ["date"]
        new = plain.select(cols).unionByName(winners.select(cols))
        before = _parquet_files(events_path)
        new.write.mode("append").partitionBy("date").parquet(events_path)
        res.new = _rows_added(events_path, before)
        if n_flagged:
            dups = (special.filter((F.col("_copy") > 1) | F.col("_known"))
                    .withColumn("reason", F.when(F.col("_known"), F.lit("already ingested"))
                                .otherwise(F.lit("repeated copy")))
                    .withColumn("ingest_run", F.lit(res.run_id)).drop("_copy", "_known", "payload"))
            dups_path = os.path.join(warehouse, "duplicates")
            before = _parquet_files(dups_path)
            dups.write.mode("append").partitionBy("date").parquet(dups_path)
            res.duplicates = _rows_added(dups_path, before)
    finally:
        special.unpersist()
    res.read = res.new + res.duplicates
    if res.corrupt:
        bad = raw.filter(F.col("error").isNotNull()).withColumn("ingest_run", F.lit(res.run_id))
        bad.write.mode("append").parquet(os.path.join(warehouse, "corrupt"))
    done.update(end)
    runs = state.get("runs", [])[-99:]
    res.seconds = time.monotonic() - t0
    runs.append({k: v for k, v in asdict(res).items() if k != "offsets"})
    save_state(warehouse, {"version": 1, "offsets": done, "runs": runs})
    return res
