"""What the ingest's Spark tasks run (in the executors' Python workers, via ``mapInArrow``).

Each task gets one row naming its segment pieces (planned on the driver) and
decodes them itself, once:

- :func:`write_task` decodes every column and writes the good rows straight to
  Parquet with pyarrow (dictionary-encoded, one file per date) into the run's
  staging folder -- no row crosses to the JVM -- and returns the 64-bit message
  key of each id it wrote with its count (12 bytes a record);
- :func:`split_task` runs only when some keys need a decision (an id seen twice in
  the run, or already in ``events``): it takes those rows out of the task's files
  and hands them to Spark, to be ranked.

File names are fixed by (task, date) and written through a temp name and a
rename, so a retried or speculative task rewrites the same file, never adds one.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .decoder import SCHEMA, decode_file, projected
from .keys import message_keys
from .plan import Piece

#: Column of the descriptor rows: the task number and its pieces as JSON.
TASK_DDL = "task INT, pieces STRING"
KEY_DDL = "key BIGINT, n BIGINT"
#: ``events`` as written (the source's columns without ``error``; ``date`` is the folder).
EVENT_SCHEMA = pa.schema([f for f in SCHEMA if f.name != "error"])
EVENT_DDL = projected(tuple(EVENT_SCHEMA.names))[1]
CORRUPT_SCHEMA = SCHEMA.append(pa.field("ingest_run", pa.string()))
#: The partition folder Spark writes for a null date.
NULL_DATE = "__HIVE_DEFAULT_PARTITION__"


def encode_pieces(pieces: list[Piece]) -> str:
    """A task's pieces as JSON (its descriptor row)."""
    return json.dumps([[p.log, p.gateway_id, p.path, p.base, p.start, p.end] for p in pieces])


def _pieces(text: str) -> list[Piece]:
    return [Piece(*p) for p in json.loads(text)]


def _tasks(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, list[Piece]]]:
    for b in batches:
        for task, text in zip(b.column("task").to_pylist(), b.column("pieces").to_pylist()):
            yield task, _pieces(text)


def _decode(pieces: list[Piece], schema: pa.Schema, batch_records: int) -> Iterator[pa.RecordBatch]:
    for p in pieces:
        yield from decode_file(p.path, p.base, p.gateway_id, p.start, p.end, True, "PERMISSIVE",
                               batch_records, None, schema)


def known_key_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The keys of rows already in ``events`` (batches of its ``sn``, ``seq`` columns)."""
    for b in batches:
        if b.num_rows:
            yield pa.RecordBatch.from_arrays([pa.array(message_keys(b.column("sn"), b.column("seq")))],
                                             names=["key"])


class _DateFiles:
    """One Parquet file per date (and table) for a task, under a temp name until closed."""

    def __init__(self, folder: str, task: int, schema: pa.Schema) -> None:
        self.folder, self.task, self.schema = folder, task, schema
        self.open: dict[str, tuple[pq.ParquetWriter, str, str]] = {}

    def write(self, date: str | None, table: pa.Table) -> None:
        got = self.open.get(date or "")
        if got is None:
            d = os.path.join(self.folder, f"date={date}") if date is not None else self.folder
            os.makedirs(d, exist_ok=True)
            final = os.path.join(d, f"part-{self.task:05d}.parquet")
            tmp = os.path.join(d, f".part-{self.task:05d}.{uuid.uuid4().hex[:8]}.tmp")
            got = self.open[date or ""] = (pq.ParquetWriter(tmp, self.schema, compression="snappy"), tmp, final)
        got[0].write_table(table)

    def close(self, keep: bool = True) -> None:
        """Close every file; ``keep`` renames them to their final names (else they are dropped)."""
        for writer, tmp, final in self.open.values():
            writer.close()
            if keep:
                os.replace(tmp, final)
            else:
                os.unlink(tmp)
        self.open.clear()


def _by_date(table: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    dates = pc.cast(table.column("broker_ts"), pa.date32())
    distinct = pc.unique(dates)
    if len(distinct) == 1:
        d = distinct[0].as_py()
        yield (NULL_DATE if d is None else d.isoformat()), table
        return
    for d in distinct.to_pylist():
        mask = pc.is_null(dates) if d is None else pc.equal(dates, pa.scalar(d, pa.date32()))
        yield (NULL_DATE if d is None else d.isoformat()), table.filter(mask)


def _in_sorted(keys: np.ndarray, flagged: np.ndarray) -> np.ndarray:
    if not len(flagged):
        return np.zeros(len(keys), dtype=bool)
    i = np.minimum(np.searchsorted(flagged, keys), len(flagged) - 1)
    return flagged[i] == keys


def _key_counts(parts: list[np.ndarray]) -> Iterator[pa.RecordBatch]:
    if parts:
        keys, counts = np.unique(np.concatenate(parts), return_counts=True)
        yield pa.RecordBatch.from_arrays([pa.array(keys), pa.array(counts.astype(np.int64))], names=["key", "n"])


def write_task(batches: Iterator[pa.RecordBatch], stage: str, run_id: str,
               batch_records: int = 131072) -> Iterator[pa.RecordBatch]:
    """The one decode: every good row to ``stage/events`` (a file per date), error rows
    to ``stage/corrupt``; yields ``(key, copies)`` of the message ids written."""
    for task, pieces in _tasks(batches):
        events = _DateFiles(os.path.join(stage, "events"), task, EVENT_SCHEMA)
        corrupt = _DateFiles(os.path.join(stage, "corrupt"), task, CORRUPT_SCHEMA)
        keys: list[np.ndarray] = []
        ok = False
        try:
            for b in _decode(pieces, SCHEMA, batch_records):
                err = b.column("error")
                if err.null_count < b.num_rows:
                    bad = pa.Table.from_batches([b.filter(pc.is_valid(err))])
                    corrupt.write(None, bad.append_column("ingest_run", pa.repeat(pa.scalar(run_id), bad.num_rows)))
                    b = b.filter(pc.is_null(err))
                    if not b.num_rows:
                        continue
                good = pa.Table.from_batches([b]).drop_columns(["error"])
                keys.append(message_keys(good.column("sn"), good.column("seq")))
                for date, part in _by_date(good):
                    events.write(date, part)
            ok = True
        finally:
            events.close(ok)
            corrupt.close(ok)
        yield from _key_counts(keys)


def unflagged_files(folder: str, task: int) -> list[str]:
    """The files task ``task`` wrote under ``folder`` (relative paths)."""
    name = f"part-{task:05d}.parquet"
    out = []
    for root, dirs, files in os.walk(folder):
        if name in files:
            out.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(out)


def split_task(batches: Iterator[pa.RecordBatch], unsorted: str, stage: str, flagged) -> Iterator[pa.RecordBatch]:
    """Only when some ids need a decision: move each of the task's files from
    ``unsorted`` to ``stage/events``, without the flagged rows, which are yielded.

    A file holding none is renamed; one holding some is rewritten (its source is
    kept until the run ends, so a retried task redoes the same work).
    """
    fl = flagged.value if hasattr(flagged, "value") else flagged
    for task, _ in _tasks(batches):
        for rel in unflagged_files(unsorted, task):
            src, dst = os.path.join(unsorted, rel), os.path.join(stage, "events", rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if not os.path.exists(src):
                continue  # a retry: renamed by the first attempt (it held no flagged row)
            pf = pq.ParquetFile(src)
            table = pf.read()
            special = _in_sorted(message_keys(table.column("sn"), table.column("seq")), fl)
            if not special.any():
                os.replace(src, dst)
                continue
            yield from table.filter(pa.array(special)).to_batches()
            keep = table.filter(pa.array(~special))
            tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.{uuid.uuid4().hex[:8]}.tmp")
            pq.write_table(keep, tmp, compression="snappy")
            os.replace(tmp, dst)
