"""The device registry: one row per lock, its wrapped secret, enabled flag and
downlink command counter. Survives restarts (SQLite, fsync on commit)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Iterable

from lockmq.protocol import IDENTITY_RULE, identity_problem
from lockmq.store.files import atomic_write

from . import db, keys
from .identity import fold


def valid_sn(sn: Any) -> bool:
    """Whether ``sn`` can be a lock SN: the protocol's one identity rule
    (:func:`lockmq.protocol.identity_problem`), the one its session checks at CONNECT."""
    return isinstance(sn, str) and identity_problem(sn) is None


#: A device tag: what ``lockmq devices tag`` takes and a rollout selects by.
TAG_RULE = "1-32 characters of A-Z a-z 0-9 . _ : -, starting with a letter or digit"
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,31}")
#: Tags one device carries at most.
MAX_TAGS = 16


def check_tag(tag: str) -> str:
    """Return ``tag`` if it is a valid device tag (:data:`TAG_RULE`), else raise
    ``ValueError``."""
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise ValueError(f"invalid tag {tag!r}: {TAG_RULE}")
    return tag


def check_sn(sn: str) -> str:
    """Return ``sn`` if it is a valid lock serial number, else raise ``ValueError``.

    1-64 characters of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit.
    """
    if not valid_sn(sn):
        raise ValueError(f"invalid SN {sn!r}: {IDENTITY_RULE}")
    return sn


@dataclass(frozen=True)
class DeviceInfo:
    """A registry row without its key."""

    sn: str
    enabled: bool
    key_version: int
    note: str
    created_at: float
    updated_at: float
    last_command_id: int
    #: provisioned for frame MACs: refused on plain TCP without them
    need_mac: bool = False
    #: provisioned for TLS: refused on plain TCP
    need_tls: bool = False
    #: the operator's labels (``lockmq devices tag``), sorted
    tags: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``lockmq devices list --json``."""
        return dict(self.__dict__)


class DeviceExists(ValueError):
    """``add`` of an SN that is already registered."""


class SnTaken(DeviceExists):
    """``add`` of an SN that differs only in case from a registered SN, or that a
    service already uses as its producer id."""


class UnknownDevice(KeyError):
    """An operation on an SN that is not registered."""


#: A claimed producer id's ``last_used`` is rewritten at most this often.
_TOUCH_S = 3600.0


#: rows updated this long before the snapshot's last look are read again when another
#: process committed (its transaction may have stamped them before it committed)
SNAPSHOT_MARGIN_S = 300.0
#: :meth:`DeviceRegistry.lookup_policy`'s answer for an SN not registered
_UNKNOWN: tuple[bytes | None, str, bool, bool, int] = (None, "unknown", False, False, 0)


class DeviceRegistry:
    """Devices and their secrets in the security registry file.

    Args:
        path: the SQLite file (``SecurityConfig.registry_path``).
        master_key: 32 bytes that wrap every stored device key.
    """

    def __init__(self, path: str, master_key: bytes) -> None:
        self.path = path
        self._master = master_key
        self._db = db.connect(path)
        #: the authentication snapshot (:meth:`lookup_policy`): SN -> its answer, every
        #: device's key unwrapped once; None until it is first read
        self._snapshot: dict[str, tuple[bytes | None, str, bool, bool, int]] | None = None
        #: ``data_version`` when it was brought up to date (another process's commit
        #: moves it), and the wall time just before that read
        self._snapshot_version = -1
        self._snapshot_at = 0.0
        #: SNs this registry wrote since (their rows are read again at the next lookup)
        self._stale: set[str] = set()

    @classmethod
    def open(cls, cfg: Any) -> "DeviceRegistry":
        """Open the registry of a :class:`~lockmq.security.config.SecurityConfig`."""
        os.makedirs(os.path.dirname(os.path.abspath(cfg.master_key_path)), exist_ok=True)
        return cls(cfg.registry_path, keys.load_or_create_master_key(cfg.master_key_path))

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    # -- provisioning ------------------------------------------------------------

    def add(self, sn: str, note: str = "", *, mac: bool = True, tls: bool = False) -> bytes:
        """Register ``sn`` with a fresh key and return the key (shown once).

        ``mac`` / ``tls``: what the lock can do, fixed here (SPEC 2 "Per-device
        policy"): a lock provisioned for frame MACs is never accepted on plain TCP
        without them, one provisioned for TLS never on plain TCP, whatever its CONNECT
        says. MACs are the default; ``mac=False`` only for firmware that cannot."""
        return self.add_many([sn], note=note, mac=mac, tls=tls)[sn]

    def add_many(self, sns: Iterable[str], note: str = "", *, mac: bool = True,
                 tls: bool = False) -> dict[str, bytes]:
        """Register many SNs in one transaction (tests, benchmarks, fleet imports)."""
        now = time.time()
        out: dict[str, bytes] = {}
        rows = []
        for sn in sns:
            check_sn(sn)
            key = keys.new_device_key()
            out[sn] = key
            rows.append((sn, keys.wrap_key(self._master, sn, key), note, now, now,
                         int(bool(mac)), int(bool(tls))))
        try:
            self._stale.update(out)   # (read again at the next lookup)
            with self._tx():
                self._check_free([r[0] for r in rows])
                self._db.executemany(
                    "INSERT INTO devices(sn, wrapped_key, note, created_at, updated_at, "
                    "need_mac, need_tls) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        except sqlite3.IntegrityError as exc:
            raise DeviceExists(f"device already registered ({exc})") from None
        return out

    def _check_free(self, sns: list[str]) -> None:
        """Refuse SNs that fold (case-insensitively) onto another registered SN, onto
        each other, or onto a producer id a service already published under: consumers
        and the duplicate table must never mix a lock up with a lookalike."""
        taken = [sn for sn in sns
                 if self._db.execute("SELECT 1 FROM devices WHERE sn = ?", (sn,)).fetchone()]
        if taken:   # all or nothing: name every one, so the operator can drop them
            raise DeviceExists(f"already registered: {', '.join(sorted(set(taken)))}; "
                               "nothing was added (remove those SNs and run it again)")
        if len(set(sns)) != len(sns):
            twice = sorted({sn for sn in sns if sns.count(sn) > 1})
            raise DeviceExists(f"named more than once: {', '.join(twice)}; nothing was added")
        seen: dict[str, str] = {}
        for sn in sns:
            f = fold(sn)
            if f in seen and seen[f] != sn:
                raise SnTaken(f"SNs {seen[f]!r} and {sn!r} differ only in case")
            seen[f] = sn
            row = self._db.execute("SELECT sn FROM devices WHERE sn = ? COLLATE NOCASE "
                                   "AND sn != ? LIMIT 1", (sn, sn)).fetchone()
            if row is not None:
                raise SnTaken(f"SN {sn!r} differs only in case from registered {row[0]!r}")
            row = self._db.execute("SELECT id, owner FROM producer_ids WHERE id_fold = ?",
                                   (f,)).fetchone()
            if row is not None:
                raise SnTaken(f"SN {sn!r} is already used as producer id {row[0]!r} by "
                              f"{row[1]} (its records and duplicate-table entries would "
                              "be mixed up with the lock's): choose another SN")

    def rekey(self, sn: str) -> bytes:
        """Give ``sn`` a new key (the old one stops working at once) and return it."""
        key = keys.new_device_key()
        self._stale.add(sn)   # (read again at the next lookup)
        with self._tx():
            cur = self._db.execute(
                "UPDATE devices SET wrapped_key=?, key_version=key_version+1, updated_at=? "
                "WHERE sn=?", (keys.wrap_key(self._master, sn, key), time.time(), sn))
        if cur.rowcount != 1:
            raise UnknownDevice(sn)
        return key

    def set_policy(self, sn: str, *, mac: bool | None = None, tls: bool | None = None) -> None:
        """Change what ``sn`` is required to use (an operator's decision, never a
        lock's): ``mac`` frame MACs on plain TCP, ``tls`` TLS only."""
        sets, args = [], []
        for column, value in (("need_mac", mac), ("need_tls", tls)):
            if value is not None:
                sets.append(f"{column}=?")
                args.append(int(bool(value)))
        if not sets:
            return
        self._stale.add(sn)   # (read again at the next lookup)
        with self._tx():
            cur = self._db.execute(f"UPDATE devices SET {', '.join(sets)}, updated_at=? "
                                   "WHERE sn=?", (*args, time.time(), sn))
        if cur.rowcount != 1:
            raise UnknownDevice(sn)

    def set_tags(self, sn: str, add: Iterable[str] = (),
                 remove: Iterable[str] = ()) -> tuple[str, ...]:
        """Add and remove tags of ``sn``; returns its tags. Tags only choose locks
        (rollouts), so the row's ``updated_at`` (what the revocation watcher reads)
        stays."""
        add, remove = [check_tag(t) for t in add], [check_tag(t) for t in remove]
        with self._tx():
            row = self._db.execute("SELECT tags FROM devices WHERE sn=?", (sn,)).fetchone()
            if row is None:
                raise UnknownDevice(sn)
            tags = (set(row[0].split()) | set(add)) - set(remove)
            if len(tags) > MAX_TAGS:
                raise ValueError(f"{sn}: at most {MAX_TAGS} tags")
            self._db.execute("UPDATE devices SET tags=? WHERE sn=?", (" ".join(sorted(tags)), sn))
        return tuple(sorted(tags))

    def tagged(self, tag: str) -> list[str]:
        """The SNs that carry ``tag``, sorted."""
        check_tag(tag)
        return [r[0] for r in self._db.execute(
            "SELECT sn FROM devices WHERE instr(' ' || tags || ' ', ?) > 0 ORDER BY sn",
            (f" {tag} ",))]

    def policy(self, sn: str) -> tuple[bool, bool]:
        """``(need_mac, need_tls)`` of ``sn`` ((False, False) when unknown)."""
        row = self._db.execute("SELECT need_mac, need_tls FROM devices WHERE sn=?",
                               (sn,)).fetchone()
        return (False, False) if row is None else (bool(row[0]), bool(row[1]))

    def set_enabled(self, sn: str, enabled: bool) -> None:
        """Enable or disable ``sn``; a disabled lock cannot authenticate."""
        self._stale.add(sn)   # (read again at the next lookup)
        with self._tx():
            cur = self._db.execute("UPDATE devices SET enabled=?, updated_at=? WHERE sn=?",
                                   (1 if enabled else 0, time.time(), sn))
        if cur.rowcount != 1:
            raise UnknownDevice(sn)

    def remove(self, sn: str) -> None:
        """Forget ``sn`` entirely."""
        self._stale.add(sn)   # (read again at the next lookup)
        with self._tx():
            cur = self._db.execute("DELETE FROM devices WHERE sn=?", (sn,))
        if cur.rowcount != 1:
            raise UnknownDevice(sn)

    # -- lookups -----------------------------------------------------------------

    def key_for(self, sn: str) -> bytes | None:
        """The key of an enabled device, or ``None`` (unknown or disabled)."""
        row = self._db.execute("SELECT wrapped_key, enabled FROM devices WHERE sn=?",
                               (sn,)).fetchone()
        if row is None or not row[1]:
            return None
        return keys.unwrap_key(self._master, sn, row[0])

    def lookup(self, sn: str) -> tuple[bytes | None, str]:
        """``(key, state)``, state ``enabled``/``disabled``/``unknown``, from the
        snapshot of :meth:`lookup_policy` (one dict lookup whether ``sn`` exists or
        not, so the time taken does not say which)."""
        return self.lookup_policy(sn)[:2]  # type: ignore[return-value]

    def standing(self, sn: str) -> tuple[bool, int]:
        """``(enabled, key_version)`` of ``sn`` now ((False, 0) when unknown)."""
        row = self._db.execute("SELECT enabled, key_version FROM devices WHERE sn=?",
                               (sn,)).fetchone()
        return (False, 0) if row is None else (bool(row[0]), int(row[1]))

    def changed_since(self, t: float) -> list[tuple[str, bool, int]]:
        """``(sn, enabled, key_version)`` of every device updated at or after ``t``."""
        return [(r[0], bool(r[1]), int(r[2])) for r in self._db.execute(
            "SELECT sn, enabled, key_version FROM devices WHERE updated_at >= ?", (t,))]

    def existing(self, sns: list[str]) -> set[str]:
        """Which of ``sns`` are registered (in chunks: SQLite's parameter limit)."""
        out: set[str] = set()
        for i in range(0, len(sns), 500):
            part = sns[i:i + 500]
            out.update(r[0] for r in self._db.execute(
                f"SELECT sn FROM devices WHERE sn IN ({','.join('?' * len(part))})", part))
        return out

    def data_version(self) -> int:
        """SQLite's ``data_version``: changes when another connection (``lockmq
        devices``/``lockmq tokens``) commits to the file -- a cheap "look again"."""
        return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def lookup_policy(self, sn: str) -> tuple[bytes | None, str, bool, bool, int]:
        """:meth:`lookup` plus the device's ``need_mac``, ``need_tls`` and
        ``key_version``: ``(key, state, need_mac, need_tls, key_version)``.

        Answered from a snapshot of every device row, each key unwrapped once: in a
        reconnect storm a query and an unwrap per AUTH (and the GIL lent to the
        store's writer during the query) were a third of the handshake's Python.
        Before each answer the snapshot is brought up to date: the rows this registry
        wrote, and when another process (``lockmq devices``) committed to the file
        (``data_version``), every row updated since the last look (with
        :data:`SNAPSHOT_MARGIN_S` to spare for a long transaction) and the removed ones;
        so a disabled, removed or re-keyed lock is refused at its next AUTH, as when
        each AUTH queried the file. An SN not there costs the same dict lookup as one
        that is (the guard's proof is computed with a dummy key either way)."""
        version = self.data_version()
        if self._snapshot is None:
            self.load_snapshot(version)
        elif version != self._snapshot_version or self._stale:
            self._refresh_snapshot(version)
        assert self._snapshot is not None
        got = self._snapshot.get(sn)
        return got if got is not None else _UNKNOWN

    def load_snapshot(self, version: int | None = None) -> int:
        """Read :meth:`lookup_policy`'s snapshot whole, every key unwrapped (the
        broker does it at start, not at its first AUTH: ~5 µs a device); returns how
        many devices it holds."""
        if version is None:
            version = self.data_version()
        self._snapshot_at = time.time()
        self._stale.clear()
        self._snapshot = {row[0]: self._policy_row(row) for row in self._db.execute(
            "SELECT sn, wrapped_key, enabled, need_mac, need_tls, key_version FROM devices")}
        self._snapshot_version = version
        return len(self._snapshot)

    def _refresh_snapshot(self, version: int) -> None:
        snap = self._snapshot
        assert snap is not None
        at = time.time()
        cols = "SELECT sn, wrapped_key, enabled, need_mac, need_tls, key_version FROM devices"
        stale, self._stale = self._stale, set()
        if version != self._snapshot_version:   # another process committed
            for row in self._db.execute(cols + " WHERE updated_at >= ?",
                                        (self._snapshot_at - SNAPSHOT_MARGIN_S,)):
                snap[row[0]] = self._policy_row(row)
                stale.discard(row[0])
            if self.count() != len(snap):   # (every row is in it now: the rest were removed)
                present = {r[0] for r in self._db.execute("SELECT sn FROM devices")}
                for gone in [k for k in snap if k not in present]:
                    del snap[gone]
        for sn in stale:
            row = self._db.execute(cols + " WHERE sn=?", (sn,)).fetchone()
            if row is None:
                snap.pop(sn, None)
            else:
                snap[sn] = self._policy_row(row)
        self._snapshot_at, self._snapshot_version = at, version

    def _policy_row(self, row: tuple[Any, ...]) -> tuple[bytes | None, str, bool, bool, int]:
        sn, wrapped, enabled, need_mac, need_tls, key_version = row
        if not enabled:
            return (None, "disabled", False, False, 0)
        return (keys.unwrap_key(self._master, sn, wrapped), "enabled", bool(need_mac),
                bool(need_tls), int(key_version))

    def exists(self, sn: str) -> bool:
        """Whether ``sn`` is registered (enabled or not)."""
        return self._db.execute("SELECT 1 FROM devices WHERE sn=?", (sn,)).fetchone() is not None

    def exists_folded(self, ident: str) -> str | None:
        """The registered SN (enabled or not) that ``ident`` equals case-insensitively
        (``lock-0001`` -> ``LOCK-0001``), or None."""
        row = self._db.execute("SELECT sn FROM devices WHERE sn = ? COLLATE NOCASE LIMIT 1",
                               (ident,)).fetchone()
        return None if row is None else str(row[0])

    # -- producer ids ------------------------------------------------------------

    def claim_producer_id(self, pid: str, owner: str, max_per_owner: int,
                          now: float | None = None) -> str:
        """Claim producer id ``pid`` for ``owner`` on first use; ``""`` if ``owner`` may
        publish under it, else why not: ``"lock"`` (it folds onto a registered SN) or
        ``"owned"`` (another principal published under it first).

        An owner keeps at most ``max_per_owner`` ids: claiming one more forgets its
        least recently used one (clients that pick a fresh id per process would
        otherwise grow the table forever). Persisted: ownership survives restarts.
        """
        now = time.time() if now is None else now
        f = fold(pid)
        row = self._db.execute("SELECT owner, last_used FROM producer_ids WHERE id_fold = ?",
                               (f,)).fetchone()
        if row is not None and row[0] == owner and now - float(row[1]) < _TOUCH_S:
            return ""   # its own id, used lately: no write (reconnects stay cheap)
        with self._tx():
            if self._db.execute("SELECT 1 FROM devices WHERE sn = ? COLLATE NOCASE LIMIT 1",
                                (pid,)).fetchone() is not None:
                return "lock"
            row = self._db.execute("SELECT owner FROM producer_ids WHERE id_fold = ?",
                                   (f,)).fetchone()
            if row is not None:
                if row[0] != owner:
                    return "owned"
                self._db.execute("UPDATE producer_ids SET last_used=? WHERE id_fold=?",
                                 (now, f))
                return ""
            self._db.execute("INSERT INTO producer_ids(id_fold, id, owner, created_at, "
                             "last_used) VALUES (?, ?, ?, ?, ?)", (f, pid, owner, now, now))
            self._db.execute(
                "DELETE FROM producer_ids WHERE id_fold IN (SELECT id_fold FROM producer_ids "
                "WHERE owner=? ORDER BY last_used DESC LIMIT -1 OFFSET ?)",
                (owner, max(1, max_per_owner)))
        return ""

    def producer_ids(self, owner: str | None = None) -> list[dict[str, Any]]:
        """Claimed producer ids (of one owner, or all), most recently used first."""
        sql = "SELECT id, owner, created_at, last_used FROM producer_ids"
        args: tuple[Any, ...] = ()
        if owner:
            sql += " WHERE owner=?"
            args = (owner,)
        return [{"id": r[0], "owner": r[1], "created_at": r[2], "last_used": r[3]}
                for r in self._db.execute(sql + " ORDER BY last_used DESC", args)]

    def get(self, sn: str) -> DeviceInfo:
        """The row of ``sn``; ``UnknownDevice`` if absent."""
        row = self._db.execute(
            "SELECT sn, enabled, key_version, note, created_at, updated_at, last_command_id, "
            "need_mac, need_tls, tags FROM devices WHERE sn=?", (sn,)).fetchone()
        if row is None:
            raise UnknownDevice(sn)
        return _info(row)

    def list(self, pattern: str | None = None, tag: str | None = None) -> list[DeviceInfo]:
        """All devices (optionally those whose SN matches a SQL GLOB, and those that
        carry ``tag``), by SN."""
        sql = ("SELECT sn, enabled, key_version, note, created_at, updated_at, "
               "last_command_id, need_mac, need_tls, tags FROM devices WHERE 1")
        args: list[Any] = []
        if pattern:
            sql += " AND sn GLOB ?"
            args.append(pattern)
        if tag:
            sql += " AND instr(' ' || tags || ' ', ?) > 0"
            args.append(f" {check_tag(tag)} ")
        return [_info(r) for r in self._db.execute(sql + " ORDER BY sn", args)]

    def count(self) -> int:
        """Number of registered devices."""
        return int(self._db.execute("SELECT COUNT(*) FROM devices").fetchone()[0])

    # -- downlink commands -------------------------------------------------------

    def next_command_id(self, sn: str) -> int:
        """Allocate the next command id of ``sn`` (strictly increasing, persisted).

        A lock refuses a command whose id is not above the last one it accepted, so
        the counter must never go back — not even across broker restarts.
        """
        with self._tx():
            cur = self._db.execute(
                "UPDATE devices SET last_command_id=last_command_id+1 WHERE sn=? "
                "RETURNING last_command_id", (sn,))
            row = cur.fetchone()
        if row is None:
            raise UnknownDevice(sn)
        return int(row[0])

    def note_command_id(self, sn: str, cmd_id: int) -> None:
        """Record that ``cmd_id`` was signed for ``sn`` (the counter only goes up)."""
        with self._tx():
            self._db.execute("UPDATE devices SET last_command_id=MAX(last_command_id, ?) "
                             "WHERE sn=?", (int(cmd_id), sn))

    # -- helpers -----------------------------------------------------------------

    def _tx(self) -> "_Tx":
        return _Tx(self._db)


class _Tx:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` / ``ROLLBACK`` on an autocommit connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self._conn.execute("BEGIN IMMEDIATE")
        return self._conn

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._conn.execute("ROLLBACK" if exc_type else "COMMIT")


def _info(row: tuple[Any, ...]) -> DeviceInfo:
    return DeviceInfo(sn=row[0], enabled=bool(row[1]), key_version=int(row[2]), note=row[3],
                      created_at=float(row[4]), updated_at=float(row[5]),
                      last_command_id=int(row[6]), need_mac=bool(row[7]), need_tls=bool(row[8]),
                      tags=tuple(row[9].split()))


def provisioning_config(sn: str, key: bytes, **extra: Any) -> dict[str, Any]:
    """The provisioning document of one lock (written to the board as config.json).

    ``extra`` adds broker address, TLS settings and so on (see firmware/README.md).
    """
    doc: dict[str, Any] = {"sn": sn, "key": key.hex()}
    doc.update({k: v for k, v in extra.items() if v is not None})
    return doc


def write_provisioning(path: str, doc: dict[str, Any]) -> None:
    """Write a provisioning document with mode 0600 (it holds the device secret),
    atomically and durably."""
    atomic_write(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
