"""Online backup and restore of a data directory (``lockmq store backup`` / ``restore``).

:func:`backup` copies a data directory *while the broker runs* (or not) into a new
directory that is itself a data directory: a broker starts on it as on its own.
It needs read access only (run it as the broker's user) and no help from the
broker: the consistency comes from the order of the copy and from how the store
writes.

Why the copy is consistent (the store's write rules, docs/storage.md):

* the commit log only grows at its end (the writer thread appends; nothing is
  rewritten), and loses whole segments at its start (retention, oldest first);
* a record is acknowledged only after its bytes are in the segment file (``sync``:
  after the fdatasync; ``async``: after ``write()``), and a consumer is only given
  records that far; a consume position is saved after delivery;
* the ``checkpoint`` (replaced atomically) promises that the log before its
  ``log_end`` and the index entries below its queue ends are on disk; recovery
  trusts nothing after it: it cuts the indexes back to it and re-reads the log
  from there, cutting a torn tail.

So the copy runs in this order: (1) SQLite files with SQLite's online backup API
(device keys, tokens: a consistent database whatever the broker writes), other
small files whole (``master.key``); (2) every ``consume-*.log`` (each cluster's
positions: they only point at records already in the log, which is copied
later); (3) the ``checkpoint``; (4) every ``offset-*.log`` (at least the entries
the copied checkpoint promises); (5) the segments, listed *after* the checkpoint
was read, oldest first, each opened before any is copied (an open descriptor keeps
a segment that retention unlinks readable), closed ones whole and the last one up
to its size when it is read. Every record acknowledged before the backup began is
then in the copy; the copy's log end may fall in a record being written (as after
a crash). (6) Finally the copy is opened as a store: crash recovery cuts such a
torn tail and writes a fresh checkpoint, so a broker started on the backup (or on
a restore of it) has nothing to repair. A manifest (:data:`MANIFEST`) written last
marks the backup complete; :func:`restore` refuses a directory without one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field

from .config import StoreConfig
from .engine import Store
from .files import atomic_write, create_file, fsync_dir, make_dir
from .names import (CHECKPOINT, CLOCK, DAMAGE, LOCK, LOG_START, POSITIONS_COPY, REINDEX,
                    SEGMENT_DIR,
                    TMP_SUFFIX, index_topic, list_segments, positions_cluster, qstart_name,
                    segment_name)

#: The file that marks a complete backup (written last).
MANIFEST = "lockmq-backup.json"
#: Version of the manifest's layout.
MANIFEST_FORMAT = 1
#: Files of a data directory that are never copied: the broker's lock, half-written
#: atomic replacements, SQLite's side files (the online backup API reads through them).
_SKIP_SUFFIXES = (TMP_SUFFIX, "-wal", "-shm", "-journal")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_CHUNK = 1 << 20
#: the store's small state files besides positions, checkpoint and indexes: copied
#: with them (a backup of a damaged store keeps its quarantine list)
_STATE_FILES = (POSITIONS_COPY, DAMAGE, REINDEX, CLOCK, LOG_START)


class BackupError(Exception):
    """A backup or restore cannot be made (the message says why); nothing usable
    was left at the destination."""


@dataclass
class BackupReport:
    """What a backup or restore holds.

    Attributes:
        path: the backup (or restored data) directory.
        source: the directory it was copied from.
        created: when the backup was made (ISO 8601, UTC).
        files / bytes: files and bytes copied.
        log_start / log_end: commit-log range in it.
        topics: ``{topic: [first retained queue offset, queue end]}``.
        clusters: consumer clusters whose positions it holds.
        side_files: other files copied (``security.db``, ``master.key``, ...).
        bytes_cut: a record being written when the active segment was read, cut
            by the recovery run on the copy (never an acknowledged one).
        seconds: time the copy took.
    """

    path: str
    source: str
    created: str = ""
    files: int = 0
    bytes: int = 0
    log_start: int = 0
    log_end: int = 0
    topics: dict[str, list[int]] = field(default_factory=dict)
    clusters: list[str] = field(default_factory=list)
    side_files: list[str] = field(default_factory=list)
    bytes_cut: int = 0
    seconds: float = 0.0


def _require_new(path: str, what: str) -> None:
    """Refuse a target that exists and is not an empty directory."""
    if os.path.lexists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise BackupError(f"{path} exists and is not empty: {what} only into a new or "
                          "empty directory")


def _copy_fd(src_fd: int, dst_path: str, size: int) -> int:
    """Copy the first ``size`` bytes of ``src_fd`` to a new file (mode 0600), fsynced."""
    out = create_file(dst_path, os.O_WRONLY | os.O_TRUNC)
    try:
        pos = 0
        while pos < size:
            buf = os.pread(src_fd, min(_CHUNK, size - pos), pos)
            if not buf:
                break   # the file got shorter (it cannot, but never loop forever)
            view = memoryview(buf)
            while view:
                view = view[os.write(out, view):]
            pos += len(buf)
        os.fsync(out)
    finally:
        os.close(out)
    return pos


def _copy_file(src: str, dst: str) -> int:
    """Copy a whole file as it is when opened (an atomic replace after that does not
    matter: the open descriptor keeps the version it opened)."""
    fd = os.open(src, os.O_RDONLY)
    try:
        return _copy_fd(fd, dst, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _is_sqlite(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC


def _copy_sqlite(src: str, dst: str) -> int:
    """A consistent copy of a live SQLite database (its online backup API)."""
    os.close(create_file(dst, os.O_WRONLY | os.O_TRUNC))   # 0600 before any data
    source = sqlite3.connect(src, timeout=10.0)
    try:
        target = sqlite3.connect(dst)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode=DELETE")   # one self-contained file
        finally:
            target.close()
    finally:
        source.close()
    with open(dst, "rb+") as f:
        os.fsync(f.fileno())
    return os.path.getsize(dst)


def _open_segments(seg_dir: str) -> list[tuple[int, int, int]]:
    """``(base, log fd, sidecar fd or -1)`` of the segments there now, oldest first.

    Every descriptor is opened before anything is copied. A segment retention deletes
    meanwhile can only be at the start: it is left out, as is a last segment whose
    queue-start sidecar is not written yet (the writer writes the sidecar before the
    fsync that acknowledges the segment's first records, so none is acknowledged).
    """
    opened: list[tuple[int, int, int]] = []
    for base in list_segments(seg_dir):
        try:
            log_fd = os.open(os.path.join(seg_dir, segment_name(base)), os.O_RDONLY)
        except FileNotFoundError:
            log_fd = -1
        try:
            side_fd = os.open(os.path.join(seg_dir, qstart_name(base)), os.O_RDONLY)
        except FileNotFoundError:
            side_fd = -1
        opened.append((base, log_fd, side_fd))
    keep: list[tuple[int, int, int]] = []   # the run of usable segments from the first
    for s in opened:
        if s[1] >= 0 and (s[0] == 0 or s[2] >= 0):
            keep.append(s)
        elif keep:
            break
    for s in opened:
        if s not in keep:
            for fd in s[1:]:
                if fd >= 0:
                    os.close(fd)
    return keep


def _recover_copy(path: str, rep: BackupReport) -> None:
    """Open a copied data directory as a store (crash recovery runs on it: a torn
    tail is cut, a fresh checkpoint written), note what it holds in ``rep``, close."""
    store = Store.open(StoreConfig(data_dir=path, min_free_bytes=0))
    try:
        rep.bytes_cut = store.recovery.bytes_cut
        rep.log_start, rep.log_end = store.log_start, store.log_end
        rep.topics = {t: [store.queue_start(t), store.queue_end(t)] for t in store.topics()}
        rep.clusters = store.clusters()
    finally:
        store.close_sync()
        os.unlink(os.path.join(path, LOCK))   # no process holds it: leave no stale lock


def backup(data_dir: str, dest: str) -> BackupReport:
    """Copy the data directory ``data_dir`` (its broker may be running) to ``dest``,
    a new or empty directory; return what the backup holds.

    The consistency argument is in the module docstring. Raises
    :class:`BackupError` for a ``dest`` that is not new and empty, a ``data_dir``
    that is not a data directory, or a ``dest`` inside ``data_dir``.
    """
    t0 = time.monotonic()
    src = os.path.abspath(data_dir)
    dest = os.path.abspath(dest)
    seg_src = os.path.join(src, SEGMENT_DIR)
    if not os.path.isdir(seg_src):
        raise BackupError(f"{src} is not a lockmq data directory (no {SEGMENT_DIR}/)")
    if os.path.commonpath([src, dest]) == src:
        raise BackupError(f"{dest} is inside the data directory {src}")
    _require_new(dest, "back up")
    make_dir(dest)
    seg_dest = os.path.join(dest, SEGMENT_DIR)
    make_dir(seg_dest)
    rep = BackupReport(dest, src, dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))

    def copied(n: int) -> None:
        rep.files += 1
        rep.bytes += n

    names = sorted(os.listdir(src))
    positions = [n for n in names if positions_cluster(n) is not None]
    indexes = [n for n in names if index_topic(n) is not None]
    store_files = set(positions) | set(indexes) | {CHECKPOINT, LOCK, SEGMENT_DIR, MANIFEST} \
        | set(_STATE_FILES)
    # (1) side files: the security registry (SQLite, online backup API), master key, ...
    for name in names:
        path = os.path.join(src, name)
        if name in store_files or name.endswith(_SKIP_SUFFIXES) or not os.path.isfile(path):
            continue
        copy = _copy_sqlite if _is_sqlite(path) else _copy_file
        copied(copy(path, os.path.join(dest, name)))
        rep.side_files.append(name)
    # (2) positions, (3) checkpoint, (4) indexes: in this order (module docstring)
    for name in positions + [n for n in _STATE_FILES if n in names] + [CHECKPOINT] + indexes:
        try:
            copied(_copy_file(os.path.join(src, name), os.path.join(dest, name)))
        except FileNotFoundError:   # a cluster deleted meanwhile; no checkpoint yet
            pass
    # (5) segments, listed after the checkpoint was read, all opened before copying
    segments = _open_segments(seg_src)
    try:
        for base, log_fd, side_fd in segments:
            if side_fd >= 0:
                copied(_copy_fd(side_fd, os.path.join(seg_dest, qstart_name(base)),
                                os.fstat(side_fd).st_size))
            copied(_copy_fd(log_fd, os.path.join(seg_dest, segment_name(base)),
                            os.fstat(log_fd).st_size))
    finally:
        for _base, log_fd, side_fd in segments:
            os.close(log_fd)
            if side_fd >= 0:
                os.close(side_fd)
    fsync_dir(seg_dest)
    fsync_dir(dest)
    # (6) recovery on the copy: cut a torn tail, write a fresh checkpoint
    _recover_copy(dest, rep)
    rep.seconds = round(time.monotonic() - t0, 3)
    manifest = dict(asdict(rep), format=MANIFEST_FORMAT, lockmq=_version())
    atomic_write(os.path.join(dest, MANIFEST),
                 json.dumps(manifest, indent=2, sort_keys=True).encode())
    return rep


def read_manifest(path: str) -> dict:
    """The manifest of the backup in ``path``; :class:`BackupError` if there is none
    (not a backup, or one that did not finish)."""
    try:
        with open(os.path.join(path, MANIFEST), "rb") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise BackupError(f"{path} is not a complete lockmq backup (no {MANIFEST}; "
                          "a backup that did not finish has none)") from None
    except ValueError as exc:
        raise BackupError(f"{path}/{MANIFEST} is unreadable: {exc}") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise BackupError(f"{path}: backup format {manifest.get('format')!r} is not "
                          f"{MANIFEST_FORMAT}; restore it with the lockmq that made it")
    return manifest


def restore(src: str, data_dir: str) -> BackupReport:
    """Restore the backup in ``src`` into ``data_dir``, which must not exist or be
    an empty directory (stop the broker first, and point it at ``data_dir``).

    The files are copied (fsynced) into ``<data_dir>.restoring``, opened as a store
    to check them, then renamed to ``data_dir``: an interrupted restore never
    leaves a half-filled data directory. Raises :class:`BackupError`.
    """
    t0 = time.monotonic()
    src = os.path.abspath(src)
    target = os.path.abspath(data_dir)
    manifest = read_manifest(src)
    _require_new(target, "restore")
    work = target + ".restoring"
    if os.path.lexists(work):
        raise BackupError(f"{work} exists (an interrupted restore?): remove it first")
    rep = BackupReport(target, src, str(manifest.get("created", "")))
    os.makedirs(os.path.dirname(work), exist_ok=True)
    for sub in ("", SEGMENT_DIR):
        make_dir(os.path.join(work, sub))
        for name in sorted(os.listdir(os.path.join(src, sub))):
            path = os.path.join(src, sub, name)
            if name in (MANIFEST, LOCK) or not os.path.isfile(path):
                continue
            rep.bytes += _copy_file(path, os.path.join(work, sub, name))
            rep.files += 1
            if not sub and positions_cluster(name) is None and index_topic(name) is None \
                    and name != CHECKPOINT and name not in _STATE_FILES:
                rep.side_files.append(name)
        fsync_dir(os.path.join(work, sub))
    _recover_copy(work, rep)
    if os.path.isdir(target):
        os.rmdir(target)   # empty (checked above)
    os.rename(work, target)
    fsync_dir(os.path.dirname(target))
    rep.seconds = round(time.monotonic() - t0, 3)
    return rep


def _version() -> str:
    from lockmq import __version__
    return __version__
