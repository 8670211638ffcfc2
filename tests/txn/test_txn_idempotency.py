"""Exactly-once effects end to end: the producer's database change and the message
commit or roll back together (``idempotent_transaction`` on the idempotency helper),
and the consumer applies each committed message once through the same helper."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any, Callable

import pytest

from lockmq.client import SqliteIdempotency, TransactionProducer, idempotent_transaction
from lockmq.testing import BrokerThread, open_peer, wait_for

from .helpers import FAST_CHECKS, pending

PG_DSN = os.environ.get("LOCKMQ_TEST_PG_DSN")


class CrashAfterCommit(Exception):
    """The producer 'dies' after its database committed, before TXN_END."""


def _sqlite(path: str, scope: str) -> tuple[Any, Callable[[], None]]:
    idem = SqliteIdempotency(path, scope=scope)
    idem._conn().execute("CREATE TABLE IF NOT EXISTS grants (card TEXT, msg TEXT)")
    idem._conn().execute("CREATE TABLE IF NOT EXISTS applied (card TEXT)")
    return idem, idem.close


def _postgres(_path: str, scope: str) -> tuple[Any, Callable[[], None]]:
    from lockmq.client import PostgresIdempotency
    table = "t_" + uuid.uuid4().hex[:10]
    idem = PostgresIdempotency(PG_DSN, table=table, scope=scope)
    c = idem._conn()
    c.execute("CREATE TABLE IF NOT EXISTS grants (card TEXT, msg TEXT)")
    c.execute("CREATE TABLE IF NOT EXISTS applied (card TEXT)")
    c.execute("DELETE FROM grants")
    c.execute("DELETE FROM applied")
    c.commit()
    return idem, idem.close


BACKENDS = [pytest.param(_sqlite, id="sqlite"),
            pytest.param(_postgres, id="postgres", marks=pytest.mark.skipif(
                not PG_DSN, reason="set LOCKMQ_TEST_PG_DSN to test PostgreSQL"))]


def _q(idem: Any, sql: str) -> list[tuple[Any, ...]]:
    conn = idem._conn()
    rows = list(conn.execute(sql).fetchall())
    conn.commit()
    return rows


@pytest.mark.parametrize("backend", BACKENDS)
def test_grant_row_and_message_commit_or_roll_back_together_and_apply_once(tmp_path, backend):
    producer_db, close_p = backend(str(tmp_path / "grants.db"), "producer")
    consumer_db, close_c = backend(str(tmp_path / "lock-sync.db"), "consumer")
    try:
        with BrokerThread(str(tmp_path / "data"), transactions=FAST_CHECKS) as broker:
            _run(broker, producer_db, consumer_db)
    finally:
        close_p()
        close_c()


def _run(broker: BrokerThread, producer_db: Any, consumer_db: Any) -> None:
    def grant(conn: Any, msg: Any, arg: tuple[str, str]) -> None:
        card, fate = arg
        conn.execute("INSERT INTO grants VALUES ('%s', '%s')" % (card, msg.id))
        if fate == "db-fails":
            raise RuntimeError("constraint violated")   # the DB transaction rolls back

    local, check = idempotent_transaction(producer_db, grant)

    def local_then_maybe_crash(msg: Any, arg: tuple[str, str]) -> Any:
        out = local(msg, arg)   # the database committed here (or raised)
        if arg[1] == "crash-after-db":
            raise CrashAfterCommit()
        return out

    async def produce() -> None:
        async with TransactionProducer(f"127.0.0.1:{broker.port}", group="grants",
                                       local_transaction=local_then_maybe_crash,
                                       check=check) as tp:
            assert (await tp.send("cards.granted", b"A", ("A", "ok"))).outcome == "commit"
            with pytest.raises(CrashAfterCommit):
                await tp.send("cards.granted", b"B", ("B", "crash-after-db"))
            with pytest.raises(RuntimeError):
                await tp.send("cards.granted", b"C", ("C", "db-fails"))
            with open_peer(broker.port, "ops") as ops:   # B and C: decided by check-back
                await asyncio.to_thread(wait_for, lambda: pending(ops) == [], "check-backs")
            assert tp.stats["checks"] >= 2

    asyncio.run(produce())
    assert sorted(r[0] for r in _q(producer_db, "SELECT card FROM grants")) == ["A", "B"]
    # the consumer: B delivered and redelivered (NACK), each applied once
    with open_peer(broker.port, "lock-sync") as c:
        sub = c.subscribe("cards.granted", "lock-sync")
        seen: list[bytes] = []
        for _ in range(2):   # a first delivery NACKed after the effect: at-least-once
            got = []
            while len(got) < 2:
                got += c.pull(sub.sub_id, 10, wait_ms=2000).messages
            for m in got:
                card = m.payload.decode()
                consumer_db.once(f"{m.sn}:{m.seq}", lambda conn, card=card: conn.execute(
                    "INSERT INTO applied VALUES ('%s')" % card))
                seen.append(m.payload)
            if len(seen) == 2:
                c.nack(sub.sub_id, [m.lease for m in got], delay_ms=1)
            else:
                c.ack(sub.sub_id, [m.lease for m in got])
    assert sorted(seen) == [b"A", b"A", b"B", b"B"]
    assert sorted(r[0] for r in _q(consumer_db, "SELECT card FROM applied")) == ["A", "B"]


def test_a_transactional_card_grant_command_is_issued_only_with_its_grant_row(tmp_path):
    from lockmq.protocol import CommandKind, Op, Role
    idem, close = _sqlite(str(tmp_path / "grants.db"), "producer")
    try:
        with BrokerThread(str(tmp_path / "data"), transactions=FAST_CHECKS) as broker, \
                open_peer(broker.port, "LK-CARDS", Role.LOCK) as lock:
            def grant(conn: Any, msg: Any, card: str) -> None:
                conn.execute("INSERT INTO grants VALUES ('%s', '%s')" % (card, msg.id))
                if card == "bad":
                    raise RuntimeError("no such student")

            local, check = idempotent_transaction(idem, grant)

            async def produce() -> None:
                async with TransactionProducer(f"127.0.0.1:{broker.port}", group="grants",
                                               local_transaction=local, check=check) as tp:
                    cards = (1).to_bytes(2, "big") + bytes.fromhex("0a1b2c3d4e5f6071")
                    with pytest.raises(RuntimeError):
                        await tp.send_command("LK-CARDS", CommandKind.CARDS_SET, cards, "bad")
                    r = await tp.send_command("LK-CARDS", CommandKind.CARDS_SET, cards, "good")
                    assert r.outcome == "commit"
                    with open_peer(broker.port, "ops") as ops:   # the failed grant: checked back
                        await asyncio.to_thread(wait_for, lambda: pending(ops) == [],
                                                "the failed grant's check-back")
            asyncio.run(produce())
            cmd = lock.wait_unsolicited(Op.COMMAND)
            assert cmd.kind == CommandKind.CARDS_SET
            with open_peer(broker.port, "ops") as ops:
                assert ops.admin("stats")["broker"]["txn_commands_issued"] == 1
            assert [f for f in lock.unsolicited if f.opcode == Op.COMMAND] == []
        assert [r[0] for r in _q(idem, "SELECT card FROM grants")] == ["good"]
    finally:
        close()
