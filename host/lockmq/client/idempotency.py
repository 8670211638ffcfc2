"""Exactly-once effects for consumers: the paper's processed-message table (§2.1.5).

A broker delivers *at least once*: a lost ack, a lease that expires while a slow
handler still runs, or a broker restart can hand the same message to a consumer
again. The cure is the paper's: give every message a globally unique id (lockmq's
``sn:seq``) and keep a table of processed ids whose primary key is that id. The
handler inserts the id **in the same database transaction** as its own work, so
either both the effect and the mark are committed, or neither is; a redelivered
message finds its id already there and has no second effect.

Two back ends with one interface:

* :class:`SqliteIdempotency` (default; one file, a connection per thread);
* :class:`PostgresIdempotency` (psycopg 3; a connection per thread).

``idempotency_store(target)`` picks one from a path or a ``postgresql://`` DSN.

Usage::

    idem = idempotency_store("app.db")          # or "postgresql://..."

    def handle(msg):
        with idem.transaction(msg.id) as tx:
            if tx.duplicate:
                return                          # processed before: just ack
            tx.conn.execute("INSERT INTO unlocks VALUES (?, ?)", (...))
        # leaving the block committed the effect and the mark together

or, shorter, ``idem.once(msg.id, lambda conn: ...)``.

Concurrency: two workers holding the same message at once (a lease expired under a
slow handler) serialise on the table's primary key — SQLite through ``BEGIN
IMMEDIATE``, PostgreSQL through the unique index, where the second insert waits for
the first transaction and then sees the row (or takes over if the first rolled back).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")
C = TypeVar("C")

#: Default name of the processed-message table.
DEFAULT_TABLE = "lockmq_processed"


def _check_identifier(name: str) -> str:
    """Return ``name`` if it is a safe SQL identifier, else raise ``ValueError``."""
    if not name or not (name[0].isalpha() or name[0] == "_") or not all(
        ch.isalnum() or ch == "_" for ch in name
    ):
        raise ValueError(f"not a plain SQL identifier: {name!r}")
    return name


class Transaction(Generic[C]):
    """One open database transaction that carries a processed-message mark.

    Attributes:
        conn: the database connection; run the handler's own SQL on it.
        message_id: the id being processed (``sn:seq``).
        duplicate: True when the id was already recorded by a committed
            transaction. The transaction then holds nothing and is rolled back.
    """

    __slots__ = ("conn", "message_id", "duplicate")

    def __init__(self, conn: C, message_id: str, duplicate: bool) -> None:
        self.conn = conn
        self.message_id = message_id
        self.duplicate = duplicate


class _TxContext(AbstractContextManager, Generic[C]):
    """Context manager returned by :meth:`IdempotencyStore.transaction`."""

    def __init__(self, store: "IdempotencyStore[C]", message_id: str) -> None:
        self._store = store
        self._message_id = message_id
        self._tx: Transaction[C] | None = None

    def __enter__(self) -> Transaction[C]:
        self._tx = self._store._begin(self._message_id)
        return self._tx

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._tx is not None
        if exc_type is None and not self._tx.duplicate:
            self._store._commit(self._tx.conn)
        else:
            self._store._rollback(self._tx.conn)


class IdempotencyStore(Generic[C]):
    """Common interface of the processed-message table back ends.

    Args:
        table: table name (created if missing).
        scope: namespace inside the table — use the consumer cluster's name when
            several clusters share one database, so each processes every message
            once. Default ``"default"``.
    """

    def __init__(self, table: str = DEFAULT_TABLE, scope: str = "default") -> None:
        self.table = _check_identifier(table)
        self.scope = scope
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[C] = []

    # -- public API ---------------------------------------------------------------
    def transaction(self, message_id: str) -> _TxContext[C]:
        """Open a transaction that records ``message_id`` as processed.

        The mark and everything done on ``tx.conn`` inside the ``with`` block commit
        together when the block ends without an exception; an exception rolls both
        back (the consumer then nacks and the message comes again).
        """
        return _TxContext(self, message_id)

    def once(self, message_id: str, fn: Callable[[C], T]) -> tuple[bool, T | None]:
        """Run ``fn(conn)`` inside the transaction unless ``message_id`` was done.

        Returns ``(True, result)`` when ``fn`` ran and committed, ``(False, None)``
        for a duplicate.
        """
        with self.transaction(message_id) as tx:
            if tx.duplicate:
                return False, None
            return True, fn(tx.conn)

    def wrap(self, fn: Callable[[C, Any], T]) -> Callable[[Any], T | None]:
        """Turn ``fn(conn, msg)`` into a consumer handler ``handler(msg)``.

        The handler skips messages already processed; ``msg`` needs an ``id``.
        """

        def handler(msg: Any) -> T | None:
            with self.transaction(msg.id) as tx:
                if tx.duplicate:
                    return None
                return fn(tx.conn, msg)

        handler.__name__ = getattr(fn, "__name__", "handler")
        handler.__doc__ = fn.__doc__
        return handler

    def is_processed(self, message_id: str) -> bool:
        """Whether ``message_id`` has a committed mark (outside any transaction)."""
        raise NotImplementedError

    def count(self) -> int:
        """Number of marks in this scope."""
        raise NotImplementedError

    def purge(self, older_than_s: float) -> int:
        """Delete marks older than ``older_than_s`` seconds; return how many.

        Only safe for ids the broker can no longer redeliver (past retention and
        the dead-letter horizon).
        """
        raise NotImplementedError

    def close(self) -> None:
        """Close every connection this store opened (in any thread)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - closing from another thread may fail
                pass
        self._local = threading.local()

    def __enter__(self) -> "IdempotencyStore[C]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- back-end hooks -------------------------------------------------------------
    def _conn(self) -> C:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _connect(self) -> C:
        raise NotImplementedError

    def _begin(self, message_id: str) -> Transaction[C]:
        raise NotImplementedError

    def _commit(self, conn: C) -> None:
        conn.commit()  # type: ignore[attr-defined]

    def _rollback(self, conn: C) -> None:
        conn.rollback()  # type: ignore[attr-defined]


class SqliteIdempotency(IdempotencyStore[sqlite3.Connection]):
    """Processed-message table in a SQLite file.

    Each thread gets its own connection (SQLite connections are not shared across
    threads). The database runs in WAL mode; writers serialise through
    ``BEGIN IMMEDIATE`` with ``busy_timeout_ms`` of patience.

    Args:
        path: the database file (created if missing). The handler's own tables
            must live in the same file for the effect and the mark to share a
            transaction.
        busy_timeout_ms: how long a writer waits for another writer's lock.
        synchronous: SQLite ``PRAGMA synchronous`` (``FULL`` by default: a
            committed mark survives a power cut).
    """

    def __init__(
        self,
        path: str,
        table: str = DEFAULT_TABLE,
        scope: str = "default",
        busy_timeout_ms: int = 30_000,
        synchronous: str = "FULL",
    ) -> None:
        super().__init__(table, scope)
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"bad synchronous mode {synchronous!r}")
        self.path = str(path)
        self.busy_timeout_ms = int(busy_timeout_ms)
        self.synchronous = synchronous.upper()
        conn = self._conn()
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            " scope TEXT NOT NULL,"
            " message_id TEXT NOT NULL,"
            " processed_at REAL NOT NULL,"
            " PRIMARY KEY (scope, message_id))"
        )

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, timeout=self.busy_timeout_ms / 1000,
            check_same_thread=False,
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute(f"PRAGMA busy_timeout={self.busy_timeout_ms}")
        return conn

    def _begin(self, message_id: str) -> Transaction[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.execute(
                f"INSERT INTO {self.table} (scope, message_id, processed_at)"
                " VALUES (?, ?, ?) ON CONFLICT (scope, message_id) DO NOTHING",
                (self.scope, message_id, time.time()),
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return Transaction(conn, message_id, duplicate=cur.rowcount == 0)

    def _commit(self, conn: sqlite3.Connection) -> None:
        conn.execute("COMMIT")

    def _rollback(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    def is_processed(self, message_id: str) -> bool:
        row = self._conn().execute(
            f"SELECT 1 FROM {self.table} WHERE scope = ? AND message_id = ?",
            (self.scope, message_id),
        ).fetchone()
        return row is not None

    def count(self) -> int:
        (n,) = self._conn().execute(
            f"SELECT count(*) FROM {self.table} WHERE scope = ?", (self.scope,)
        ).fetchone()
        return int(n)

    def purge(self, older_than_s: float) -> int:
        cur = self._conn().execute(
            f"DELETE FROM {self.table} WHERE scope = ? AND processed_at < ?",
            (self.scope, time.time() - older_than_s),
        )
        return int(cur.rowcount)


class PostgresIdempotency(IdempotencyStore[Any]):
    """Processed-message table in PostgreSQL (psycopg 3).

    Each thread gets its own connection (``autocommit`` off: every
    :meth:`transaction` is one database transaction, committed on exit).

    Args:
        dsn: a libpq connection string or URI, e.g.
            ``postgresql://app@127.0.0.1/app``.
        connect_kwargs: extra keyword arguments for ``psycopg.connect``.
    """

    def __init__(
        self,
        dsn: str,
        table: str = DEFAULT_TABLE,
        scope: str = "default",
        **connect_kwargs: Any,
    ) -> None:
        super().__init__(table, scope)
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "PostgreSQL idempotency needs psycopg 3: pip install 'lockmq[postgres]'"
            ) from exc
        self.dsn = dsn
        self._connect_kwargs = connect_kwargs
        conn = self._conn()
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            " scope TEXT NOT NULL,"
            " message_id TEXT NOT NULL,"
            " processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),"
            " PRIMARY KEY (scope, message_id))"
        )
        conn.commit()

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=False, **self._connect_kwargs)

    def _begin(self, message_id: str) -> Transaction[Any]:
        conn = self._conn()
        try:
            cur = conn.execute(
                f"INSERT INTO {self.table} (scope, message_id) VALUES (%s, %s)"
                " ON CONFLICT (scope, message_id) DO NOTHING",
                (self.scope, message_id),
            )
        except BaseException:
            conn.rollback()
            raise
        return Transaction(conn, message_id, duplicate=cur.rowcount == 0)

    def _query_one(self, sql: str, params: tuple[Any, ...]) -> Any:
        conn = self._conn()
        try:
            row = conn.execute(sql, params).fetchone()
        finally:
            conn.rollback()
        return row

    def is_processed(self, message_id: str) -> bool:
        return self._query_one(
            f"SELECT 1 FROM {self.table} WHERE scope = %s AND message_id = %s",
            (self.scope, message_id),
        ) is not None

    def count(self) -> int:
        (n,) = self._query_one(
            f"SELECT count(*) FROM {self.table} WHERE scope = %s", (self.scope,)
        )
        return int(n)

    def purge(self, older_than_s: float) -> int:
        conn = self._conn()
        cur = conn.execute(
            f"DELETE FROM {self.table} WHERE scope = %s"
            " AND processed_at < now() - make_interval(secs => %s)",
            (self.scope, float(older_than_s)),
        )
        conn.commit()
        return int(cur.rowcount)


def idempotency_store(
    target: str, table: str = DEFAULT_TABLE, scope: str = "default"
) -> IdempotencyStore[Any]:
    """Open the processed-message table named by ``target``.

    ``postgresql://...`` / ``postgres://...`` or a libpq ``key=value`` string opens
    :class:`PostgresIdempotency`; anything else is a SQLite file path.
    """
    if target.startswith(("postgresql://", "postgres://")) or (
        "dbname=" in target or "host=" in target
    ):
        return PostgresIdempotency(target, table=table, scope=scope)
    return SqliteIdempotency(target, table=table, scope=scope)
