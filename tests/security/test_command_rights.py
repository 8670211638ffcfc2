"""Command rights per kind, the network-change rule and the CLI that grants them
(unit level; tests/adversarial/test_commands.py attacks them over real TCP)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lockmq.protocol import CommandKind
from lockmq.security import Permissions, SecurityConfig, TokenStore
from lockmq.security.commands import (PLAIN_CONFIG_KEYS, InvalidCommand, check_network_marked,
                                      command_frame_size, config_network_keys)
from lockmq.security.errors import PermissionDenied
from lockmq.security.principal import (COMMAND_DENIED_MESSAGE, Principal,
                                       parse_command_right)
from lockmq.testing import run_cli


K = CommandKind


def svc(*rights: str) -> Principal:
    return Principal(name="svc", kind="service", permissions=Permissions(command=rights))


def test_parse_command_rights():
    assert parse_command_right("unlock,cards:LOCK-*") == (
        frozenset({"unlock", "cards"}), "LOCK-*", False)
    assert parse_command_right("LOCK-*") == (frozenset({"unlock", "cards"}), "LOCK-*", True)
    kinds, _, _ = parse_command_right("*:L")
    assert kinds == {"unlock", "cards", "config", "reboot", "fw-update"}   # not config.network
    assert parse_command_right("config.network:L")[0] == {"config", "config.network"}
    for bad in ("open:L", "unlock:", "", "unlock,,cards:L"):
        with pytest.raises(ValueError):
            parse_command_right(bad)
    with pytest.raises(ValueError):
        Permissions(command=("reboot:L", "teleport:L")).validate()


def test_rights_per_kind_and_scope():
    p = svc("unlock:LOCK-*", "config:LOCK-1", "LOCK-9")
    assert p.may_command("LOCK-5") and p.may_command("LOCK-5", K.UNLOCK)
    assert not p.may_command("LOCK-5", K.CARDS_SET) and not p.may_command("VAULT-1")
    assert p.may_command("LOCK-1", K.CONFIG) and not p.may_command("LOCK-1", K.CONFIG, network=True)
    assert p.may_command("LOCK-9", K.CARDS_SET) and not p.may_command("LOCK-9", K.REBOOT)
    assert not p.may_command("LOCK-5", 99)                  # unknown kinds: admins only
    assert svc("config.network:LOCK-1").may_command("LOCK-1", K.CONFIG, network=True)
    assert not svc("*:LOCK-1").may_command("LOCK-1", K.CONFIG, network=True)
    assert not svc("garbage:LOCK-*").may_command("LOCK-1")   # malformed stored right: nothing
    admin = Principal(name="ops", kind="admin", permissions=Permissions(admin=True))
    assert admin.may_command("ANY", K.CONFIG, network=True)
    lock = Principal(name="LOCK-1", kind="lock")
    assert not lock.may_command("LOCK-1", K.UNLOCK)


def test_refusals_say_what_is_missing_without_saying_whether_a_lock_exists():
    p = svc("unlock:LOCK-*", "LOCK-9")
    with pytest.raises(PermissionDenied) as ei:
        p.require_command("VAULT-1", K.UNLOCK)
    assert (ei.value.reason, ei.value.public_message) == ("command_denied", COMMAND_DENIED_MESSAGE)
    with pytest.raises(PermissionDenied) as ei:
        p.require_command("LOCK-1", K.REBOOT)
    assert ei.value.reason == "command_kind_denied" and "reboot" in ei.value.public_message
    with pytest.raises(PermissionDenied) as ei:
        p.require_command("LOCK-9", K.CONFIG, network=True)
    assert ei.value.reason == "command_network_denied"
    assert "config.network" in ei.value.public_message and "reissue" in ei.value.public_message


def test_guard_refuses_unregistered_and_disabled_locks_like_out_of_scope_ones(guard):
    guard.registry.add_many(["LOCK-1", "LOCK-2", "VAULT-1"])
    guard.registry.set_enabled("LOCK-2", False)
    p = svc("unlock:LOCK-*")
    guard.check_command(p, "LOCK-1", K.UNLOCK, b"\x00\x01")
    answers = set()
    for sn, reason in (("VAULT-1", "command_denied"), ("VAULT-2", "command_denied"),
                       ("LOCK-3", "unknown_lock"), ("LOCK-2", "disabled_lock"),
                       ("LOCK-1\n", "unknown_lock")):
        with pytest.raises(PermissionDenied) as ei:
            guard.check_command(p, sn, K.UNLOCK, b"\x00\x01")
        assert ei.value.reason == reason
        answers.add((ei.value.code, ei.value.public_message))
        assert guard.metrics.get("permission_denied", reason) >= 1
    assert len(answers) == 1


def test_config_network_classification():
    assert config_network_keys(b'{"heartbeat_s": 60, "unlock_s": 3}') == ((), False)
    assert config_network_keys(b'{"network": true, "brokers": [["h", 1]]}') == (
        ("brokers", "network"), True)
    assert config_network_keys(b'{"sn": "X"}') == (("sn",), False)      # unknown: network
    with pytest.raises(InvalidCommand, match="network"):
        check_network_marked(("brokers",), False)
    check_network_marked(("brokers", "network"), True)
    for bad, reason in ((b"[1]", "config_not_object"), (b"\xff", "config_not_json"),
                        (b'{"unlock_s": 1, "unlock_s": 2}', "config_duplicate_key")):
        with pytest.raises(InvalidCommand) as ei:
            config_network_keys(bad)
        assert ei.value.reason == reason and ei.value.code == 8      # INVALID_ARGUMENT


def test_guard_network_change_needs_the_right_and_the_marker_and_is_logged(guard, caplog):
    guard.registry.add("LOCK-1")
    marked = json.dumps({"network": True, "brokers": [["10.0.0.9", 6800]]}).encode()
    with pytest.raises(PermissionDenied):
        guard.check_command(svc("config:LOCK-*"), "LOCK-1", K.CONFIG, marked)
    net = svc("config.network:LOCK-1")
    with pytest.raises(InvalidCommand):
        guard.check_command(net, "LOCK-1", K.CONFIG, b'{"brokers": [["10.0.0.9", 6800]]}')
    caplog.set_level("INFO", "lockmq.security")
    guard.check_command(net, "LOCK-1", K.CONFIG, marked)
    rec = [r for r in caplog.records if r.getMessage().startswith("command_network_change")]
    assert rec and rec[0].levelname == "WARNING" and "name=svc" in rec[0].getMessage()


def test_plain_config_keys_are_the_firmwares_settable_ones():
    src = (Path(__file__).resolve().parents[2] / "firmware/lockapp/cfgchange.py").read_text()
    block = src.split("SETTABLE = {", 1)[1].split("}", 1)[0]
    assert set(re.findall(r'"(\w+)":', block)) == set(PLAIN_CONFIG_KEYS)


def test_command_frame_size_is_the_signed_frame():
    from lockmq.protocol import Command, Op, encode_frame
    c = Command("LOCK-1", 7, 123, K.CARDS_SET, b"x" * 300, b"m" * 32)
    assert command_frame_size("LOCK-1", c.args) == len(encode_frame(Op.COMMAND, "", c.encode(), 7))


def test_cli_grants_kinds_warns_for_legacy_and_network_rights(tmp_path, capsys):
    data = str(tmp_path / "data")
    assert run_cli("tokens", "create", "old", "--command", "LOCK-*", "--json", "--data-dir", data) == 0
    out = capsys.readouterr()
    assert "allows unlock and cards only" in out.err
    assert json.loads(out.out)["permissions"]["command"] == ["unlock,cards:LOCK-*"]
    assert run_cli("tokens", "create", "net", "--command", "config.network:LOCK-1",
               "--data-dir", data) == 0
    assert "can repoint those locks" in capsys.readouterr().err
    assert run_cli("tokens", "create", "bad", "--command", "open:LOCK-*", "--data-dir", data) == 2
    assert "unknown command kind 'open'" in capsys.readouterr().err
    store = TokenStore(SecurityConfig(data_dir=data).registry_path)
    try:
        with pytest.raises(ValueError):
            store.create("bad", Permissions(command=("open:LOCK-*",)))
        assert [t.name for t in store.list()] == ["net", "old"]
    finally:
        store.close()
    assert run_cli("tokens", "list", "--data-dir", data) == 0
    assert "command=unlock,cards:LOCK-*" in capsys.readouterr().out
