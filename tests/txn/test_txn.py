"""Transactional messages over real TCP (a broker in this process): commit,
rollback, invisibility of half messages, check-back and its limit, bad input."""

from __future__ import annotations

import pytest

from lockmq.protocol import (Command, CommandKind, CommandResult, CommandStatus, ErrorCode, Op,
                             Role)
from lockmq.protocol import PublishAck
from lockmq.protocol.txn import TxnCheck, TxnEnd, TxnOutcome, TxnPublish
from lockmq.testing import BrokerThread, open_peer, refusal, run_cli, wait_for

from .helpers import FAST_CHECKS, FEW_CHECKS, backlog, end, half, join, pending, read_topic


@pytest.fixture
def broker(tmp_path):
    b = BrokerThread(str(tmp_path / "data"), transactions=FAST_CHECKS).start()
    try:
        yield b
    finally:
        b.stop()


def test_a_committed_message_is_delivered_once_even_when_commit_and_half_are_retried(broker):
    with open_peer(broker.port, "svc-tx") as p:
        txn = half(p, "cards", 1, b"grant")
        again = p.request(Op.TXN_PUBLISH, TxnPublish("g", "cards", 1, 0, b"grant").encode())
        assert again == PublishAck(PublishAck.DUPLICATE, txn)   # a retried half
        assert end(p, txn, commit=True) == b""
        assert end(p, txn, commit=True) == b""          # a retried commit: OK, nothing new
        assert read_topic(p, "cards", "c1", 1) == [b"grant"]
        assert backlog(p, "cards", "c2") == 1
        assert pending(p) == []


def test_a_rolled_back_message_is_never_delivered_and_cannot_be_committed_after(broker):
    with open_peer(broker.port, "svc-tx") as p:
        txn = half(p, "cards", 1, b"no")
        assert end(p, txn, commit=False) == b""
        assert refusal(lambda: end(p, txn, commit=True)).code == ErrorCode.INVALID_ARGUMENT
        assert refusal(lambda: end(p, 999_999, commit=True)).code == ErrorCode.INVALID_ARGUMENT
        kept = half(p, "cards", 2, b"yes")
        end(p, kept, commit=True)
        assert read_topic(p, "cards", "c1", 1) == [b"yes"]
        assert backlog(p, "cards", "c2") == 1


def test_a_half_message_is_invisible_until_committed(broker):
    with open_peer(broker.port, "svc-tx") as p, open_peer(broker.port, "reader") as r:
        sub = r.subscribe("cards", "c1")
        txn = half(p, "cards", 1, b"later")
        assert [t["txn_id"] for t in pending(p)] == [txn]
        assert r.pull(sub.sub_id, 10, wait_ms=200).messages == []
        end(p, txn, commit=True)
        got = r.pull(sub.sub_id, 10, wait_ms=5000).messages
        assert [(m.sn, m.seq, m.payload) for m in got] == [("svc-tx", 1, b"later")]


def test_an_undecided_transaction_is_checked_back_and_the_answer_decides(broker):
    with open_peer(broker.port, "svc-tx") as p, open_peer(broker.port, "svc-tx2") as other:
        join(other, "g")
        txn = half(p, "cards", 7, b"checked")
        p.close()   # the producer is gone: the group's other member is asked
        body = other.wait_unsolicited(Op.TXN_CHECK)
        assert isinstance(body, TxnCheck)
        assert (body.txn_id, body.topic, body.sn, body.seq, body.payload) == \
            (txn, "cards", "svc-tx", 7, b"checked")
        other.send(Op.TXN_CHECK_ANSWER, TxnEnd(txn, TxnOutcome.COMMIT).encode())
        wait_for(lambda: pending(other) == [], "the answer ended the transaction")
        assert read_topic(other, "cards", "c1", 1) == [b"checked"]


def _silent_member_sees_checks_until_the_limit(port: int) -> tuple[int, object]:
    with open_peer(port, "svc-tx") as p:
        join(p, "g")
        txn = half(p, "cards", 1, b"undecided")
        p.send(Op.TXN_CHECK_ANSWER, TxnEnd(txn, TxnOutcome.UNKNOWN).encode())
        wait_for(lambda: pending(p) == [], "the check limit ended the transaction", timeout=20)
        # every check was sent before the limit ended it, so before the last answer read
        checks = sum(1 for f in p.unsolicited if f.opcode == Op.TXN_CHECK)
        return checks, p.admin("stats")


def test_no_answer_rolls_back_after_max_checks_by_default(tmp_path):
    with BrokerThread(str(tmp_path / "d"), transactions=FEW_CHECKS) as b:
        checks, stats = _silent_member_sees_checks_until_the_limit(b.port)
        assert checks == FEW_CHECKS["max_checks"]
        assert stats["broker"]["txn_check_limit"] == 1 and stats["broker"]["txn_rolled_back"] == 1
        with open_peer(b.port, "r") as r:
            assert backlog(r, "cards", "c1") == 0


def test_no_answer_commits_after_max_checks_when_configured(tmp_path):
    tables = {**FEW_CHECKS, "on_check_limit": "commit"}
    with BrokerThread(str(tmp_path / "d"), transactions=tables) as b:
        checks, _ = _silent_member_sees_checks_until_the_limit(b.port)
        assert checks == FEW_CHECKS["max_checks"]
        with open_peer(b.port, "r") as r:
            assert read_topic(r, "cards", "c1", 1) == [b"undecided"]


def test_bad_transactional_bodies_are_refused_and_the_broker_keeps_serving(broker):
    with open_peer(broker.port, "svc-bad") as bad:
        # outcome 0 (unknown) is for check answers only; 7 is no outcome at all
        assert refusal(lambda: bad.request(Op.TXN_END, bytes(8) + b"\x00")).code == \
            ErrorCode.INVALID_ARGUMENT
        assert refusal(lambda: bad.request(Op.TXN_END, bytes(8) + b"\x07")).code in \
            (ErrorCode.BAD_BODY, None)   # a malformed frame: answered, then closed
    with open_peer(broker.port, "svc-tx") as p:
        txn = half(p, "cards", 1, b"ok")
        end(p, txn, commit=True)
        assert read_topic(p, "cards", "c1", 1) == [b"ok"]


def test_operators_list_and_resolve_pending_transactions_with_the_cli(broker, capsys):
    with open_peer(broker.port, "svc-tx") as p:
        keep = half(p, "cards", 1, b"operator-commits")
        drop = half(p, "cards", 2, b"operator-drops")
        addr = ["--broker", f"127.0.0.1:{broker.port}"]
        assert run_cli("txn", "list", *addr) == 0
        out = capsys.readouterr().out
        assert str(keep) in out and str(drop) in out and "svc-tx:2" in out
        assert run_cli("txn", "resolve", *addr, str(keep), "commit") == 0
        assert run_cli("txn", "resolve", *addr, str(drop), "rollback") == 0
        assert run_cli("txn", "resolve", *addr, str(drop), "commit") != 0   # ended already
        assert pending(p) == []
        assert read_topic(p, "cards", "c1", 1) == [b"operator-commits"]
        assert backlog(p, "cards", "c2") == 1


def test_a_transactional_command_reaches_the_lock_only_when_committed(broker):
    args = (5).to_bytes(2, "big")
    with open_peer(broker.port, "LK-TX1", Role.LOCK) as lock, open_peer(broker.port, "svc-tx") as p:
        dropped = half(p, "$command", 1, Command("LK-TX1", 0, 0, CommandKind.UNLOCK, args).encode())
        kept = half(p, "$command", 2, Command("LK-TX1", 0, 0, CommandKind.UNLOCK, args).encode())
        assert p.admin("commands")["total_queued"] == 0      # nothing issued while undecided
        end(p, dropped, commit=False)
        end(p, kept, commit=True)
        cmd = lock.wait_unsolicited(Op.COMMAND)
        assert (cmd.target, cmd.kind, cmd.args) == ("LK-TX1", CommandKind.UNLOCK, args)
        lock.send(Op.COMMAND_RESULT, CommandResult("LK-TX1", cmd.cmd_id, CommandStatus.OK).encode())
        wait_for(lambda: p.admin("stats")["broker"]["txn_command_results"] == 1, "the result")
        stats = p.admin("stats")["broker"]
        assert stats["txn_commands_issued"] == 1 and stats["commands_received"] == 1
        assert [f for f in lock.unsolicited if f.opcode == Op.COMMAND] == []   # one command
        # a half command with a malformed COMMAND body is refused at once
        assert refusal(lambda: half(p, "$command", 3, b"\x01")).code == ErrorCode.INVALID_ARGUMENT


def test_a_committed_command_refused_by_the_command_path_is_counted(broker):
    """The producer may be gone by commit time: a refusal is counted and logged."""
    expired = Command("LK-TX2", 0, 1, CommandKind.REBOOT).encode()   # expires_ms in 1970
    with open_peer(broker.port, "svc-tx") as p:
        end(p, half(p, "$command", 1, expired), commit=True)
        wait_for(lambda: p.admin("stats")["broker"].get("txn_commands_refused") == 1,
                 "the refusal")
        assert p.admin("commands")["held"] == 0
