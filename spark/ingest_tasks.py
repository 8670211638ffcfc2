"""What the ingest's Spark tasks run (in the executors' Python workers, via ``mapInArrow``).

Each task gets one row naming its segment pieces (planned on the driver) and
decodes them itself:

- :func:`key_task` (pass 1) decodes only ``sn`` and ``seq`` and returns each 64-bit
  message key it saw with its count -- 12 bytes a distinct id cross to the JVM;
- :func:`write_task` (pass 2) decodes every column and writes the rows whose key
  needs no decision (seen once in the run, never before) straight to Parquet with
  pyarrow, one file per date, into the run's staging folder; only the few
  flagged rows go back to Spark, to be ranked. Error rows go to ``corrupt``.

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
_ID_SCHEMA = projected(("sn", "seq", "error"))[0]


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


def key_task(batches: Iterator[pa.RecordBatch], batch_records: int = 262144) -> Iterator[pa.RecordBatch]:
    """Pass 1: ``(key, copies)`` of every message id in the task's pieces (good records only)."""
    for _, pieces in _tasks(batches):
        parts = []
        for b in _decode(pieces, _ID_SCHEMA, batch_records):
            err = b.column("error")
            good = b if err.null_count == b.num_rows else b.filter(pc.is_null(err))
            if good.num_rows:
                parts.append(message_keys(good.column("sn"), good.column("seq")))
        if parts:
            keys, counts = np.unique(np.concatenate(parts), return_counts=True)
            yield pa.RecordBatch.from_arrays([pa.array(keys), pa.array(counts.astype(np.int64))],
                                             names=["key", "n"])


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


def write_task(batches: Iterator[pa.RecordBatch], stage: str, run_id: str, flagged,
               batch_records: int = 131072) -> Iterator[pa.RecordBatch]:
    """Pass 2: write the rows needing no decision to ``stage/events``; yield the flagged ones.

    ``flagged`` is a Spark broadcast (or a plain array) of the sorted keys seen more
    than once in this run or already in ``events``.
    """
    fl = flagged.value if hasattr(flagged, "value") else flagged
    for task, pieces in _tasks(batches):
        events = _DateFiles(os.path.join(stage, "events"), task, EVENT_SCHEMA)
        corrupt = _DateFiles(os.path.join(stage, "corrupt"), task, CORRUPT_SCHEMA)
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
                special = _in_sorted(message_keys(good.column("sn"), good.column("seq")), fl)
                if special.any():
                    yield from good.filter(pa.array(special)).to_batches()
                    good = good.filter(pa.array(~special))
                for date, part in _by_date(good):
                    events.write(date, part)
            ok = True
        finally:
            events.close(ok)
            corrupt.close(ok)
