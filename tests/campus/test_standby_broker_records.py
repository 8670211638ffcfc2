"""Sync replication covers the records the broker writes itself (issue #16): a
transaction's commit is answered, a scheduled delivery marked done, only once the
standby has the record; the promoted standby delivers it."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

from lockmq.protocol import Op
from lockmq.protocol.schedule import PublishAt
from lockmq.protocol.txn import TxnEnd, TxnOutcome, TxnPublish
from lockmq.testing import BrokerProcess, drain, free_port, open_peer, run_cli, wait_for


def _status(port: int) -> dict:
    p = open_peer(port, sn="ops")
    try:
        return p.admin("replica.status")
    finally:
        p.close()


@contextlib.contextmanager
def _pair(tmp_path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """A sync primary and its standby, in sync; both ended after (the standby
    continued first if a test left it stopped)."""
    primary = BrokerProcess(str(tmp_path / "p" / "data"), {
        "broker": {"auth": "off"},
        # long: the test holds the standby still; the primary must not degrade meanwhile
        "replication": {"sync": True, "sync_timeout_s": 120.0}})
    standby = BrokerProcess(str(tmp_path / "s" / "data"), {
        "broker": {"auth": "off", "port": free_port()},
        "replication": {"role": "standby", "primary": primary.address,
                        "fetch_wait_ms": 200}}, start=False).start(ready=r"standby_following")
    try:
        wait_for(lambda: _status(primary.port)["in_sync"], "the standby in sync")
        yield primary, standby
    finally:
        if standby.running():
            os.kill(standby.proc.pid, signal.SIGCONT)
        primary.kill()
        standby.stop()


def _promoted_reads(primary: BrokerProcess, standby: BrokerProcess, topic: str) -> list[bytes]:
    """Kill the primary, promote the standby, read the one message of ``topic``."""
    primary.kill()
    assert run_cli("standby", "promote", "--data-dir", standby.data_dir) == 0
    standby.wait_log(r"broker_started", timeout=30)
    cons = open_peer(standby.port, sn="reader")
    sub = cons.subscribe(topic, "backend")
    got = [m.payload for m in drain(cons, sub.sub_id, 1)]
    cons.close()
    return got


def test_a_commit_is_answered_only_once_the_standby_has_it(tmp_path):
    answer: list = []
    with _pair(tmp_path) as (primary, standby):
        producer = open_peer(primary.port, sn="svc")
        txn_id = producer.request(Op.TXN_PUBLISH, TxnPublish(
            "g", "orders", 1, 0, b"committed").encode()).offset
        os.kill(standby.proc.pid, signal.SIGSTOP)    # the standby stops fetching
        ender = threading.Thread(target=lambda: answer.append(producer.request(
            Op.TXN_END, TxnEnd(txn_id, TxnOutcome.COMMIT).encode())))
        ender.start()
        wait_for(lambda: _status(primary.port)["waiting"] >= 1, "the commit waiting")
        assert ender.is_alive() and not answer, "TXN_END answered before the standby had it"
        os.kill(standby.proc.pid, signal.SIGCONT)
        ender.join(30)
        assert answer == [b""]                       # OK
        producer.close()
        got = _promoted_reads(primary, standby, "orders")
    assert got == [b"committed"]


def test_a_scheduled_delivery_is_marked_done_only_once_the_standby_has_it(tmp_path):
    with _pair(tmp_path) as (primary, standby):
        producer = open_peer(primary.port, sn="svc")
        due = int(time.time() * 1000) + 3000   # (the standby stops well before)
        producer.request(Op.PUBLISH_AT, PublishAt("reminders", 1, 0, due, b"due").encode())
        producer.close()
        os.kill(standby.proc.pid, signal.SIGSTOP)    # before the delivery is due
        wait_for(lambda: _status(primary.port)["waiting"] >= 1, "the delivery waiting")
        ops = open_peer(primary.port, sn="ops")
        assert ops.admin("scheduled.list")["waiting"] == 1, "marked delivered too early"
        os.kill(standby.proc.pid, signal.SIGCONT)
        wait_for(lambda: ops.admin("scheduled.list")["waiting"] == 0, "marked delivered")
        ops.close()
        got = _promoted_reads(primary, standby, "reminders")
    assert got == [b"due"]
