"""The security registry's SQLite file: schema and connection settings.

One file (``<data_dir>/security.db``) holds devices, tokens, per-lock command
counters and which principal owns which producer id. WAL mode lets ``lockmq devices``/``lockmq tokens`` write while the broker
reads; the broker reads per authentication, so a disabled device or a revoked token
is refused at its next connect without a restart.
"""

from __future__ import annotations

import os
import sqlite3

from lockmq.store.files import atomic_write

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
    sn              TEXT PRIMARY KEY,
    wrapped_key     BLOB NOT NULL,
    key_version     INTEGER NOT NULL DEFAULT 1,
    enabled         INTEGER NOT NULL DEFAULT 1,
    note            TEXT NOT NULL DEFAULT '',
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    last_command_id INTEGER NOT NULL DEFAULT 0,
    -- what the lock was provisioned to do (SPEC 2 "Per-device policy"): 1 = never
    -- accepted without it on plain TCP (frame MACs) / at all (TLS). 0 for rows
    -- written before the policy existed (lock_frame_mac = "optional" applies to them).
    need_mac        INTEGER NOT NULL DEFAULT 0,
    need_tls        INTEGER NOT NULL DEFAULT 0,
    -- the operator's labels for choosing locks (rollouts): sorted, space-separated
    tags            TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    secret_hash BLOB NOT NULL,
    perms       TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL,
    revoked_at  REAL
);
-- Lookalike SNs and producer ids are compared case-insensitively (ASCII charset).
CREATE INDEX IF NOT EXISTS devices_sn_nocase ON devices(sn COLLATE NOCASE);
-- Producer ids (PUBLISH SNs) of token holders: owned by the principal that first
-- published under one (lockmq.security.identity); id_fold is the case-folded id.
CREATE TABLE IF NOT EXISTS producer_ids (
    id_fold    TEXT PRIMARY KEY,
    id         TEXT NOT NULL,
    owner      TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_used  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS producer_ids_owner ON producer_ids(owner, last_used);
"""


def connect(path: str) -> sqlite3.Connection:
    """Open (creating if needed) the registry at ``path``, mode 0600, schema applied."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.executescript(_SCHEMA)
    _add_columns(conn)
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None:
        conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                     (str(SCHEMA_VERSION),))
    elif int(row[0]) > SCHEMA_VERSION:
        conn.close()
        raise ValueError(f"{path}: registry schema {row[0]} is newer than this lockmq "
                         f"({SCHEMA_VERSION})")
    return conn


#: columns added after a table was first released: (table, column, declaration)
_ADDED_COLUMNS = (("devices", "need_mac", "INTEGER NOT NULL DEFAULT 0"),
                  ("devices", "need_tls", "INTEGER NOT NULL DEFAULT 0"),
                  ("devices", "tags", "TEXT NOT NULL DEFAULT ''"))


def _add_columns(conn: sqlite3.Connection) -> None:
    """Bring a registry written by an older lockmq up to this schema (adds columns
    with their defaults; existing rows keep their meaning)."""
    for table, column, decl in _ADDED_COLUMNS:
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            try:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            except sqlite3.OperationalError as exc:   # another process added it first
                if "duplicate column" not in str(exc):
                    raise


def snapshot(conn: sqlite3.Connection) -> bytes:
    """A consistent copy of the whole registry behind ``conn`` as database-file bytes
    (SQLite's online backup into memory: one read transaction, writers keep going).
    What a standby installs (lockmq.replication.registry_copy)."""
    mem = sqlite3.connect(":memory:")
    try:
        conn.backup(mem)
        return mem.serialize()
    finally:
        mem.close()


def install(path: str, data: bytes) -> None:
    """Replace the registry file at ``path`` by ``data`` (a :func:`snapshot`), crash-safe:
    written beside it, fsynced, renamed over it, the directory fsynced. Only while no
    process has the registry open (a standby that is not serving yet)."""
    # a WAL left beside the old file would be replayed into the new one: drop it first
    for side in (path + "-wal", path + "-shm"):
        try:
            os.unlink(side)
        except FileNotFoundError:
            pass
    atomic_write(path, data)
