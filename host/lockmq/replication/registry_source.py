"""The primary's side of security-registry replication: ``replica.security``.

The registry (``security.db``: device keys, tokens, producer-id owners, command
counters) is SQLite in WAL mode, written by the broker and by ``lockmq devices`` /
``lockmq tokens``. The standby asks now and then with the version it holds; when the
registry changed (``PRAGMA data_version`` on a connection of our own sees every
other connection's commits) the answer carries a consistent snapshot (SQLite's
backup API), in chunks that fit a frame. The version is the snapshot's SHA-256, so
the standby can check what it assembled. Every answer names the master key by its
fingerprint: device keys in the snapshot are wrapped under it, so a standby with
another key must not follow (lockmq.replication.registry_copy).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import sqlite3
from typing import Any

from lockmq.admin_error import AdminError
from lockmq.security import db, keys

#: most snapshot bytes one answer carries (base64 of it stays under a 1 MiB frame)
CHUNK_BYTES = 512 * 1024


class RegistrySource:
    """Serves snapshots of the registry at ``db_path`` (one cached: the newest)."""

    def __init__(self, db_path: str, master_key_path: str) -> None:
        self.db_path = db_path
        self.master_key_path = master_key_path
        self._conn: sqlite3.Connection | None = None
        self._data_version = -1
        self._snapshot = b""
        self.version = ""
        self._lock = asyncio.Lock()
        #: the master key's fingerprint and the file state it was read from
        self._key_stamp: tuple[int, ...] | None = None
        self._key_fingerprint = ""

    def close(self) -> None:
        """Close the registry connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def key_fingerprint(self) -> str:
        """The master key's fingerprint ("" without a key file), read and checked
        (size, mode) once, and again only when the file changed: it is named in every
        answer, and a standby asks every ``registry_every_s``."""
        try:
            st = os.stat(self.master_key_path)
            stamp: tuple[int, ...] | None = (st.st_dev, st.st_ino, st.st_size,
                                             st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
        except FileNotFoundError:
            stamp = None
        if stamp != self._key_stamp or stamp is None:
            # (re-read when missing too: the key may appear between stat and read)
            fingerprint = keys.master_key_fingerprint(
                keys.read_master_key(self.master_key_path))
            self._key_stamp, self._key_fingerprint = stamp, fingerprint
        return self._key_fingerprint

    def _refresh(self) -> None:
        """Take a new snapshot if the registry changed since the last one (a thread)."""
        if self._conn is None:
            if not os.path.exists(self.db_path):
                return   # (auth off and no registry yet: nothing to copy)
            self._conn = sqlite3.connect(self.db_path, isolation_level=None,
                                         check_same_thread=False, timeout=5.0)
            self._conn.execute("PRAGMA busy_timeout=5000")
        dv = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if dv == self._data_version and self.version:
            return
        self._data_version = dv
        self._snapshot = db.snapshot(self._conn)
        self.version = hashlib.sha256(self._snapshot).hexdigest()

    async def serve(self, args: dict[str, Any]) -> dict[str, Any]:
        """``replica.security`` {have?, offset?}: the registry snapshot from ``offset``
        unless the standby already has version ``have``."""
        have = args.get("have", "")
        offset = args.get("offset", 0)
        if not isinstance(have, str) or not isinstance(offset, int) \
                or isinstance(offset, bool) or offset < 0:
            raise AdminError("INVALID_ARGUMENT", "have must be a string and offset an "
                             "integer >= 0")
        try:
            fingerprint = self.key_fingerprint()
        except ValueError as exc:
            raise AdminError("INTERNAL", str(exc)) from None
        async with self._lock:   # (one snapshot at a time; the loop keeps serving)
            if offset == 0:
                await asyncio.to_thread(self._refresh)
            version, snap = self.version, self._snapshot
        out: dict[str, Any] = {"ok": True, "key_fingerprint": fingerprint,
                               "version": version, "size": len(snap)}
        if version and version != have:
            out["offset"] = offset
            out["data"] = base64.b64encode(snap[offset:offset + CHUNK_BYTES]).decode()
        return out
