"""The processed-message table: one effect per message id, in the handler's transaction."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from lockmq.client.idempotency import (
    PostgresIdempotency,
    SqliteIdempotency,
    idempotency_store,
)

PG_DSN = os.environ.get("LOCKMQ_TEST_PG_DSN")


def _sqlite(tmp_path, **kw):
    store = SqliteIdempotency(str(tmp_path / "app.db"), **kw)
    store._conn().execute("CREATE TABLE IF NOT EXISTS effects (id TEXT, n INTEGER)")
    return store


def _pg(table: str):
    store = PostgresIdempotency(PG_DSN, table=table)
    conn = store._conn()
    conn.execute(f"CREATE TABLE IF NOT EXISTS {table}_effects (id TEXT, n INTEGER)")
    conn.commit()
    return store


def test_second_delivery_has_no_effect(tmp_path):
    store = _sqlite(tmp_path)
    for _ in range(3):
        with store.transaction("L1:7") as tx:
            if not tx.duplicate:
                tx.conn.execute("INSERT INTO effects VALUES ('L1:7', 1)")
    (n,) = store._conn().execute("SELECT count(*) FROM effects").fetchone()
    assert n == 1
    assert store.is_processed("L1:7")
    assert not store.is_processed("L1:8")
    store.close()


def test_exception_rolls_back_effect_and_mark(tmp_path):
    store = _sqlite(tmp_path)
    with pytest.raises(RuntimeError):
        with store.transaction("L1:1") as tx:
            tx.conn.execute("INSERT INTO effects VALUES ('L1:1', 1)")
            raise RuntimeError("handler failed")
    assert not store.is_processed("L1:1")
    (n,) = store._conn().execute("SELECT count(*) FROM effects").fetchone()
    assert n == 0
    applied, _ = store.once("L1:1", lambda c: c.execute("INSERT INTO effects VALUES ('L1:1', 2)"))
    assert applied
    assert store.count() == 1
    store.close()


def test_scopes_are_independent(tmp_path):
    a = SqliteIdempotency(str(tmp_path / "x.db"), scope="billing")
    b = SqliteIdempotency(str(tmp_path / "x.db"), scope="audit")
    assert a.once("S:1", lambda c: 1) == (True, 1)
    assert a.once("S:1", lambda c: 1) == (False, None)
    assert b.once("S:1", lambda c: 2) == (True, 2)
    a.close()
    b.close()


def test_wrap_makes_a_handler(tmp_path):
    store = _sqlite(tmp_path)
    seen = []

    class Msg:
        id = "L9:3"

    handler = store.wrap(lambda conn, msg: seen.append(msg.id) or "done")
    assert handler(Msg()) == "done"
    assert handler(Msg()) is None
    assert seen == ["L9:3"]
    store.close()


def _race(store, ids, workers):
    """Each worker processes every id; count how often an effect was applied."""
    applied = []
    lock = threading.Lock()
    barrier = threading.Barrier(workers)

    def work():
        barrier.wait()
        for mid in ids:
            ok, _ = store.once(mid, lambda conn: None)
            if ok:
                with lock:
                    applied.append(mid)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return applied


def test_concurrent_workers_apply_each_id_once_sqlite(tmp_path):
    store = _sqlite(tmp_path, synchronous="NORMAL")
    ids = [f"L{i % 7}:{i}" for i in range(200)]
    applied = _race(store, ids, workers=4)
    assert sorted(applied) == sorted(ids)
    assert store.count() == 200
    store.close()


def test_store_selection(tmp_path):
    assert isinstance(idempotency_store(str(tmp_path / "a.db")), SqliteIdempotency)
    with pytest.raises(ValueError):
        SqliteIdempotency(str(tmp_path / "b.db"), table="x; drop table y")


@pytest.mark.skipif(not PG_DSN, reason="set LOCKMQ_TEST_PG_DSN to test PostgreSQL")
def test_postgres_duplicate_and_rollback():
    table = "t_" + uuid.uuid4().hex[:10]
    store = _pg(table)
    try:
        with pytest.raises(RuntimeError):
            with store.transaction("P:1") as tx:
                tx.conn.execute(f"INSERT INTO {table}_effects VALUES ('P:1', 1)")
                raise RuntimeError("boom")
        assert not store.is_processed("P:1")
        for _ in range(3):
            with store.transaction("P:1") as tx:
                if not tx.duplicate:
                    tx.conn.execute(f"INSERT INTO {table}_effects VALUES ('P:1', 1)")
        conn = store._conn()
        (n,) = conn.execute(f"SELECT count(*) FROM {table}_effects").fetchone()
        conn.rollback()
        assert n == 1 and store.count() == 1
        assert isinstance(idempotency_store(PG_DSN, table=table), PostgresIdempotency)
    finally:
        conn = store._conn()
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"DROP TABLE IF EXISTS {table}_effects")
        conn.commit()
        store.close()


@pytest.mark.skipif(not PG_DSN, reason="set LOCKMQ_TEST_PG_DSN to test PostgreSQL")
def test_concurrent_workers_apply_each_id_once_postgres():
    table = "t_" + uuid.uuid4().hex[:10]
    store = _pg(table)
    try:
        ids = [f"L{i % 5}:{i}" for i in range(100)]
        applied = _race(store, ids, workers=4)
        assert sorted(applied) == sorted(ids)
    finally:
        conn = store._conn()
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"DROP TABLE IF EXISTS {table}_effects")
        conn.commit()
        store.close()
