"""The device registry on real SQLite: provisioning, persistence, key wrapping."""

from __future__ import annotations

import json
import os
import sqlite3
import stat

import pytest

from lockmq.security import DeviceRegistry, SecurityConfig, check_sn
from lockmq.security.keys import load_or_create_master_key, unwrap_key
from lockmq.security.registry import (DeviceExists, UnknownDevice, provisioning_config,
                                      write_provisioning)


@pytest.fixture
def reg(tmp_path):
    cfg = SecurityConfig(data_dir=str(tmp_path))
    r = DeviceRegistry.open(cfg)
    yield r
    r.close()


def test_add_then_key_survives_reopen(tmp_path, reg):
    key = reg.add("LOCK-0001", note="door 1")
    assert len(key) == 32
    reg.close()
    again = DeviceRegistry.open(SecurityConfig(data_dir=str(tmp_path)))
    try:
        assert again.key_for("LOCK-0001") == key
        info = again.get("LOCK-0001")
        assert info.enabled and info.key_version == 1 and info.note == "door 1"
    finally:
        again.close()


def test_duplicate_and_invalid_sn_are_refused(reg):
    reg.add("A1")
    with pytest.raises(DeviceExists):
        reg.add("A1")
    # "A1\n" too: the session refuses it at CONNECT, so no lock could ever use it
    for bad in ("", "-x", "a b", "x" * 65, "é", "a/b", "A1\n", "$broker"):
        with pytest.raises(ValueError):
            check_sn(bad)
        with pytest.raises(ValueError):
            reg.add(bad)


def test_disable_enable_rekey_remove(reg):
    k1 = reg.add("L1")
    reg.set_enabled("L1", False)
    assert reg.key_for("L1") is None
    reg.set_enabled("L1", True)
    assert reg.key_for("L1") == k1
    k2 = reg.rekey("L1")
    assert k2 != k1 and reg.key_for("L1") == k2 and reg.get("L1").key_version == 2
    reg.remove("L1")
    assert reg.key_for("L1") is None
    for op in (lambda: reg.rekey("L1"), lambda: reg.set_enabled("L1", False),
               lambda: reg.get("L1")):
        with pytest.raises(UnknownDevice):
            op()


def test_stolen_registry_alone_reveals_no_key(tmp_path, reg):
    key = reg.add("L2")
    raw = open(reg.path, "rb").read() + b"".join(
        open(reg.path + s, "rb").read() for s in ("-wal",) if os.path.exists(reg.path + s))
    assert key not in raw and key.hex().encode() not in raw
    blob = sqlite3.connect(reg.path).execute(
        "SELECT wrapped_key FROM devices WHERE sn='L2'").fetchone()[0]
    with pytest.raises(ValueError):
        unwrap_key(os.urandom(32), "L2", blob)      # another master key
    master = load_or_create_master_key(str(tmp_path / "master.key"))
    assert unwrap_key(master, "L2", blob) == key
    with pytest.raises(ValueError):
        unwrap_key(master, "L3", blob)              # moved to another SN


def test_master_key_file_is_private(tmp_path, reg):
    path = tmp_path / "master.key"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        load_or_create_master_key(str(path))


def test_command_ids_only_go_up_across_restarts(tmp_path, reg):
    reg.add("L4")
    assert [reg.next_command_id("L4") for _ in range(3)] == [1, 2, 3]
    reg.note_command_id("L4", 10)
    reg.note_command_id("L4", 5)        # never backwards
    reg.close()
    again = DeviceRegistry.open(SecurityConfig(data_dir=str(tmp_path)))
    try:
        assert again.next_command_id("L4") == 11
    finally:
        again.close()


def test_bulk_add_and_list(reg):
    keys = reg.add_many([f"B{i:03d}" for i in range(50)])
    assert len(set(keys.values())) == 50
    assert reg.count() == 50
    assert [d.sn for d in reg.list("B00*")] == [f"B00{i}" for i in range(10)]


def test_provisioning_file(tmp_path):
    doc = provisioning_config("L5", b"\x01" * 32, broker_host="10.0.0.2", broker_port=6800)
    path = tmp_path / "config.json"
    write_provisioning(str(path), doc)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    back = json.loads(path.read_text())
    assert back["sn"] == "L5" and bytes.fromhex(back["key"]) == b"\x01" * 32


def test_lookalike_and_claimed_sns_are_not_registered(reg):
    from lockmq.security.registry import SnTaken

    reg.add("LOCK-0001")
    assert reg.exists_folded("lock-0001") == "LOCK-0001" and reg.exists_folded("LOCK-9") is None
    with pytest.raises(SnTaken):
        reg.add("lock-0001")                     # differs only in case
    with pytest.raises(SnTaken):
        reg.add_many(["LOCK-7", "lock-7"])
    assert reg.claim_producer_id("Billing-1", "token:billing", 8) == ""
    assert reg.claim_producer_id("billing-1", "token:billing", 8) == ""   # its own, folded
    assert reg.claim_producer_id("BILLING-1", "token:evil", 8) == "owned"
    assert reg.claim_producer_id("Lock-0001", "token:evil", 8) == "lock"
    with pytest.raises(SnTaken):
        reg.add("billing-1")                     # a service's producer id already
    assert reg.count() == 1


def test_producer_ids_per_owner_are_bounded_least_recently_used_first(reg):
    for i in range(5):
        assert reg.claim_producer_id(f"p-{i}", "token:a", 3, now=100.0 + i) == ""
    assert reg.claim_producer_id("p-2", "token:a", 3, now=5000.0) == ""     # used again
    assert reg.claim_producer_id("p-5", "token:a", 3, now=5001.0) == ""
    assert sorted(x["id"] for x in reg.producer_ids("token:a")) == ["p-2", "p-4", "p-5"]
    assert reg.claim_producer_id("p-0", "token:b", 3) == ""     # forgotten: free again


def test_the_auth_snapshot_follows_every_write_at_the_next_lookup(tmp_path, reg):
    """``lookup_policy`` answers from a snapshot of every row: this registry's own
    writes and another process's (a second connection to the file, as ``lockmq
    devices`` is) are seen at the very next lookup -- a disabled, re-keyed or removed
    lock is refused at its next AUTH, a new one accepted."""
    key = reg.add("LOCK-S1", mac=False)
    assert reg.lookup_policy("LOCK-S1") == (key, "enabled", False, False, 1)
    assert reg.lookup_policy("LOCK-S2") == (None, "unknown", False, False, 0)
    other = DeviceRegistry.open(SecurityConfig(data_dir=str(tmp_path)))
    try:
        other.set_enabled("LOCK-S1", False)
        assert reg.lookup_policy("LOCK-S1") == (None, "disabled", False, False, 0)
        other.set_enabled("LOCK-S1", True)
        new = other.rekey("LOCK-S1")
        assert reg.lookup_policy("LOCK-S1") == (new, "enabled", False, False, 2)
        added = other.add("LOCK-S2", tls=True)
        assert reg.lookup_policy("LOCK-S2") == (added, "enabled", True, True, 1)
        other.remove("LOCK-S2")
        assert reg.lookup("LOCK-S2") == (None, "unknown")
    finally:
        other.close()
    # ... and its own
    reg.set_policy("LOCK-S1", mac=True)
    assert reg.lookup_policy("LOCK-S1")[2] is True
    mine = reg.rekey("LOCK-S1")
    assert reg.lookup("LOCK-S1") == (mine, "enabled")
    reg.remove("LOCK-S1")
    assert reg.lookup("LOCK-S1") == (None, "unknown")


def test_the_snapshot_reads_only_what_changed_and_drops_what_was_removed(tmp_path, reg,
                                                                         monkeypatch):
    """Another process's commit is caught up row by row (the rows updated since the
    last look, the removed ones), not by unwrapping every key again; a commit to the
    file that is not a device row's (a token) changes no answer."""
    from lockmq.security import registry as registry_module
    # (no margin: rows stamped before the last look are not read again)
    monkeypatch.setattr(registry_module, "SNAPSHOT_MARGIN_S", 0.0)
    keys = reg.add_many([f"LOCK-{i:03d}" for i in range(20)], mac=False)
    assert reg.load_snapshot() == 20
    other = DeviceRegistry.open(SecurityConfig(data_dir=str(tmp_path)))
    try:
        other.set_enabled("LOCK-003", False)
        other.remove("LOCK-004")
        added = other.add("LOCK-NEW")
    finally:
        other.close()
    unwrapped = []
    real = reg._policy_row
    reg._policy_row = lambda row: (unwrapped.append(row[0]), real(row))[1]   # type: ignore[method-assign]
    assert reg.lookup("LOCK-003") == (None, "disabled")
    assert reg.lookup("LOCK-004") == (None, "unknown")
    assert reg.lookup("LOCK-NEW") == (added, "enabled")
    assert reg.lookup("LOCK-005") == (keys["LOCK-005"], "enabled")
    assert sorted(unwrapped) == ["LOCK-003", "LOCK-NEW"]
    from lockmq.security import Permissions, TokenStore
    store = TokenStore(SecurityConfig(data_dir=str(tmp_path)).registry_path)
    try:
        store.create("svc", Permissions())
    finally:
        store.close()
    assert reg.lookup("LOCK-005") == (keys["LOCK-005"], "enabled")
    assert len(unwrapped) == 2
def test_tags_choose_locks_and_survive_reopen(tmp_path, reg):
    reg.add_many(["T1", "T2", "T3"])
    assert reg.set_tags("T1", ["floor-2", "pilot"]) == ("floor-2", "pilot")
    assert reg.set_tags("T2", ["pilot"]) == ("pilot",)
    assert reg.set_tags("T1", remove=["floor-2"]) == ("pilot",)
    assert reg.tagged("pilot") == ["T1", "T2"] and reg.tagged("pilo") == []   # whole tags only
    assert [d.sn for d in reg.list(tag="pilot")] == ["T1", "T2"]
    assert reg.get("T3").tags == ()
    with pytest.raises(ValueError, match="invalid tag"):
        reg.set_tags("T3", ["two words"])
    with pytest.raises(UnknownDevice):
        reg.set_tags("NOPE", ["pilot"])
    reg.close()
    again = DeviceRegistry.open(SecurityConfig(data_dir=str(tmp_path)))
    try:
        assert again.get("T1").tags == ("pilot",) and again.get("T1").to_dict()["tags"] == ("pilot",)
    finally:
        again.close()


def test_a_registry_without_tags_gets_the_column(tmp_path):
    path = str(tmp_path / "old.db")
    conn = sqlite3.connect(path)       # the devices table as released before tags
    conn.execute("CREATE TABLE devices (sn TEXT PRIMARY KEY, wrapped_key BLOB NOT NULL, "
                 "key_version INTEGER NOT NULL DEFAULT 1, enabled INTEGER NOT NULL DEFAULT 1, "
                 "note TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL, "
                 "updated_at REAL NOT NULL, last_command_id INTEGER NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO devices(sn, wrapped_key, created_at, updated_at) "
                 "VALUES ('OLD1', x'00', 1, 1)")
    conn.commit()
    conn.close()
    r = DeviceRegistry(path, b"\0" * 32)
    try:
        assert r.get("OLD1").tags == () and r.set_tags("OLD1", ["x"]) == ("x",)
    finally:
        r.close()
