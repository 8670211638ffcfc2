"""``lockmq command``: a downlink command from the command line to a simulated lock."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lockmq.cli import main
from lockmq.client.command_text import command_args
from lockmq.client.session import Endpoint
from lockmq.protocol import CommandKind
from lockmq.sim import SimConfig, SimStats, run_sim
from lockmq.testing import open_peer


def _admin(broker, op: str, **args) -> dict:
    """One admin op over a fresh wire connection."""
    peer = open_peer(broker.port, sn="test-admin")
    try:
        return peer.admin(op, **args)
    finally:
        peer.close()


@pytest.fixture
def online_locks(broker):
    """Two simulated locks that stay connected (in their own thread and loop)."""
    stats = SimStats()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    cfg = SimConfig(locks=2, events_per_lock=None, rate_per_lock=1, stay_connected=True)

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(run_sim(cfg, Endpoint("127.0.0.1", broker.port), stop=stop,
                                        stats=stats))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    for _ in range(500):
        if stats.connected >= 2:
            break
        threading.Event().wait(0.01)
    yield stats
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


def test_unlock_command_reaches_the_lock_and_prints_its_answer(broker, online_locks, capsys):
    rc = main(["command", "--broker", broker.address, "SIM-000001", "unlock", "--seconds", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.startswith("SIM-000001: command ") and "3 s" in out
    assert online_locks.commands == 1


def test_command_to_an_offline_lock_fails_after_its_expiry(broker, capsys):
    rc = main(["command", "--broker", broker.address, "GHOST-1", "reboot", "--expires", "0.3",
               "--wait"])
    assert rc == 1
    assert "GHOST-1" in capsys.readouterr().err
    assert _admin(broker, "stats")["broker"]["commands_expired"] == 1


def test_command_to_an_unknown_lock_with_auth_off_fails_at_once(broker, online_locks, capsys):
    """No registry with auth off: a lock that is not connected is named at once, and
    nothing is left waiting in the broker (before, the CLI sat out --expires)."""
    rc = main(["command", "--broker", broker.address, "GHOST-2", "unlock", "--expires", "20"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "'GHOST-2' is not connected" in err and "--wait" in err
    assert _admin(broker, "stats")["broker"].get("commands_received", 0) == 0
    assert _admin(broker, "commands")["held"] == 0


def test_with_a_token_and_auth_off_the_cli_says_why_it_waits(broker, capsys):
    """With --token the CLI cannot ask whether the lock is connected (the admin request
    would be refused at an auth-required broker): when no answer came within a second
    it says that it waits up to --expires and how to fail fast instead (before, it sat
    silent until expiry). (Issue 35: the note used to come at once, 300 characters,
    even for a lock that answered in milliseconds; now only after NOTE_AFTER_S.)"""
    rc = main(["command", "--broker", broker.address, "--token", "any-token", "GHOST-4",
               "reboot", "--expires", "2.5"])
    err = capsys.readouterr().err
    assert rc == 1
    note, *rest = err.splitlines()
    assert "GHOST-4: no answer yet; waiting up to 2.5 s" in note and "leave out --token" in note
    assert rest and "GHOST-4" in rest[-1]   # then the broker's answer: offline


def test_a_lock_that_answers_at_once_gets_no_note(broker, online_locks, capsys):
    rc = main(["command", "--broker", broker.address, "--token", "any-token", "SIM-000001",
               "reboot", "--expires", "20"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "no answer yet" not in err


@pytest.mark.parametrize("when", [["--wait"], ["--delay", "3600"]])
def test_with_wait_or_a_schedule_no_note_is_printed(broker, capsys, when):
    """--wait asks for the hold, --delay stores the command for later: no note."""
    rc = main(["command", "--broker", broker.address, "--token", "any-token", "GHOST-5",
               "reboot", "--expires", "0.3", *when])
    assert rc == (1 if when == ["--wait"] else 0)
    assert "waiting up to" not in capsys.readouterr().err


def test_devices_op_filtered_by_sn_answers_for_one_lock(broker, online_locks):
    """The CLI's check for one SN asks the broker about that SN only (before, it
    downloaded every online lock of the fleet)."""
    assert [d["sn"] for d in _admin(broker, "devices")["devices"]] == ["SIM-000001", "SIM-000002"]
    one = _admin(broker, "devices", sn="SIM-000002")
    assert (one["count"], [d["sn"] for d in one["devices"]]) == (1, ["SIM-000002"])
    assert _admin(broker, "devices", sn="GHOST-3") == {"ok": True, "count": 0, "devices": []}
    bad = _admin(broker, "devices", sn="")
    assert (bad["ok"], bad["error"]) == (False, "INVALID_ARGUMENT")


def test_arguments_are_encoded_as_the_spec_says():
    assert command_args("unlock", [], 5) == (CommandKind.UNLOCK, b"\x00\x05")
    kind, args = command_args("cards", ["0a1b", "ff"], 0)
    assert kind == CommandKind.CARDS_SET and args == b"\x00\x02\x02\x0a\x1b\x01\xff"
    assert command_args("config", ['{"heartbeat_s": 60}'], 0)[1] == b'{"heartbeat_s": 60}'
    with pytest.raises(ValueError):
        command_args("config", ["[1, 2]"], 0)
    with pytest.raises(ValueError):
        command_args("unlock", [], 0)


def test_bad_arguments_fail_before_connecting(capsys):
    assert main(["command", "--broker", "127.0.0.1:1", "SN", "config", "not json"]) == 1
    assert "lockmq:" in capsys.readouterr().err


def test_network_config_is_marked_only_when_asked():
    change = '{"brokers": [["10.0.0.2", 6843]]}'
    assert command_args("config", [change], 0)[1] == b'{"brokers": [["10.0.0.2", 6843]]}'
    assert command_args("config", [change], 0, network=True)[1] == \
        b'{"brokers": [["10.0.0.2", 6843]], "network": true}'


def test_with_a_token_the_broker_decides_and_nothing_is_refused(tmp_path, capsys):
    """Auth required: a registered lock that is offline is waited for (up to
    --expires), and the CLI opens no admin session the service token may not use."""
    from lockmq.security import Permissions
    from lockmq.testing import Peer, SecureBroker

    env = SecureBroker(tmp_path, locks=["LK-OFF"], tokens={
        "ops": Permissions(command=("reboot:LK-OFF",)), "root": Permissions(admin=True)})
    broker = env.start()
    root = Peer(broker.port, "")
    try:
        rc = main(["command", "--broker", f"127.0.0.1:{broker.port}", "--token", env.tok["ops"],
                   "LK-OFF", "reboot", "--expires", "0.3"])
        assert rc == 1 and "offline" in capsys.readouterr().err
        root.auth_token(env.tok["root"])
        security = root.admin("stats")["security"]
        assert not [k for k in security if "permission_denied" in k], security
        # one connection for the command, one for this check: no admin session that
        # the service token would only be refused on
        assert security["security_connection_admitted_total"] == 2, security
    finally:
        root.close()
        env.close()


def test_every_kind_of_the_protocol_table_has_its_cli_form_and_right():
    """Adding a command kind: its row in protocol/table.py gives the CLI's choice, the
    token right and the name the lock logs; the CLI's args builder is the one thing
    written for it here (CONTRIBUTING.md, "Adding a command kind")."""
    from lockmq.client.command_text import ARGS, KINDS
    from lockmq.protocol import table
    from lockmq.security.principal import COMMAND_KINDS

    names = {row[2]: row[1] for row in table.COMMAND_KINDS}
    assert COMMAND_KINDS == names and KINDS == tuple(names)
    assert set(ARGS) == set(names), "a kind of protocol/table.py has no args builder in client/command_text.py"
    assert [command_args(k, [], 5)[0] for k in ("unlock", "reboot")] == [CommandKind.UNLOCK,
                                                                          CommandKind.REBOOT]
