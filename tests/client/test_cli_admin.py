"""The admin commands of the CLI share one request helper: the same answer for a
broker that refuses, and for one that cannot be reached."""

from __future__ import annotations

import pytest

from lockmq.testing import free_port, run_cli

#: every command that sends admin requests through ``lockmq.cli._admin``
ADMIN_COMMANDS = [
    ["topics"], ["clusters"], ["clusters", "describe", "c"], ["clusters", "reset", "c",
                                                              "--to-latest"],
    ["dlq", "list", "c"], ["dlq", "replay", "c", "--all"], ["txn", "list"],
    ["txn", "resolve", "1", "commit"], ["scheduled", "list"], ["scheduled", "cancel", "1"],
    ["standby", "status"], ["devices", "online"],
]


@pytest.mark.parametrize("argv", ADMIN_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_unreachable_broker_is_one_clear_error(argv, capsys):
    address = f"127.0.0.1:{free_port()}"
    assert run_cli(*argv, "--broker", address, "--connect-retry", "0") == 1
    err = capsys.readouterr().err
    assert err.startswith("lockmq: ") and str(address.split(":")[1]) in err, err


@pytest.mark.parametrize("argv", [["scheduled", "cancel", "99"], ["txn", "resolve", "99",
                                                                   "commit"]],
                         ids=lambda a: a[0])
def test_refused_request_is_one_clear_error(broker, argv, capsys):
    assert run_cli(*argv, "--broker", broker.address) == 1
    err = capsys.readouterr().err
    assert err.startswith("lockmq: ") and "99" in err, err
