"""The firmware against the real `lockmq broker`: a device provisioned with
`lockmq devices add`, built with `lockmq firmware build --config`, publishing
events a consumer-cluster member receives, and a remote unlock sent through the
broker by a service and executed by the lock."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lockmq.cli import main as lockmq_main
from lockmq.client import decode_event
from lockmq.protocol import CommandKind, EventType, LockEvent
from lockmq.testing import BrokerProcess, Lock, free_port

LOCKMQ = str(Path(sys.executable).with_name("lockmq"))
SN = "LOCKE2E1"


@pytest.fixture
def real_broker(tmp_path):
    data = tmp_path / "data"
    broker = BrokerProcess(data)   # it binds a free port; locks are added while it runs
    port = broker.port
    prov = tmp_path / "prov.json"
    subprocess.run([LOCKMQ, "devices", "add", SN, "--out", str(prov), "--broker", f"127.0.0.1:{port}",
                    "--data-dir", str(data)], check=True, capture_output=True, timeout=60)
    tok = subprocess.run([LOCKMQ, "tokens", "create", "e2e", "--consume", "lock.events",
                          "--command", SN, "--json", "--data-dir", str(data)],
                         check=True, capture_output=True, timeout=60)
    token = json.loads(tok.stdout)["token"]
    yield port, prov, token, broker
    broker.stop()


def test_publish_and_remote_unlock_through_lockmq_broker(board_template, build_args, tmp_path, real_broker,
                                                         lock_factory):
    from lockmq.client import Consumer, Producer

    port, prov, token, broker = real_broker
    board = tmp_path / "board"
    shutil.copytree(board_template, board)
    assert lockmq_main(["firmware", "build", "--out", str(board), "--config", str(prov),
                        "--hw", "sim", "--no-image", *build_args]) == 0
    assert (board / "lib").exists() != bool(build_args)   # frozen: the code is in the image
    lk: Lock = lock_factory(board)
    lk.expect(rf"^I net connected broker=127.0.0.1:{port} mac=1$", timeout=30)
    lk.send("event unlock 3")
    lk.expect(r"^I evt queued seq=3 type=unlock$")
    lk.send("badcard 99")
    lk.expect(r"^I evt acked seq=4$", timeout=20)
    lk.send("badcard 98")   # (sent once seq 4 is acked: a read of its own)
    lk.expect(r"^I evt acked seq=5$", timeout=20)

    got: list = []
    done = threading.Event()

    def handle(msg) -> None:
        got.append(msg)
        if len(got) >= 5:
            done.set()

    c = Consumer(f"127.0.0.1:{port}", token=token, topic="lock.events", cluster="e2e", handler=handle)
    c.start()
    try:
        assert done.wait(30), f"consumer got {len(got)} messages"
    finally:
        c.stop()
    mine = sorted((m for m in got if m.sn == SN), key=lambda m: m.seq)
    assert [m.seq for m in mine] == [1, 2, 3, 4, 5]
    kinds = [LockEvent.decode(m.payload).event_type for m in mine]
    assert kinds == [EventType.UNLOCK] * 3 + [EventType.FAILED_ATTEMPT] * 2
    # one vocabulary: the consumer's enum says the name the lock logged for each event
    logged = {int(m.group(1)): m.group(2) for m in lk.grep(r"^I evt queued seq=(\d+) type=(\w+)$")}
    assert [str(decode_event(m.payload).event_type) for m in mine] == [logged[m.seq] for m in mine]

    # the lock seals its frames (mac=1), and after two answered publish reads its
    # steady publishes are the compiled lane's: the command must reach it tagged with
    # the session's next counter, which the lane holds
    assert broker.metrics()["lockmq_lane_joins_total"] >= 1
    with Producer(f"127.0.0.1:{port}", token=token) as p:
        outcome = p.command(SN, CommandKind.UNLOCK, struct.pack(">H", 2), expires_in_s=30, timeout_s=30)
    assert outcome.ok and outcome.target == SN and outcome.detail == "unlocked 2s", outcome
    lk.expect(r"^I hw relay on$")
    lk.expect(rf"^I cmd unlock id={outcome.cmd_id} ok$")   # the id the client got is the lock's
    assert lk.grep(r"net down") == [], lk.log()   # (a bad tag: BAD_MAC, a reconnect)


def test_tls_to_lockmq_broker(built, tmp_path, lock_factory, needs_tls):
    """`lockmq certs init` -> broker TLS port -> `devices add --tls-ca` ->
    `firmware build --config --tls-ca`: the lock verifies the broker and publishes."""
    data, tls = tmp_path / "data", tmp_path / "tls"
    tls_port = free_port()
    subprocess.run([LOCKMQ, "certs", "init", str(tls), "--host", "gw.lock.test", "--ip", "127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    broker = BrokerProcess(data, {"security": {"tls_cert": str(tls / "server.pem"),
                                               "tls_key": str(tls / "server.key"),
                                               "tls_port": tls_port}}, start=False)
    conf = broker.write_config()
    prov = tmp_path / "prov.json"
    subprocess.run([LOCKMQ, "devices", "add", SN, "--out", str(prov), "--broker", f"127.0.0.1:{tls_port}",
                    "--tls-ca", str(tls / "ca.der"), "--server-hostname", "gw.lock.test",
                    "--config", str(conf)], check=True, capture_output=True, timeout=60)
    broker.start()
    try:
        board = tmp_path / "board"
        shutil.copytree(built, board)
        assert lockmq_main(["firmware", "build", "--out", str(board), "--config", str(prov),
                            "--tls-ca", str(tls / "ca.der"), "--hw", "sim", "--no-image"]) == 0
        assert json.loads((board / "config.json").read_text())["tls"]["enabled"] is True
        lk = lock_factory(board)
        lk.expect(rf"^I net connected broker=127.0.0.1:{tls_port}$", timeout=30)
        lk.send("event tamper")
        lk.expect(r"^I evt acked seq=1$", timeout=20)
    finally:
        broker.stop()
