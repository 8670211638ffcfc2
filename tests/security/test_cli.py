"""``lockmq devices``, ``lockmq tokens`` and ``lockmq certs`` against a real registry."""

from __future__ import annotations

import json
import os
import stat

from lockmq.security import DeviceRegistry, SecurityConfig, TokenStore
from lockmq.testing import run_cli


def test_devices_lifecycle(tmp_path, capsys):
    data = str(tmp_path / "data")
    out = tmp_path / "L1.json"
    assert run_cli("devices", "add", "L1", "--out", str(out), "--broker", "10.0.0.2:6800",
               "--tls-ca", "tls/ca.der", "--data-dir", data) == 0
    doc = json.loads(out.read_text())
    assert doc["sn"] == "L1" and doc["brokers"] == [["10.0.0.2", 6800]]
    assert doc["tls"] == {"enabled": True, "ca": "ca.der", "server_hostname": ""}
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    reg = DeviceRegistry.open(SecurityConfig(data_dir=data))
    try:
        assert reg.key_for("L1") == bytes.fromhex(doc["key"])
    finally:
        reg.close()
    assert run_cli("devices", "add", "L1", "--out", str(out), "--data-dir", data) == 1
    assert run_cli("devices", "disable", "L1", "--data-dir", data) == 0
    capsys.readouterr()
    assert run_cli("devices", "list", "--json", "--data-dir", data) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["sn"], r["enabled"]) for r in rows] == [("L1", False)]
    assert run_cli("devices", "rekey", "L1", "--out", str(out), "--data-dir", data) == 0
    assert json.loads(out.read_text())["key"] != doc["key"]
    assert run_cli("devices", "remove", "L1", "--data-dir", data) == 0
    assert run_cli("devices", "show", "L1", "--data-dir", data) == 1


def test_devices_add_with_a_registered_sn_names_it_and_adds_nothing(tmp_path, capsys):
    data, prov = str(tmp_path / "data"), tmp_path / "prov"
    prov.mkdir()   # one provisioning file per lock in it
    assert run_cli("devices", "add", "L2", "--out", str(prov), "--data-dir", data) == 0
    capsys.readouterr()
    assert run_cli("devices", "add", "L1", "L2", "L3", "--out", str(prov),
                   "--data-dir", data) == 1
    err = capsys.readouterr().err
    assert "already registered: L2" in err and "nothing was added" in err
    assert sorted(p.name for p in prov.iterdir()) == ["L2.json"]   # no half-written fleet
    assert run_cli("devices", "add", "L1", "L3", "L1", "--out", str(prov),
                   "--data-dir", data) == 1
    assert "named more than once: L1" in capsys.readouterr().err
    assert run_cli("devices", "add", "L1", "L3", "--out", str(prov), "--data-dir", data) == 0
    assert sorted(p.name for p in prov.iterdir()) == ["L1.json", "L2.json", "L3.json"]


def test_tokens_lifecycle(tmp_path, capsys):
    data = str(tmp_path / "data")
    assert run_cli("tokens", "create", "svc", "--data-dir", data) == 2      # no rights given
    capsys.readouterr()
    assert run_cli("tokens", "create", "svc", "--consume", "lock.*:svc", "--ttl", "1h",
               "--data-dir", data) == 0
    token = capsys.readouterr().out.strip()
    store = TokenStore(SecurityConfig(data_dir=data).registry_path)
    try:
        info = store.verify(token)
        assert info.permissions.consume == ("lock.*:svc",)
    finally:
        store.close()
    assert run_cli("tokens", "list", "--data-dir", data) == 0
    listing = capsys.readouterr().out
    assert info.id in listing and token not in listing
    assert run_cli("tokens", "revoke", info.id, "--data-dir", data) == 0
    assert run_cli("tokens", "revoke", info.id, "--data-dir", data) == 1


def test_config_file_gives_the_data_dir(tmp_path):
    data = tmp_path / "elsewhere"
    conf = tmp_path / "broker.toml"
    conf.write_text(f'[broker]\ndata_dir = "{data}"\n')
    assert run_cli("devices", "add", "L9", "--out", str(tmp_path / "p.json"),
               "--config", str(conf)) == 0
    assert (data / "security.db").exists()


def test_certs_init_refuses_to_overwrite(tmp_path, capsys):
    d = str(tmp_path / "tls")
    assert run_cli("certs", "init", d, "--ip", "127.0.0.1") == 0
    for name in ("ca.pem", "ca.der", "ca.key", "server.pem", "server.key"):
        assert os.path.exists(os.path.join(d, name))
    assert stat.S_IMODE(os.stat(os.path.join(d, "server.key")).st_mode) == 0o600
    assert run_cli("certs", "init", d, "--ip", "127.0.0.1") == 1
    assert run_cli("certs", "init", d, "--ip", "127.0.0.1", "--force") == 0


def test_tokens_warn_when_publish_covers_lock_topics(tmp_path, capsys):
    data = str(tmp_path / "data")
    assert run_cli("tokens", "create", "ingest", "--publish", "lock.*", "--data-dir", data) == 0
    assert "covers the locks' own topics" in capsys.readouterr().err
    assert run_cli("tokens", "create", "billing", "--publish", "billing.*", "--data-dir", data) == 0
    assert "covers" not in capsys.readouterr().err


def test_devices_tag(tmp_path, capsys):
    data = str(tmp_path / "data")
    assert run_cli("devices", "add", "L1", "L2", "--out", str(tmp_path / "p"), "--data-dir", data) == 0
    assert run_cli("devices", "tag", "L1", "L2", "--add", "pilot", "--data-dir", data) == 0
    assert run_cli("devices", "tag", "L2", "--remove", "pilot", "--add", "b7", "--data-dir", data) == 0
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "L1: tags pilot", "L2: tags pilot", "L2: tags b7"]
    assert run_cli("devices", "list", "--tag", "pilot", "--json", "--data-dir", data) == 0
    assert [json.loads(line)["sn"] for line in capsys.readouterr().out.splitlines()] == ["L1"]
    assert run_cli("devices", "tag", "L1", "NOPE", "--add", "x", "--data-dir", data) == 1
    assert "no device NOPE; no tag changed" in capsys.readouterr().err
    assert run_cli("devices", "tag", "L1", "--add", "a b", "--data-dir", data) == 1
    assert run_cli("devices", "tag", "L1", "--data-dir", data) == 2
    assert run_cli("devices", "list", "--data-dir", data) == 0
    assert "pilot" in capsys.readouterr().out
