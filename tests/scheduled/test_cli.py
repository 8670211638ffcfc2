"""``lockmq produce --delay/--at/--level``, ``lockmq scheduled list|cancel``."""
from __future__ import annotations

from lockmq.testing import BrokerThread, open_peer, run_cli, wait_for

from .helpers import consume


def test_cli_schedules_lists_and_cancels(tmp_path, capsys):
    with BrokerThread(str(tmp_path / "d"), scheduled={"max_sleep_ms": 50}) as b, \
            open_peer(b.port) as p:
        assert run_cli("produce", "--broker", b.address, "t", "in an hour", "--level", "17") == 0
        assert run_cli("produce", "--broker", b.address, "t", "soon", "--delay", "0.2") == 0
        assert run_cli("produce", "--broker", b.address, "t", "x", "--at", "2001-01-01T00:00",
                       "--mode", "oneway") == 2
        [m] = consume(p, "t", 1)
        assert m.payload == b"soon"
        wait_for(lambda: p.admin("scheduled.list")["waiting"] == 1, "the delivered mark")
        capsys.readouterr()
        assert run_cli("scheduled", "list", "--broker", b.address) == 0
        out = capsys.readouterr().out
        assert "1 scheduled items waiting" in out and "publish" in out
        [item] = p.admin("scheduled.list")["items"]
        assert run_cli("scheduled", "cancel", "--broker", b.address, str(item["id"])) == 0
        assert p.admin("scheduled.list")["waiting"] == 0
        assert run_cli("scheduled", "cancel", "--broker", b.address, str(item["id"])) != 0
