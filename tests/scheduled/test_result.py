"""A scheduled command's result, for whoever scheduled it: not pushed (the service
may be long gone), but kept by the broker and read by the admin op
``scheduled.result`` -- what ``Admin.scheduled_result`` polls and ``lockmq scheduled
result`` prints. Over real TCP, the broker on a ManualClock (due when the test says)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from lockmq.clock import ManualClock
from lockmq.client import Admin, AdminError
from lockmq.protocol import CommandKind, CommandResult, CommandStatus, Op, Role
from lockmq.testing import BrokerThread, open_peer, run_cli, wait_for

from .helpers import command_at

SN = "LOCK-R1"


def test_the_result_of_a_scheduled_command_is_read_by_its_id(tmp_path, capsys):
    clock = ManualClock()
    with BrokerThread(str(tmp_path / "d"), clock=clock, scheduled={"max_sleep_ms": 20}) as b, \
            open_peer(b.port, sn="door-service") as svc, \
            open_peer(b.port, sn=SN, role=Role.LOCK) as lock, \
            Admin(b.address) as admin, ThreadPoolExecutor(1) as pool:
        sid = command_at(svc, SN, CommandKind.UNLOCK, b"\x00\x05", clock.wall_ms() + 60_000)

        def state() -> str:
            return svc.admin("scheduled.result", id=sid)["state"]

        assert state() == "waiting"
        # the client's future, waiting before the command is even due
        answer = pool.submit(admin.scheduled_result, sid, 30.0, 0.02)
        clock.advance(60_001)
        cmd = lock.wait_unsolicited(Op.COMMAND)
        wait_for(lambda: state() == "sent", "in the command path, not answered")
        assert not answer.done()
        lock.send(Op.COMMAND_RESULT, CommandResult(SN, cmd.cmd_id, CommandStatus.OK,
                                                   "opened").encode())
        res = answer.result(timeout=30)
        assert (res["id"], res["target"], res["status"], res["detail"]) == (
            sid, SN, CommandStatus.OK, "opened")
        assert svc.admin("scheduled.result", id=sid)["result"] == res
        assert svc.admin("scheduled.list")["recent_command_results"] == [res]
        # the CLI: the state now, and --wait (exit 0: the lock said ok)
        capsys.readouterr()
        assert run_cli("scheduled", "result", "--broker", b.address, str(sid)) == 0
        assert f"scheduled item {sid}: done status=0 opened" in capsys.readouterr().out
        assert run_cli("scheduled", "result", "--broker", b.address, str(sid),
                       "--wait", "5") == 0
        # an id the broker does not know: said so, never waited for
        assert svc.admin("scheduled.result", id=sid + 999)["state"] == "unknown"
        with pytest.raises(AdminError) as err:
            admin.scheduled_result(sid + 999, 30.0)
        assert err.value.error == "UNKNOWN"
        assert run_cli("scheduled", "result", "--broker", b.address, str(sid + 999),
                       "--wait", "5") == 1
        for bad in (-1, "7", True, None):
            r = svc.admin("scheduled.result", id=bad)
            assert r["ok"] is False and r["error"] == "INVALID_ARGUMENT", (bad, r)


def test_a_refused_command_result_fails_the_cli_wait(tmp_path, capsys):
    """The lock refused it: the client gets the status, ``--wait`` exits 1."""
    clock = ManualClock()
    with BrokerThread(str(tmp_path / "d"), clock=clock, scheduled={"max_sleep_ms": 20}) as b, \
            open_peer(b.port, sn="door-service") as svc, \
            open_peer(b.port, sn=SN, role=Role.LOCK) as lock:
        sid = command_at(svc, SN, CommandKind.UNLOCK, b"", clock.wall_ms() + 1000)
        clock.advance(1001)
        cmd = lock.wait_unsolicited(Op.COMMAND)
        lock.send(Op.COMMAND_RESULT, CommandResult(SN, cmd.cmd_id, CommandStatus.REFUSED,
                                                   "jammed").encode())
        wait_for(lambda: svc.admin("scheduled.result", id=sid)["state"] == "done", "the result")
        capsys.readouterr()
        assert run_cli("scheduled", "result", "--broker", b.address, str(sid),
                       "--wait", "5") == 1
        assert f"status={CommandStatus.REFUSED} jammed" in capsys.readouterr().out


def test_the_kept_results_and_sent_ids_are_bounded() -> None:
    from lockmq.broker.scheduler import _remember

    table: dict[int, int] = {}
    for i in range(10):
        _remember(table, i, i * 10, 4)
    _remember(table, 7, 70, 4)            # again: moved last, nothing else lost
    assert list(table) == [6, 8, 9, 7]
