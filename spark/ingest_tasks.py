"""What the ingest's Spark tasks run (in the executors' Python workers).

Each task gets the number of its segment pieces in the plan (made on the driver,
shipped with the function) and decodes them itself, once. The writing and the key
exchange are RDD tasks (``sc.parallelize(range(n), n).mapPartitions``): they hand
the JVM no rows, so no SQL plan, code generation or Arrow stream is set up for
them -- on a fresh session that was ~3 s of JVM CPU per job, more than the
decode of 1M records costs the Python workers.

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

KEY_DDL = "key BIGINT, n BIGINT"
#: Key files: the run's (``stage/keys``) and the warehouse's index of stored ids.
KEYS = "keys"
#: ``events`` as written (the source's columns without ``error``; ``date`` is the folder).
EVENT_SCHEMA = pa.schema([f for f in SCHEMA if f.name != "error"])
EVENT_DDL = projected(tuple(EVENT_SCHEMA.names))[1]
CORRUPT_SCHEMA = SCHEMA.append(pa.field("ingest_run", pa.string()))
#: The partition folder Spark writes for a null date.
NULL_DATE = "__HIVE_DEFAULT_PARTITION__"


#: Parquet dictionary encoding for the columns with few distinct values (gateways,
#: topics, locks, event codes); the others (offsets, ids, times, payloads) are
#: nearly unique, and trying a dictionary on them cost a third of the write.
DICTIONARY_COLUMNS = ["gateway_id", "topic", "sn", "flags", "headers", "event_type", "method", "result",
                      "value", "credential_id", "reason", "ingest_run"]


def _tasks(batches: Iterator[pa.RecordBatch], plan: list[list[Piece]]) -> Iterator[tuple[int, list[Piece]]]:
    """The tasks of this Spark partition: rows of ``spark.range(len(plan))``, each the
    index of its pieces in ``plan`` (shipped with the function, a few bytes a piece)."""
    for b in batches:
        for task in b.column("id").to_pylist():
            yield task, plan[task]


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
            writer = pq.ParquetWriter(tmp, self.schema, compression="snappy",
                                      use_dictionary=[c for c in DICTIONARY_COLUMNS if c in self.schema.names])
            got = self.open[date or ""] = (writer, tmp, final)
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


def _save_npy(path: str, arr: np.ndarray) -> None:
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        np.save(f, arr)
    os.replace(tmp, path)


def _save_keys(stage: str, task: int, parts: list[np.ndarray]) -> int:
    """The task's message keys, sorted and distinct, as ``stage/keys/part-N.npy``; the
    ones it met more than once also as ``part-N.rep.npy``. Returns how many."""
    keys, counts = np.unique(np.concatenate(parts) if parts else np.zeros(0, np.int64), return_counts=True)
    d = os.path.join(stage, KEYS)
    os.makedirs(d, exist_ok=True)
    _save_npy(os.path.join(d, f"part-{task:05d}.npy"), keys.astype(np.int64))
    _save_npy(os.path.join(d, f"part-{task:05d}.rep.npy"), keys[counts > 1].astype(np.int64))
    return len(keys)


def write_task(task_ids: Iterator[int], plan: list[list[Piece]], stage: str, run_id: str,
               batch_records: int = 131072) -> Iterator[tuple[int, int]]:
    """The one decode: every good row to ``stage/events`` (a file per date), error rows
    to ``stage/corrupt``, the message keys to ``stage/keys``; yields ``(task, keys)``."""
    for task in task_ids:
        pieces = plan[task]
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
        yield task, _save_keys(stage, task, keys)


def key_range(k: int, ranges: int) -> tuple[int, int]:
    """The ``k``-th of ``ranges`` equal slices of the int64 key space, ``[lo, hi)``
    (keys are hashes, so every slice holds about as many)."""
    lo = -(1 << 63) + (k * (1 << 64)) // ranges
    hi = -(1 << 63) + ((k + 1) * (1 << 64)) // ranges
    return lo, hi


def _slice(path: str, lo: int, hi: int) -> np.ndarray:
    keys = np.load(path, mmap_mode="r")
    i, j = np.searchsorted(keys, [lo, hi]) if hi < (1 << 63) else (np.searchsorted(keys, lo), len(keys))
    return np.asarray(keys[i:j])


def flag_task(slices: Iterator[int], run_files: list[str], rep_files: list[str],
              index_files: list[str], ranges: int) -> Iterator[np.ndarray]:
    """The keys of one slice of the key space that need a decision: met more than once
    in this run (in one task or in two), or already in the warehouse's key index.

    The exchange goes through the shared staging folder, not the JVM: each task
    reads its slice of every sorted key file (a binary search, then one read).
    """
    for k in slices:
        lo, hi = key_range(k, ranges)
        run = [_slice(f, lo, hi) for f in run_files]
        keys, counts = np.unique(np.concatenate(run) if run else np.zeros(0, np.int64), return_counts=True)
        flagged = [keys[counts > 1]] + [_slice(f, lo, hi) for f in rep_files]
        for f in index_files:
            known = _slice(f, lo, hi)
            if len(known) and len(keys):
                flagged.append(keys[_in_sorted(keys, known)])
        yield np.unique(np.concatenate(flagged)).astype(np.int64)


def unflagged_files(folder: str, task: int) -> list[str]:
    """The files task ``task`` wrote under ``folder`` (relative paths)."""
    name = f"part-{task:05d}.parquet"
    out = []
    for root, dirs, files in os.walk(folder):
        if name in files:
            out.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(out)


def split_task(batches: Iterator[pa.RecordBatch], plan: list[list[Piece]], unsorted: str, stage: str,
               flagged) -> Iterator[pa.RecordBatch]:
    """Only when some ids need a decision: move each of the task's files from
    ``unsorted`` to ``stage/events``, without the flagged rows, which are yielded.

    A file holding none is renamed; one holding some is rewritten (its source is
    kept until the run ends, so a retried task redoes the same work).
    """
    fl = flagged.value if hasattr(flagged, "value") else flagged
    for task, _ in _tasks(batches, plan):
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
            pq.write_table(keep, tmp, compression="snappy",
                           use_dictionary=[c for c in DICTIONARY_COLUMNS if c in keep.schema.names])
            os.replace(tmp, dst)
