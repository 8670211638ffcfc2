"""The ingest job: commit-log segments -> deduplicated Parquet partitioned by date.

    warehouse/
      events/date=YYYY-MM-DD/*.parquet      one row per message id (sn:seq)
      duplicates/date=YYYY-MM-DD/*.parquet  every further copy of an id: another gateway
                                            heard it, the lock sent it twice, or it is
                                            already in events (never the same record twice)
      corrupt/*.parquet                      error rows (CRC mismatch ...) with raw bytes
      _lockmq/                               progress, the writer's lock, staging
                                             (:mod:`lockmq.spark.warehouse`)

A run takes the warehouse's lock, plans on the driver which bytes of which
segments are new (progress is kept per segment identity, so a moved landing is
not read again), then runs two Spark jobs of Python tasks, three when some ids repeat:

1. each task decodes its pieces once and writes every good row to Parquet itself
   (pyarrow, dictionary-encoded, one file per date) -- no row crosses to the JVM --
   and saves the 64-bit message keys it wrote as a sorted file;
2. one task per slice of the key space reads that slice of every key file and of
   the warehouse's key index and returns the *flagged* keys (more than one copy,
   or already stored): usually none or few;
3. only if there are some: each task takes the flagged rows out of its files and
   hands them to Spark, which keeps the earliest copy of each id (broker time,
   then gateway, offset) not yet in ``events`` and writes the others to
   ``duplicates``.

Jobs 1 and 2 are RDD jobs (:func:`_each`): no SQL plan, code generation or Arrow
stream for rows that do not exist -- on a fresh session the first such SQL job cost
~4 s of JVM CPU against ~1 s for the RDD job.

Everything goes to the run's staging folder; the commit moves it into the tables
with the new progress (a crash leaves either nothing or a commit the next run
finishes). Timestamps are microseconds, dates the UTC date of the broker time.
"""

from __future__ import annotations

import functools
import math
import os
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np

from . import ingest_tasks as tasks
from . import plan as planner
from .layout import list_segments, read_identity
from .warehouse import (
    INDEX_STAGE,
    SegmentWork,
    WarehouseLock,
    commit,
    key_index,
    load_state,  # noqa: F401  (re-exported: the checkpoint's reader)
    progress_of,
    recover,
    segment_id,
    staged_rows,
    staging_dir,
    STATE_VERSION,
)


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
    segments: int = 0
    seconds: float = 0.0
    offsets: dict[str, int] = field(default_factory=dict)
    #: seconds per step (plan, keys, write, decide, commit): where the run's time went
    steps: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for people."""
        return (f"ingest {self.run_id}: {self.logs} log(s), read {self.read} records, "
                f"{self.new} new, {self.duplicates} duplicate(s), {self.corrupt} corrupt, "
                f"{self.missing_bytes} bytes lost to retention, {self.seconds:.1f} s")


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
    """Rows in the files added to the table at ``path`` since it was listed as ``before``."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in _parquet_files(path) - before)


def plan_work(logs: list[planner.Log], progress: dict[str, int]) -> list[SegmentWork]:
    """The segments with bytes not yet ingested, one entry per segment identity.

    The same segment found twice (a landing and its copy, an export and the live
    data directory) is read once, from the copy that has the most of it.
    """
    best: dict[str, SegmentWork] = {}
    for log in logs:
        segs = log.segments()
        exported = read_identity(log.directory).get("segments", {})
        for i, seg in enumerate(segs):
            sid = segment_id(log.gateway_id, seg)
            if sid is None:
                continue
            # the newest segment of a log may be live: only its complete records count
            # (an export's manifest says how many bytes of complete records it copied)
            copied = exported.get(os.path.basename(seg.path), {}).get("bytes") if isinstance(exported, dict) else None
            if i + 1 < len(segs) or copied == seg.size:
                end = seg.size
            else:
                end = planner.log_end(segs, log.directory) - seg.base
            have = best.get(sid)
            if have is None or end > have.end:
                best[sid] = SegmentWork(log, seg, sid, progress.get(sid, 0), end)
    return [w for w in best.values() if w.end > w.done]


def _missing_bytes(logs: list[planner.Log], ends: dict[str, int]) -> int:
    """Log positions of a gateway between what was ingested and its oldest segment now."""
    first: dict[str, int] = {}
    for log in logs:
        segs = list_segments(log.directory)
        if segs:
            gw = log.gateway_id or ""
            first[gw] = min(first.get(gw, segs[0].base), segs[0].base)
    return sum(max(0, base - ends[gw]) for gw, base in first.items() if gw in ends)


def ingest(spark, sources: list[str], warehouse: str, gateway_id: str | None = None,
           max_partition_bytes: int = planner.DEFAULT_MAX_PARTITION_BYTES, wait: float = 0.0) -> IngestResult:
    """Ingest the logs under ``sources`` into ``warehouse`` (see the module docstring).

    Raises :class:`~lockmq.spark.warehouse.WarehouseBusy` if another ingest is
    writing to the warehouse (after waiting ``wait`` seconds for it).
    """
    t0 = time.monotonic()
    warehouse = os.path.abspath(warehouse)
    os.makedirs(warehouse, exist_ok=True)
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    with WarehouseLock(warehouse, run_id, wait):
        state = recover(warehouse)
        logs = planner.discover(sources, gateway_id)
        progress = progress_of(state, logs)
        ends: dict[str, int] = dict(state.get("ends", {}))
        work = plan_work(logs, progress)
        res = IngestResult(run_id=run_id, logs=len(logs), segments=len(work),
                           missing_bytes=_missing_bytes(logs, ends))
        res.steps["plan"] = time.monotonic() - t0
        if work:
            _run(spark, work, warehouse, run_id, max_partition_bytes, res)
        for w in work:
            progress[w.sid] = w.end
            gw = w.log.gateway_id or ""
            ends[gw] = max(ends.get(gw, 0), w.seg.base + w.end)
        res.offsets = {w.sid: w.end for w in work}
        res.seconds = time.monotonic() - t0
        runs = state.get("runs", [])[-99:]
        runs.append({k: v for k, v in asdict(res).items() if k not in ("offsets", "steps")})
        new_state = {"version": STATE_VERSION, "segments": progress, "ends": ends, "runs": runs}
        t1 = time.monotonic()
        if work or state.get("version") != STATE_VERSION:
            commit(warehouse, run_id, new_state)
        res.steps["commit"] = time.monotonic() - t1
        res.seconds = time.monotonic() - t0
    return res


def _shuffle_partitions(spark, total_bytes: int) -> int:
    """Slices of the key space for the key exchange (and partitions of Spark's shuffles):
    the cores, more only past ~1 GiB of log per slice (a key is 8 bytes a record,
    a tenth of the log)."""
    cores = spark.sparkContext.defaultParallelism
    return max(cores, math.ceil(total_bytes / (1 << 30)))


def _index_events(spark, events_path: str, stage: str) -> str:
    """Keys of every id already in ``events`` (a table written before the key index
    existed), saved in the run's staging folder; the commit keeps it in the index."""
    keys = (spark.read.parquet(events_path).select("sn", "seq").mapInArrow(tasks.known_key_task, "key BIGINT")
            .toArrow().column("key").to_numpy())
    d = os.path.join(stage, INDEX_STAGE)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "events.npy")
    np.save(path, np.unique(keys.astype(np.int64)))
    return path


def _each(sc, n: int, fn):
    """``fn`` over the task numbers ``0..n-1``, one Spark task each (an RDD job: no SQL
    plan, no code generation, no rows through the JVM), its results collected."""
    return sc.parallelize(range(n), n).mapPartitions(fn).collect()


def _run(spark, work: list[SegmentWork], warehouse: str, run_id: str, max_partition_bytes: int,
         res: IngestResult) -> None:
    sc = spark.sparkContext
    t0 = time.monotonic()
    items = [planner.Piece(w.log.directory, w.log.gateway_id, w.seg.path, w.seg.base, w.done, w.end) for w in work]
    parts = planner.pack(items, max_partition_bytes, sc.defaultParallelism)
    ranges = _shuffle_partitions(spark, sum(p.size for p in items))
    stage = staging_dir(warehouse, run_id)
    events_path = os.path.join(warehouse, "events")
    # one decode: every good row written by the tasks, their message keys saved
    _each(sc, len(parts), functools.partial(tasks.write_task, plan=parts, stage=stage, run_id=run_id))
    t1 = time.monotonic()
    res.steps["decode+write"] = t1 - t0
    known = _has_table(events_path)
    index = key_index(warehouse)
    old_shuffle = None
    try:
        if known and not index:
            old_shuffle = _set_shuffle(spark, ranges)
            index = [_index_events(spark, events_path, stage)]  # a warehouse from before the index
        keys_dir = os.path.join(stage, tasks.KEYS)
        flagged_parts = _each(sc, ranges, functools.partial(
            tasks.flag_task, run_files=[os.path.join(keys_dir, f"part-{t:05d}.npy") for t in range(len(parts))],
            rep_files=[os.path.join(keys_dir, f"part-{t:05d}.rep.npy") for t in range(len(parts))],
            index_files=index, ranges=ranges))
        flagged = np.unique(np.concatenate(flagged_parts)) if flagged_parts else np.zeros(0, np.int64)
        t2 = time.monotonic()
        res.steps["keys"] = t2 - t1
        if len(flagged):
            # the few rows needing a decision leave the written files for Spark to rank
            if old_shuffle is None:
                old_shuffle = _set_shuffle(spark, ranges)
            unsorted = os.path.join(stage, "unsorted")
            os.replace(os.path.join(stage, "events"), unsorted)
            bc = sc.broadcast(flagged)
            try:
                desc = spark.range(0, len(parts), 1, len(parts))
                special = desc.mapInArrow(functools.partial(tasks.split_task, plan=parts, unsorted=unsorted,
                                                            stage=stage, flagged=bc), tasks.EVENT_DDL).localCheckpoint(eager=True)
                t3 = time.monotonic()
                res.steps["split"] = t3 - t2
                _decide(spark, special, events_path if known else None, stage, run_id)
                res.steps["decide"] = time.monotonic() - t3
            finally:
                bc.unpersist()
    finally:
        if old_shuffle is not None:
            spark.conf.set("spark.sql.shuffle.partitions", old_shuffle)
    res.new = staged_rows(stage, "events")
    res.duplicates = staged_rows(stage, "duplicates")
    res.corrupt = staged_rows(stage, "corrupt")
    res.read = res.new + res.duplicates


def _set_shuffle(spark, partitions: int) -> str:
    """Set the session's shuffle partitions for the ingest's own queries; returns the old value.
    (Only when a query runs: the first touch of the SQL conf builds the session state.)"""
    old = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    return old


def _decide(spark, special, events_path: str | None, stage: str, run_id: str) -> None:
    """Rank the flagged rows: the earliest copy of an id not in ``events`` is new, the rest duplicates."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    special = special.withColumn("date", F.to_date("broker_ts"))
    if events_path is not None:
        ids = special.select("message_id").distinct()
        known = (spark.read.parquet(events_path).select("message_id").join(ids, "message_id", "left_semi")
                 .distinct().withColumn("_known", F.lit(True)))
        special = special.join(known, "message_id", "left")
    else:
        special = special.withColumn("_known", F.lit(None).cast("boolean"))
    w = Window.partitionBy("message_id").orderBy(F.col("broker_ts").asc_nulls_last(), "gateway_id", "offset")
    ranked = (special.withColumn("_copy", F.row_number().over(w))
              .withColumn("_known", F.coalesce("_known", F.lit(False))).localCheckpoint(eager=True))
    cols = tasks.EVENT_SCHEMA.names + ["date"]
    winners = ranked.filter((F.col("_copy") == 1) & ~F.col("_known")).select(cols)
    winners.write.mode("append").partitionBy("date").parquet(os.path.join(stage, "events"))
    dups = (ranked.filter((F.col("_copy") > 1) | F.col("_known"))
            .withColumn("reason", F.when(F.col("_known"), F.lit("already ingested")).otherwise(F.lit("repeated copy")))
            .withColumn("ingest_run", F.lit(run_id)).drop("_copy", "_known", "payload"))
    dups.write.mode("append").partitionBy("date").parquet(os.path.join(stage, "duplicates"))
