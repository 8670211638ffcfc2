"""The ``lockmq`` PySpark data source: commit-log segments as a batch or streaming table.

    from lockmq.spark.datasource import register
    register(spark)
    df = spark.read.format("lockmq").load("/data/exports")
    stream = spark.readStream.format("lockmq").option("maxRecordsPerTrigger", 100000).load(path)

``path`` is a broker data directory, an export, or a folder holding many of them
(each log found is one source of offsets). Options (all optional):

- ``paths``: more roots, comma-separated.
- ``gatewayId``: gateway id for every log (default: each log's manifest/identity).
- ``startingOffsets`` / ``endingOffsets``: ``earliest`` / ``latest`` / JSON ``{"<log dir>": pos}``.
- ``mode``: ``PERMISSIVE`` (corrupt records become rows with ``error`` set),
  ``DROPMALFORMED`` (skipped, counted on stderr) or ``FAILFAST``.
- ``maxPartitionBytes`` (default 32 MiB), ``minPartitions`` (default: the driver's
  CPU count) and ``minPartitionBytes`` (default 1 MiB): how segments are packed
  into Spark partitions (a task costs ~50 ms, so small files share one).
- ``maxRecordsPerTrigger`` / ``maxBytesPerTrigger``: streaming read limits.
- ``batchRecords``: rows per Arrow batch (default 65536).
- ``columns``: comma-separated columns to decode (default all); the table then has
  only those (a pass that needs the ids alone skips the payloads and strings).

Every record's CRC is verified; see :mod:`lockmq.spark.decoder` for what happens
to bad and torn ones. Segments deleted by retention between runs are skipped and
reported (a warning on stderr with the number of bytes lost).
"""

from __future__ import annotations

import os
import sys
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from . import plan as planner
from .decoder import MODES, DecodeStats, decode_file, projected

NAME = "lockmq"


class LogPartition(InputPartition):
    """A list of segment pieces decoded by one Spark task."""

    def __init__(self, pieces: list[planner.Piece]) -> None:
        super().__init__(pieces)
        self.pieces = pieces


class _Options:
    """Parsed, validated options shared by the batch and stream readers."""

    def __init__(self, options: dict) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        paths = [p for p in (opts.get("path") or "").split(",") if p]
        paths += [p for p in (opts.get("paths") or "").split(",") if p]
        if not paths:
            raise ValueError("lockmq: no path given: use load(path) or option('paths', ...)")
        self.paths = [os.path.abspath(p) for p in paths]
        self.gateway_id = opts.get("gatewayid") or None
        self.mode = (opts.get("mode") or "PERMISSIVE").upper()
        if self.mode not in MODES:
            raise ValueError(f"lockmq: mode must be one of {MODES}, got {self.mode!r}")
        self.max_partition_bytes = _int(opts, "maxpartitionbytes", planner.DEFAULT_MAX_PARTITION_BYTES)
        self.min_partitions = _int(opts, "minpartitions", os.cpu_count() or 1)
        self.min_partition_bytes = _int(opts, "minpartitionbytes", planner.MIN_PARTITION_BYTES)
        self.batch_records = _int(opts, "batchrecords", 65536)
        self.max_records = _int(opts, "maxrecordspertrigger", 0) or None
        self.max_bytes = _int(opts, "maxbytespertrigger", 0) or None
        self.starting = opts.get("startingoffsets")
        self.ending = opts.get("endingoffsets")
        self.columns = _columns(opts)


def _columns(opts) -> tuple[str, ...]:
    """The ``columns`` option as a tuple (empty: all), checked against the schema."""
    columns = tuple(c.strip() for c in (opts.get("columns") or "").split(",") if c.strip())
    projected(columns)  # raises for an unknown column
    return columns


def _int(opts: dict, key: str, default: int) -> int:
    raw = opts.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"lockmq: option {key} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"lockmq: option {key} must be >= 0, got {value}")
    return value


def _warn(msg: str) -> None:
    print(f"lockmq: {msg}", file=sys.stderr, flush=True)


def read_partition(pieces: list[planner.Piece], mode: str, batch_records: int,
                   columns: tuple[str, ...] = ()) -> Iterator:
    """Decode the pieces of one partition into Arrow record batches (runs on executors)."""
    stats = DecodeStats()
    schema = projected(columns)[0]
    for p in pieces:
        try:
            yield from decode_file(p.path, p.base, p.gateway_id, p.start, p.end, True, mode,
                                   batch_records, stats, schema)
        except FileNotFoundError:
            stats.missing_segments += 1
            _warn(f"segment {p.path} was deleted before it was read (retention?); skipped")
    if stats.corrupt:
        _warn(f"{stats.corrupt} corrupt record(s), {stats.corrupt_bytes} bytes: "
              + "; ".join(stats.errors[:5]))


class LockmqBatchReader(DataSourceReader):
    """Batch reader: plans on the driver, decodes on executors."""

    def __init__(self, options: dict) -> None:
        self.opts = _Options(options)

    def partitions(self) -> list[LogPartition]:
        o = self.opts
        logs = planner.discover(o.paths, o.gateway_id)
        start = planner.parse_offsets(o.starting, logs, "earliest")
        end = planner.parse_offsets(o.ending, logs, "latest")
        items, missing = planner.pieces(logs, start, end)
        if missing:
            _warn(f"{missing} bytes of the requested range were deleted by retention; skipped")
        parts = planner.pack(items, o.max_partition_bytes, o.min_partitions, o.min_partition_bytes)
        return [LogPartition(p) for p in parts]

    def read(self, partition: LogPartition) -> Iterator:
        return read_partition(partition.pieces, self.opts.mode, self.opts.batch_records, self.opts.columns)


class LockmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reader: offsets are log positions per log folder."""

    def __init__(self, options: dict) -> None:
        self.opts = _Options(options)
        self._target: dict[str, int] | None = None

    def _logs(self):
        return planner.discover(self.opts.paths, self.opts.gateway_id)

    def initialOffset(self) -> dict:
        return planner.parse_offsets(self.opts.starting, self._logs(), "earliest")

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records:
            return ReadMaxRows(self.opts.max_records)
        if self.opts.max_bytes:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = planner.latest(self._logs())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        logs = self._logs()
        start = {**planner.earliest(logs), **start}
        end = {**start, **planner.latest(logs)}
        for key, pos in start.items():  # never go backwards (e.g. a log folder vanished)
            end[key] = max(end.get(key, pos), pos)
            if self._target is not None:
                end[key] = max(pos, min(end[key], self._target.get(key, pos)))
        if isinstance(limit, ReadMaxRows):
            end = planner.limit_offsets(logs, start, end, max_records=limit.max_rows)
        elif isinstance(limit, ReadMaxBytes):
            end = planner.limit_offsets(logs, start, end, max_bytes=limit.max_bytes)
        return end

    def partitions(self, start: dict, end: dict) -> list[LogPartition]:
        logs = self._logs()
        start = {**planner.earliest([log for log in logs if log.key not in start]), **start}
        items, missing = planner.pieces(logs, start, end)
        if missing:
            _warn(f"{missing} bytes between the last offsets and now were deleted by retention; skipped")
        parts = planner.pack(items, self.opts.max_partition_bytes, self.opts.min_partitions,
                             self.opts.min_partition_bytes)
        return [LogPartition(p) for p in parts]

    def read(self, partition: LogPartition) -> Iterator:
        return read_partition(partition.pieces, self.opts.mode, self.opts.batch_records, self.opts.columns)

    def commit(self, end: dict) -> None:
        """Nothing to release: the broker's retention, not the reader, deletes segments."""


class LockmqDataSource(DataSource):
    """``spark.read.format("lockmq")``: the broker's commit log as a table."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return projected(_columns(self.options))[1]

    def reader(self, schema) -> LockmqBatchReader:
        return LockmqBatchReader(dict(self.options))

    def streamReader(self, schema) -> LockmqStreamReader:
        return LockmqStreamReader(dict(self.options))


def register(spark) -> None:
    """Register the ``lockmq`` format with a SparkSession (idempotent).

    Needed only where Spark did not find it by itself: a session whose Python has
    lockmq installed finds the top-level ``pyspark_lockmq`` module and registers
    the source on its first lookup (then this does nothing, instead of replacing
    it with a warning).
    """
    try:
        if spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(NAME):
            return
    except Exception:  # noqa: BLE001 -- a Spark without the internal call: just register
        pass
    spark.dataSource.register(LockmqDataSource)
