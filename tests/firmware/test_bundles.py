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
from lockmq.cli.command import fw_update_args
from lockmq.firmware_tools.build import BuildError
from lockmq.firmware_tools.bundle import from_lib, info, pack, unpack
from lockmq.firmware_tools.fleet import pick


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
