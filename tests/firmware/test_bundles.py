"""Firmware bundles: the format the lock unpacks, the broker's store (fw.put resumable
and verified, fw.list), what `devices` reads from a lock's CONNECT client name, the
rollout's stable share, and `lockmq command ... fw-update` arguments."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from lockmq.broker.firmware_bundles import FirmwareBundles, lock_firmware
from lockmq.broker.logs import Stats
from lockmq.client.command_text import fw_update_args
from lockmq.firmware_tools.build import BuildError
from lockmq.firmware_tools.bundle import from_lib, info, pack, unpack
from lockmq.firmware_tools.fleet import halt_threshold, pick
from lockmq.protocol._firmware import fetch_body


class _Log:
    def __call__(self, event: str, **fields: object) -> None:
        self.last = (event, fields)


def test_a_bundle_round_trips_and_is_named_by_its_digest(built):
    data = from_lib(built / "lib", "2.0.0")
    version, files = unpack(data)
    assert version == "2.0.0" and "lockapp/app.mpy" in files and "lockmq/protocol/_frame.mpy" in files
    assert files["lockapp/link.mpy"] == (built / "lib/lockapp/link.mpy").read_bytes()
    meta = info(data)
    assert meta.sha256 == hashlib.sha256(data).hexdigest() and meta.size == len(data)
    assert json.loads(fw_update_args([meta.version, str(meta.size), meta.sha256])) == meta.command_args()


def test_bad_bundles_and_arguments_are_clear_errors():
    with pytest.raises(BuildError, match="bad path"):
        pack("1.0", {"../boot.py": b"x"})
    with pytest.raises(BuildError, match="without spaces"):
        pack("1 0", {})
    with pytest.raises(BuildError, match="not a lockmq firmware bundle"):
        unpack(b"PK\x03\x04")
    with pytest.raises(ValueError, match="VERSION SIZE SHA256"):
        fw_update_args(["https://x/fw.bin", "ab" * 32])
    with pytest.raises(ValueError, match="64 hex"):
        fw_update_args(["1.0", "10", "xy" * 32])


def test_the_store_takes_pieces_resumes_and_verifies(tmp_path):
    store = FirmwareBundles(tmp_path, Stats(), _Log())
    data = pack("3.1", {"lockapp/app.mpy": bytes(range(256)) * 100})
    meta = info(data)

    def put(offset: int, piece: bytes, sha: str = meta.sha256) -> dict:
        return store.put_op({"sha256": sha, "size": meta.size, "version": "3.1", "offset": offset,
                             "data": base64.b64encode(piece).decode()})

    assert put(0, data[:1000]) == {"ok": True, "released": False, "have": 1000}
    assert put(0, data[:1000])["have"] == 1000            # a repeated piece: told where to go on
    assert store.list_op({})["bundles"] == []             # not listed before it is whole
    assert put(1000, data[1000:])["released"] is True
    assert [b["sha256"] for b in store.list_op({"version": "3.1"})["bundles"]] == [meta.sha256]
    assert (tmp_path / "firmware" / f"{meta.sha256}.bin").read_bytes() == data
    wrong = "0" * 64                                       # bytes that do not hash to the name
    refused = put(0, data, sha=wrong)
    assert refused["ok"] is False and "do not hash" in refused["message"]
    assert not (tmp_path / "firmware" / f"{wrong}.bin").exists()


def test_devices_reads_the_firmware_from_the_connect_client_name():
    assert lock_firmware("lockapp/0.1.0") == {"fw": "0.1.0"}
    assert lock_firmware("lockapp/0.1.0;ota=failed:digest;target=0.2.0") == {
        "fw": "0.1.0", "ota": "failed:digest", "ota_target": "0.2.0"}
    assert lock_firmware("cli-command") == {}


def test_a_rollout_share_is_stable_and_grows():
    sns = [f"LOCK{i:04d}" for i in range(200)]
    ten, twenty = pick(sns, 10), pick(sns, 20)
    assert len(ten) == 20 and len(twenty) == 40 and set(ten) <= set(twenty)
    assert pick(list(reversed(sns)), 10) == ten and pick(sns, 0) == []


def test_a_rollout_halts_after_a_count_or_a_share_of_its_locks():
    assert halt_threshold("3", 1000) == 3
    assert halt_threshold("2%", 1000) == 20 and halt_threshold("2.5%", 1000) == 25
    assert halt_threshold("5%", 30) == 2              # 1.5 locks: rounded up
    assert halt_threshold("5%", 20) == 1 and halt_threshold("1%", 3) == 1   # at least one
    for bad in ("0", "-1", "0%", "101%", "x", "%", "2.5"):
        with pytest.raises(ValueError):
            halt_threshold(bad, 100)


def test_the_cli_refuses_a_bad_halt_after_before_it_connects(capsys):
    from lockmq.cli import main

    with pytest.raises(SystemExit) as e:
        main(["firmware", "rollout", "--version", "0.2.0", "--halt-after", "lots"])
    assert e.value.code == 2 and "neither a count (2) nor a share (5%)" in capsys.readouterr().err


def test_each_lock_s_update_state_comes_from_what_it_reported():
    from lockmq.broker.firmware_bundles import update_state

    hb = {"uptime_s": 5}
    assert update_state({"fw": "1.0"}) is None                       # no heartbeat yet
    assert update_state({"fw": "1.0", **hb}) == ("1.0", "running", "")
    assert update_state({"fw": "1.0", "fetching": "2.0"}) == ("2.0", "fetch", "")
    assert update_state({"fw": "2.0", "ota": "trial", "ota_target": "2.0"}) == ("2.0", "trial", "")
    assert update_state({"fw": "2.0", "ota": "trial", "ota_target": "2.0", **hb}) == (
        "2.0", "updated", "")
    assert update_state({"fw": "2.0", "ota": "ok", "ota_target": "2.0"}) == ("2.0", "updated", "")
    assert update_state({"fw": "1.0", "ota": "failed:crash_RuntimeError", "ota_target": "2.0",
                         **hb}) == ("2.0", "failed", "crash_RuntimeError")


def test_fw_status_by_tag_and_version_and_the_metrics(tmp_path):
    from lockmq.broker.metrics import BrokerCollector
    from lockmq.security import DeviceRegistry, SecurityConfig

    reg = DeviceRegistry.open(SecurityConfig(data_dir=str(tmp_path)))
    reg.add_many(["A1", "A2", "A3"])
    reg.set_tags("A1", ["pilot"])
    reg.set_tags("A3", ["pilot"])
    online = [{"sn": "A1", "fw": "2.0", "ota": "ok", "ota_target": "2.0", "uptime_s": 1},
              {"sn": "A2", "fw": "1.0", "ota": "failed:digest", "ota_target": "2.0",
               "since_ms": 1000}]

    class Conn:
        connected_at = 1.0
        principal = type("P", (), {"name": "A2"})()

    store = FirmwareBundles(tmp_path, Stats(), _Log(), lambda: [dict(d) for d in online], lambda: reg)
    data = pack("3.0", {"lockapp/app.mpy": b"x" * 100})
    meta = info(data)
    assert store.put_op({"sha256": meta.sha256, "size": meta.size, "version": "3.0", "offset": 0,
                         "data": base64.b64encode(data).decode()})["released"]
    conn = Conn()
    conn.peer_max_frame, conn.sent = 0, []
    conn.send_frame = lambda *a: conn.sent.append(a)
    frame = type("F", (), {"opaque": 7, "body": fetch_body(bytes.fromhex(meta.sha256), 0, 64)})()
    store.on_fetch(conn, frame)                                   # A2 now fetches 3.0
    try:
        rows = {r["sn"]: r for r in store.status_op({"tag": "pilot"})["locks"]}
        assert rows["A1"]["state"] == "updated" and rows["A3"]["state"] == "offline"
        assert set(rows) == {"A1", "A3"}
        assert [r["sn"] for r in store.status_op({"version": "3.0"})["locks"]] == ["A2"]
        assert store.status_op({"tag": "bad tag"})["ok"] is False
        stats = {"broker": {"uptime_s": 1.0}, "connections": 0, "max_connections": 1,
                 "devices_online": 2, "log_bytes": 0, "firmware": store.gauges()}
        fams = {f.name: f for f in BrokerCollector(lambda: (stats, [], {})).collect()}
        got = {(s.labels["version"], s.labels["state"]): s.value
               for s in fams["lockmq_firmware_rollout_locks"].samples}
        assert got[("2.0", "updated")] == 1 and got[("3.0", "fetch")] == 1
        assert got[("2.0", "failed")] == 0 and got[("3.0", "updated")] == 0   # listed from 0
        assert {s.labels["version"]: s.value for s in fams["lockmq_firmware_locks"].samples} == {
            "1.0": 1, "2.0": 1}
        online[1]["since_ms"] = 5000                               # its session ended
        assert store.status_op({"version": "3.0"})["locks"] == []
    finally:
        reg.close()
