"""Downlink commands end to end: signed by the broker side with the device key,
verified by the firmware (MAC, target, expiry, replay with the last id persisted),
executed, answered with COMMAND_RESULT."""

from __future__ import annotations

import json
import struct
import time

import pytest

from lockmq.protocol import CommandKind, CommandStatus, EventType, Method
from lockmq.testing import set_config
from lockmq.testing.lock import KEY, SN

from .minibroker import MiniBroker


@pytest.fixture
def broker():
    b = MiniBroker({SN: KEY}, heartbeat_s=30)
    yield b
    b.close()


@pytest.fixture
def lock(flash, broker, lock_factory):
    set_config(flash, brokers=[["127.0.0.1", broker.port]], frame_mac=False, backoff_min_ms=100,
               backoff_max_ms=500, io_timeout_ms=3000)
    lk = lock_factory(flash)
    lk.expect(r"^I net connected")
    return lk


def test_remote_unlock_runs_and_reports(lock, broker):
    res = broker.send_command(SN, 1, CommandKind.UNLOCK, struct.pack(">H", 2)).result(10)
    assert (res.cmd_id, res.status) == (1, CommandStatus.OK)
    lock.expect(r"^I hw relay on$")
    lock.expect(r"^I cmd unlock id=1 ok$")
    lock.expect(r"^I evt acked seq=1$")
    ev = broker.stored[(SN, 1)]
    assert (ev.event_type, ev.method, ev.value) == (EventType.UNLOCK, Method.REMOTE, 2)
    lock.expect(r"^I hw relay off$", timeout=6)


@pytest.mark.parametrize("case", ["bad_mac", "other_key", "expired"])
def test_refused_commands_do_nothing(lock, broker, case):
    kw: dict = {}
    if case == "bad_mac":
        kw["mac"] = bytes(32)
    elif case == "other_key":
        kw["key"] = b"k" * 32
    else:
        kw["expires_ms"] = int(time.time() * 1000) - 1000
    res = broker.send_command(SN, 7, CommandKind.UNLOCK, struct.pack(">H", 5), **kw).result(10)
    if case == "expired":
        assert res.status == CommandStatus.EXPIRED
        lock.expect(r"^W cmd refused id=7 reason=expired$")
    else:
        assert res.status == CommandStatus.REFUSED
        lock.expect(r"^W cmd refused id=7 reason=bad_sig$")
    assert not lock.grep(r"relay on")
    # a refused command does not burn its id: the genuine one still runs
    res = broker.send_command(SN, 7, CommandKind.UNLOCK, struct.pack(">H", 1)).result(10)
    assert res.status == CommandStatus.OK
    lock.expect(r"^I hw relay on$")


def test_replay_refused_even_after_power_cut(lock, broker):
    args = struct.pack(">H", 1)
    assert broker.send_command(SN, 5, CommandKind.UNLOCK, args).result(10).status == CommandStatus.OK
    lock.kill()
    lock.start()
    lock.expect(r"^I net connected")
    res = broker.send_command(SN, 4, CommandKind.UNLOCK, args).result(10)
    assert res.status == CommandStatus.REFUSED
    lock.expect(r"^W cmd refused id=4 reason=replay$")
    # the same id again: answered from the persisted result, not run twice
    res = broker.send_command(SN, 5, CommandKind.UNLOCK, args).result(10)
    assert (res.status, res.detail) == (CommandStatus.OK, "duplicate")
    assert len(lock.grep(r"^I cmd unlock id=5 ok$")) == 1


def test_card_list_update_then_card_opens(lock, broker):
    cards = [bytes.fromhex("DEADBEEF"), bytes.fromhex("01020304050607")]
    args = struct.pack(">H", 2) + b"".join(bytes([len(c)]) + c for c in cards)
    res = broker.send_command(SN, 1, CommandKind.CARDS_SET, args).result(10)
    assert res.status == CommandStatus.OK and res.detail == "2 cards"
    lock.send("card deadbeef")
    lock.expect(r"^I hw relay on$")
    lock.send("card 01020304050607")
    lock.expect(r"^I evt queued seq=2 type=unlock$")
    lock.send("card 0A1B2C3D")                    # no longer on the list
    lock.expect(r"^I evt queued seq=3 type=failed_attempt$")
    assert (lock.folder / "cards.bin").read_bytes() == args[2:]


def test_bad_card_list_fails_without_side_effects(lock, broker):
    res = broker.send_command(SN, 1, CommandKind.CARDS_SET, struct.pack(">H", 3) + b"\x02ab").result(10)
    assert res.status == CommandStatus.FAILED
    lock.expect(r"^W cmd cards id=1 failed err=")
    assert (lock.folder / "cards.bin").read_bytes() == b"\x04\x0a\x1b\x2c\x3d"   # unchanged


def test_config_change_persists(lock, broker):
    res = broker.send_command(SN, 1, CommandKind.CONFIG, json.dumps({"unlock_s": 9}).encode()).result(10)
    assert res.status == CommandStatus.OK
    assert json.loads((lock.folder / "config.json").read_text())["unlock_s"] == 9
    res = broker.send_command(SN, 2, CommandKind.CONFIG, json.dumps({"sn": "EVIL"}).encode()).result(10)
    assert res.status == CommandStatus.FAILED and "cannot be changed" in res.detail
    assert json.loads((lock.folder / "config.json").read_text())["sn"] == SN


def test_reboot_command(lock, broker):
    res = broker.send_command(SN, 1, CommandKind.REBOOT).result(10)
    assert res.status == CommandStatus.OK
    lock.expect(r"^I sys reboot reason=cmd$")
    lock.expect(r"^I sys boot ")
    lock.expect(r"^I net connected")


def test_fw_update_with_bad_args_fails_and_changes_nothing(lock, broker):
    """(Until #39 FW_UPDATE was answered UNSUPPORTED; it is an update now: hil/test_ota.py.)
    Arguments that name no bundle are refused before anything is written."""
    res = broker.send_command(SN, 1, CommandKind.FW_UPDATE, b"{}").result(10)
    assert res.status == CommandStatus.FAILED and "version" in res.detail
    bad = json.dumps({"version": "2.0", "size": 10, "sha256": "zz" * 32}).encode()
    res = broker.send_command(SN, 2, CommandKind.FW_UPDATE, bad).result(10)
    assert res.status == CommandStatus.FAILED
    assert not (lock.folder / "ota.dat").exists() and not (lock.folder / "lib.new").exists()


def test_command_arriving_with_the_connect_ack_runs_at_once(flash, lock_factory):
    """A broker that kept a command for an offline lock sends it right behind the
    CONNECT_ACK, often in the same TCP segment: it must run now, not at the broker's
    next frame (heartbeat_s=300 here: waiting for it would time the test out)."""
    b = MiniBroker({SN: KEY}, heartbeat_s=300)
    try:
        set_config(flash, brokers=[["127.0.0.1", b.port]], frame_mac=False, heartbeat_s=300,
                   backoff_min_ms=100, backoff_max_ms=500)
        fut = b.queue_command(SN, 1, CommandKind.UNLOCK, struct.pack(">H", 1))
        lk = lock_factory(flash)
        lk.expect(r"^I net connected")
        lk.expect(r"^I cmd unlock id=1 ok$")
        assert fut.result(10).status == CommandStatus.OK
    finally:
        b.close()


def test_config_change_of_brokers_applies_at_the_next_connect(lock, broker):
    other = MiniBroker({SN: KEY})
    try:
        # A change of the broker list must say so in the signed command itself: an
        # unmarked one is refused by the lock (defence in depth: the broker grants the
        # marker only to the config.network right).
        change = json.dumps({"brokers": [["127.0.0.1", other.port]]}).encode()
        res = broker.send_command(SN, 1, CommandKind.CONFIG, change).result(10)
        assert (res.status, res.detail) == (CommandStatus.REFUSED, "network_unmarked")
        change = json.dumps({"network": True, "tls": {"server_hostname": "x"}}).encode()
        assert broker.send_command(SN, 2, CommandKind.CONFIG, change).result(10).status == \
            CommandStatus.OK                           # the marker alone passes the lock
        assert json.loads((lock.folder / "config.json").read_text())["tls"]["enabled"] is False
        change = json.dumps({"network": True, "brokers": [["127.0.0.1", other.port]],
                             "tls": {"server_hostname": ""}}).encode()
        assert broker.send_command(SN, 3, CommandKind.CONFIG, change).result(10).status == CommandStatus.OK
        broker.stop()                                  # the old gateway goes away
        lock.expect(rf"^I net connected broker=127.0.0.1:{other.port}$", timeout=20)
        lock.send("event tamper")
        lock.expect(r"^I evt acked seq=1$")
        assert other.seqs(SN) == [1]
    finally:
        other.close()


def test_cfgchange_itself_refuses_an_unmarked_network_change(built, run_app, tmp_path):
    """Defence in depth inside the firmware: even called directly (past the command
    check), the config writer refuses brokers/tls without "network": true and leaves
    config.json as it was; with the marker it validates the TLS settings."""
    import shutil


    shutil.copy(built / "config.json", tmp_path / "config.json")
    before = (tmp_path / "config.json").read_text()
    out = run_app("""
from lockapp import config
from lockapp.cfgchange import apply_change
cfg = config.load()
for ch in ({"brokers": [["10.6.6.6", 6800]]}, {"tls": {"enabled": False}},
           {"network": 1, "brokers": [["10.6.6.6", 6800]]},
           {"network": True, "tls": {"enabled": "no"}}, {"network": True, "tls": {"x": 1}}):
    try:
        apply_change(cfg, ch)
        print("APPLIED", ch)
    except config.ConfigError as e:
        print("REFUSED", e)
new = apply_change(cfg, {"network": True, "brokers": [["10.0.0.2", 6843]]})
print("OK", new["brokers"], "network" in new)
""", tmp_path)
    assert "APPLIED" not in out, out
    assert out.count("REFUSED") == 5
    assert "refused without network=true" in out
    assert "OK [['10.0.0.2', 6843]] False" in out
    assert before != (tmp_path / "config.json").read_text()      # only the marked one wrote


def test_command_code_is_unloaded_after_each_command(run_app, tmp_path):
    """The command handler is loaded for a command and unloaded after (module and
    package attribute), so its heap is not held in service; a second command loads
    it again."""
    out = run_app("""
import sys, gc
import lockapp
from lockapp.app import App
class Clock:
    def now_ms(self): return 0
class Stub:
    clock = Clock()
held = []
for _ in range(3):
    print(App.handle_command(Stub(), b"junk"))
    print("lockapp.commands" in sys.modules, hasattr(lockapp, "commands"))
    gc.collect()
    held.append(gc.mem_alloc())
# (a .mpy's names are interned for good at its first load: compare later loads)
print(held[2] - held[1] < 64)
""", tmp_path)
    lines = [ln for ln in out.splitlines() if not ln.startswith("W cmd refused")]
    assert lines == ["(0, 2, 'malformed')", "False False"] * 3 + ["True"], out
