"""The warehouse as a table: one writer at a time, progress by content, atomic runs.

    warehouse/_lockmq/state.json        progress + run history (fsync + rename)
    warehouse/_lockmq/lock              held (flock) by the ingest writing now
    warehouse/_lockmq/staging/<run>/    what a run writes before it commits

Progress is kept per *segment identity*, not per path: ``gateway id``, base offset,
and the length and CRC of the segment's first record (what the log itself says
it is). A landing moved, copied or mounted elsewhere is the same segments, so
it is not read again; a gateway whose log restarted at offset 0 has a new
first record, so it is.

A run writes into its staging folder, then commits: the new state, listing the
file moves, is saved first; the moves follow; the state is saved again without
them. A run that dies before the first save left nothing visible (its staging
folder is removed by the next run); one that dies during the moves is finished
by the next run. So ``events`` never holds half a run, and no id is counted as
"already ingested" because an earlier run died half-way.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import struct
import time
from dataclasses import dataclass

from .layout import Log, Segment

STATE_DIR = "_lockmq"
STATE_FILE = "state.json"
LOCK_FILE = "lock"
STAGING = "staging"
#: the index of stored message keys (sorted .npy files, one per task of every run)
KEYS_DIR = "keys"
#: where a run stages index files built from ``events`` itself (an older warehouse)
INDEX_STAGE = "index"
STATE_VERSION = 2
_LEN_CRC = struct.Struct("<II")


class WarehouseBusy(RuntimeError):
    """Another ingest holds the warehouse."""


def state_dir(warehouse: str) -> str:
    """The folder of the warehouse's own files (``_lockmq``)."""
    return os.path.join(warehouse, STATE_DIR)


def _fsync_dir(d: str) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_state(warehouse: str) -> dict:
    """The checkpoint of a warehouse ({} if it has none)."""
    path = os.path.join(state_dir(warehouse), STATE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {}
    if not isinstance(doc, dict):
        raise ValueError(f"lockmq: {path} is not an ingest checkpoint")
    return doc


def save_state(warehouse: str, state: dict) -> None:
    """Write the checkpoint atomically (temp file, fsync, rename, fsync the folder)."""
    d = state_dir(warehouse)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{STATE_FILE}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(d, STATE_FILE))
    _fsync_dir(d)


class WarehouseLock:
    """``with WarehouseLock(wh, run_id):`` -- the one ingest writing to ``wh``.

    An exclusive ``flock`` on ``_lockmq/lock``, released by the kernel if the
    process dies. A second ingest fails at once with :class:`WarehouseBusy`
    naming the holder (``wait`` seconds > 0: it waits that long first).
    """

    def __init__(self, warehouse: str, run_id: str, wait: float = 0.0) -> None:
        self.path = os.path.join(state_dir(warehouse), LOCK_FILE)
        self.run_id = run_id
        self.wait = wait
        self._fd: int | None = None

    def __enter__(self) -> "WarehouseLock":
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown"
                    os.close(fd)
                    raise WarehouseBusy(f"lockmq: another ingest is writing to this warehouse ({holder}); "
                                        "run again once it has finished (the lock is released when that "
                                        "process ends, even if it dies)") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"run {self.run_id}, pid {os.getpid()} on {socket.gethostname()}, since "
                      f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


# -- segment identity ----------------------------------------------------------------

def segment_id(gateway_id: str | None, seg: Segment) -> str | None:
    """``gateway/base/first-record length/CRC`` of a segment (None if it has no record yet)."""
    try:
        with open(seg.path, "rb") as f:
            head = f.read(8)
    except FileNotFoundError:
        return None
    if len(head) < 8:
        return None
    length, crc = _LEN_CRC.unpack(head)
    if length == 0:
        return None  # preallocated, nothing written yet
    return f"{gateway_id or ''}/{seg.base}/{length}/{crc:08x}"


@dataclass(frozen=True)
class SegmentWork:
    """One segment of a landing and how far earlier runs read it."""

    log: Log
    seg: Segment
    sid: str
    done: int      # bytes of the segment already ingested
    end: int       # bytes of complete records in it now


def progress_of(state: dict, logs: list[Log]) -> dict[str, int]:
    """Bytes ingested per segment id; a version-1 state (positions per log path) is
    translated for the logs still found at those paths."""
    if state.get("version", 1) >= 2:
        return dict(state.get("segments", {}))
    old = state.get("offsets", {})
    out: dict[str, int] = {}
    for log in logs:
        pos = old.get(log.key, old.get(log.directory))
        if pos is None:
            continue
        for seg in log.segments():
            sid = segment_id(log.gateway_id, seg)
            if sid is not None and pos > seg.base:
                out[sid] = min(pos - seg.base, seg.size)
    return out


# -- staging and commit ---------------------------------------------------------------

def staging_dir(warehouse: str, run_id: str) -> str:
    """Where run ``run_id`` writes its files before committing."""
    return os.path.join(state_dir(warehouse), STAGING, run_id)


def _staged_files(stage: str) -> list[str]:
    """Data files under a staging folder, relative to it (Spark's markers left out)."""
    out = []
    for root, dirs, files in os.walk(stage):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        out += [os.path.relpath(os.path.join(root, f), stage) for f in files
                if f.endswith(".parquet") and not f.startswith(("_", "."))]
    return sorted(out)


def staged_rows(stage: str, table: str) -> int:
    """Rows a run staged for ``table`` (``events``, ``duplicates``, ``corrupt``), from footers."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(os.path.join(stage, f)).num_rows
               for f in _staged_files(stage) if f.split(os.sep, 1)[0] == table)


def key_index(warehouse: str) -> list[str]:
    """The files of the warehouse's key index: a superset of the keys of ``events``."""
    d = os.path.join(state_dir(warehouse), KEYS_DIR)
    try:
        return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".npy") and not n.startswith("."))
    except FileNotFoundError:
        return []


def _key_moves(warehouse: str, stage: str, run_id: str) -> list[list[str]]:
    """The run's key files (not the ``.rep`` ones) into the index."""
    moves = []
    for sub in ("keys", INDEX_STAGE):
        d = os.path.join(stage, sub)
        if not os.path.isdir(d):
            continue
        for n in sorted(os.listdir(d)):
            if n.endswith(".npy") and not n.endswith(".rep.npy") and not n.startswith("."):
                moves.append([os.path.relpath(os.path.join(d, n), warehouse),
                              os.path.join(STATE_DIR, KEYS_DIR, f"{run_id}-{sub}-{n}")])
    return moves


def _apply_moves(warehouse: str, moves: list[list[str]]) -> None:
    dirs = set()
    for src, dst in moves:
        s, d = os.path.join(warehouse, src), os.path.join(warehouse, dst)
        if os.path.exists(s):
            os.makedirs(os.path.dirname(d), exist_ok=True)
            os.replace(s, d)
            dirs.add(os.path.dirname(d))
    for d in sorted(dirs):
        _fsync_dir(d)


def commit(warehouse: str, run_id: str, state: dict) -> None:
    """Move run ``run_id``'s staged files into the tables and save ``state`` with them."""
    stage = staging_dir(warehouse, run_id)
    moves = []
    for rel in _staged_files(stage) if os.path.isdir(stage) else []:
        table, rest = rel.split(os.sep, 1)
        head, name = os.path.split(rest)
        moves.append([os.path.relpath(os.path.join(stage, rel), warehouse),
                      os.path.join(table, head, f"{run_id}-{name}")])
    moves += _key_moves(warehouse, stage, run_id)
    save_state(warehouse, {**state, "commit": {"run": run_id, "moves": moves}})
    _apply_moves(warehouse, moves)
    save_state(warehouse, state)
    shutil.rmtree(stage, ignore_errors=True)


def recover(warehouse: str) -> dict:
    """Finish a commit a dead run left half done, drop abandoned staging; returns the state."""
    state = load_state(warehouse)
    pending = state.pop("commit", None)
    if pending:
        _apply_moves(warehouse, pending.get("moves", []))
        save_state(warehouse, state)
    shutil.rmtree(os.path.join(state_dir(warehouse), STAGING), ignore_errors=True)
    return state
