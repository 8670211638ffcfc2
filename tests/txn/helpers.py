"""Helpers of the transactional-message tests: a raw-wire transactional producer
(the broker is tested against the protocol itself), a reader of a topic, and a
producer process that can be SIGKILLed in the middle of a transaction."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

from lockmq.protocol import Op
from lockmq.protocol.txn import TxnEnd, TxnJoin, TxnOutcome, TxnPublish
from lockmq.testing import Peer, drain

#: quick check-backs for tests (the defaults are RocketMQ's 6 s / 60 s / 15); many of
#: them, so that a slow machine never reaches the limit before the test answers
FAST_CHECKS = {"check_after_s": 0.3, "check_interval_s": 0.3, "max_checks": 100}
#: the same with a limit reached in about a second
FEW_CHECKS = {**FAST_CHECKS, "max_checks": 2}


def half(peer: Peer, topic: str, seq: int, payload: bytes, group: str = "g") -> int:
    """TXN_PUBLISH; returns the txn id."""
    return peer.request(Op.TXN_PUBLISH, TxnPublish(group, topic, seq, 0, payload).encode()).offset


def end(peer: Peer, txn_id: int, commit: bool) -> Any:
    """TXN_END (commit or rollback); returns the answer (b"" for OK)."""
    outcome = TxnOutcome.COMMIT if commit else TxnOutcome.ROLLBACK
    return peer.request(Op.TXN_END, TxnEnd(txn_id, outcome).encode())


def join(peer: Peer, group: str = "g") -> Any:
    return peer.request(Op.TXN_JOIN, TxnJoin(group).encode())


def read_topic(peer: Peer, topic: str, cluster: str, expect: int) -> list[bytes]:
    """Payloads of the first ``expect`` messages of ``topic`` (acked)."""
    sub = peer.subscribe(topic, cluster)
    return [m.payload for m in drain(peer, sub.sub_id, expect)]


def backlog(peer: Peer, topic: str, cluster: str) -> int:
    """What a new cluster on ``topic`` would be handed (then unsubscribed)."""
    sub = peer.subscribe(topic, cluster)
    from lockmq.protocol import Unsubscribe
    peer.request(Op.UNSUBSCRIBE, Unsubscribe(sub.sub_id).encode())
    return sub.backlog


def pending(peer: Peer) -> list[dict[str, Any]]:
    return peer.admin("txn.list")["transactions"]


#: a TransactionProducer that stores a half message then hangs in its local
#: transaction (printing "in-local"), to be SIGKILLed there
_HANG = textwrap.dedent("""
    import asyncio, sys, threading
    from lockmq.client import TransactionProducer
    async def main():
        def local(msg, arg):
            print("in-local", msg.id, flush=True)
            threading.Event().wait()
        tp = TransactionProducer(sys.argv[1], group="g", producer_id="crashy",
                                 local_transaction=local, check=lambda m: None)
        await tp.connect()
        await tp.send("cards", b"grant-1")
    asyncio.run(main())
""")


def producer_hanging_in_local_transaction(address: str) -> subprocess.Popen[str]:
    """Start it and return once its half message is stored."""
    proc = subprocess.Popen([sys.executable, "-c", _HANG, address], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("in-local"), line
    return proc
