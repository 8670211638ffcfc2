"""Transactions survive SIGKILL: of the producer between half message and commit,
and of the broker after a commit and with a transaction pending (``lockmq broker``
processes)."""

from __future__ import annotations

import asyncio

import pytest

from lockmq.client import TransactionProducer
from lockmq.client.transaction import COMMIT
from lockmq.protocol import Op
from lockmq.protocol.txn import TxnCheck, TxnEnd, TxnOutcome
from lockmq.testing import BrokerProcess, open_peer, wait_for

from .helpers import (FAST_CHECKS, backlog, end, half, join, pending,
                      producer_hanging_in_local_transaction, read_topic)


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "data", {"broker": {"auth": "off"},
                                          "transactions": FAST_CHECKS})
    try:
        yield b
    finally:
        b.stop()


def test_a_producer_killed_between_half_and_commit_is_replaced_by_the_group(broker):
    proc = producer_hanging_in_local_transaction(broker.address)
    proc.kill()
    proc.wait()
    asked: list[str] = []

    async def new_member() -> None:
        def check(msg):
            asked.append(msg.id)
            return COMMIT     # the new producer finds the local change committed
        async with TransactionProducer(broker.address, group="g", local_transaction=lambda m, a: 0,
                                       check=check):
            while not asked:
                await asyncio.sleep(0.02)
            with open_peer(broker.port, "admin") as a:
                await asyncio.to_thread(wait_for, lambda: pending(a) == [], "checked back")

    asyncio.run(new_member())
    assert asked == ["crashy:0"]
    with open_peer(broker.port, "reader") as r:
        assert read_topic(r, "cards", "c1", 1) == [b"grant-1"]
        assert backlog(r, "cards", "c2") == 1


def test_a_commit_acked_before_a_broker_crash_is_delivered_after_restart(broker):
    with open_peer(broker.port, "svc-tx") as p:
        txn = half(p, "cards", 1, b"committed")
        assert end(p, txn, commit=True) == b""
    broker.restart(crash=True)
    with open_peer(broker.port, "svc-tx") as p:
        assert pending(p) == []
        assert end(p, txn, commit=True) == b""        # retried after the crash: still OK
        assert read_topic(p, "cards", "c1", 1) == [b"committed"]
        assert backlog(p, "cards", "c2") == 1


def test_a_pending_half_survives_a_broker_crash_and_is_checked_back(broker):
    with open_peer(broker.port, "svc-tx") as p:
        txn = half(p, "cards", 5, b"pending")
        rolled = half(p, "cards", 6, b"rolled")
        end(p, rolled, commit=False)
    broker.restart(crash=True)
    with open_peer(broker.port, "svc-tx2") as q:
        assert [t["txn_id"] for t in pending(q)] == [txn]
        join(q, "g")
        chk = q.wait_unsolicited(Op.TXN_CHECK)
        assert isinstance(chk, TxnCheck) and (chk.txn_id, chk.seq) == (txn, 5)
        q.send(Op.TXN_CHECK_ANSWER, TxnEnd(txn, TxnOutcome.COMMIT).encode())
        wait_for(lambda: pending(q) == [], "the answer ended it")
        assert read_topic(q, "cards", "c1", 1) == [b"pending"]
        assert backlog(q, "cards", "c2") == 1
