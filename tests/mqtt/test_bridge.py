"""The northbound bridge against a real Mosquitto started here: the upstream
stopped mid-stream, the link cut by the fault proxy and the gateway SIGKILLed, then
every record is present upstream, each lock's in its order, and /metrics shows the
bridge's state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from lockmq.client import Producer
from lockmq.hil.proxy import FaultProxy
from lockmq.testing import BrokerProcess, free_port, wait_for

from .helpers import Client

MOSQUITTO = "/usr/sbin/mosquitto"
LOCKS = [f"LOCK-{c}" for c in "ABCDE"]
PER_LOCK = 70


class Mosquitto:
    """A real Mosquitto on 127.0.0.1 with on-disk persistence (its queued messages
    for a persistent subscriber survive a stop)."""

    def __init__(self, root: Path) -> None:
        if not os.path.exists(MOSQUITTO):
            pytest.skip("mosquitto is not installed (Debian: mosquitto)")
        self.port = free_port()   # (mosquitto cannot report a port it picked)
        root.mkdir(parents=True, exist_ok=True)
        self.conf = root / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
            f"persistence_location {root}/\nautosave_interval 1\nlog_dest stderr\n"
            + ("user root\n" if os.geteuid() == 0 else ""))   # (root: it would drop to "mosquitto")
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)],
                                     stdout=subprocess.DEVNULL, stderr=open(self.conf.with_name("mosquitto.log"), "ab"))
        wait_for(self._listening, "mosquitto listening", timeout=15)

    def _listening(self) -> bool:
        import socket
        try:
            socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)   # saves its persistence file
            self.proc.wait(15)


# v3.1.1 in the slow tier (the command path below bridges both versions by default)
@pytest.mark.parametrize("version", [pytest.param(4, marks=pytest.mark.slow), 5], ids=["v3.1.1", "v5"])
def test_the_bridge_loses_nothing_across_an_upstream_outage_and_a_cut_link(tmp_path, version):
    mosq = Mosquitto(tmp_path / "mosquitto")
    proxy = FaultProxy(("127.0.0.1", mosq.port)).start()
    upstream = Client(mosq.port, v5=False, client_id="cloud-sub", clean=False)
    got: list = []
    proc = None
    try:
        assert upstream.subscribe("gw7/lock/events/+")[0] == 1
        topics: list = []

        def collect() -> None:
            while True:
                m = upstream.inbox.get()
                r = json.loads(m.payload)
                topics.append((m.topic, r))
                got.append(r)
        threading.Thread(target=collect, daemon=True).start()
        proc = BrokerProcess(str(tmp_path / "data"), {
            "broker": {"auth": "off"},
            "bridge": {"enabled": True, "upstream": "127.0.0.1:%d" % proxy.address[1],
                       "topics": ["lock.events"], "remote_prefix": "gw7/", "version": version, "per_lock_topics": True,
                       "keepalive_s": 2, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0}})
        prods = {sn: Producer(proc.address, producer_id=sn) for sn in LOCKS}

        def send(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                for sn, p in prods.items():
                    p.send_sync("lock.events", f"{sn}:{i}".encode())

        send(0, 15)
        wait_for(lambda: len(got) >= 40, "records upstream")
        mosq.stop()                            # the upstream goes away mid-stream
        send(15, 30)                           # ... and the gateway keeps taking records
        wait_for(lambda: proc.metrics().get("lockmq_bridge_connected") == 0, "bridge down")
        time.sleep(1)
        mosq.start()
        send(30, 45)
        wait_for(lambda: len({(r["sn"], r["seq"]) for r in got}) >= 5 * 30, "after the outage")
        proxy.cut()                            # the link cut: connections reset, refused
        send(45, 60)
        time.sleep(1)
        proxy.restore()
        wait_for(lambda: len({(r["sn"], r["seq"]) for r in got}) >= len(LOCKS) * 60,
                 "every record upstream after the cut")
        m = proc.metrics()   # the outage and the cut, as an operator sees them
        assert m["lockmq_bridge_errors_total"] >= 2
        assert m["lockmq_bridge_last_error_timestamp_seconds"] > 0
        for p in prods.values():
            p.close()
        proc.restart(crash=True)               # the gateway itself crashes: the bridge's
        # (the bridge's position is on disk; the locks go on with their sequence numbers)
        prods = {sn: Producer(proc.address, producer_id=sn, start_seq=60) for sn in LOCKS}
        send(60, PER_LOCK)
        wait_for(lambda: len({(r["sn"], r["seq"]) for r in got}) >= len(LOCKS) * PER_LOCK,
                 "every record upstream", timeout=60)
        for p in prods.values():
            p.close()
        assert all(topic == f"gw7/lock/events/{r['sn']}" for topic, r in topics)
        for sn in LOCKS:
            mine = [r["seq"] for r in got if r["sn"] == sn]
            first = list(dict.fromkeys(mine))   # QoS 1: a record may come twice, in order
            assert first == list(range(PER_LOCK)), (sn, mine)
        m = wait_for(lambda: (lambda m: m if m.get("lockmq_bridge_lag") == 0 else None)(
            proc.metrics()), "no lag")
        assert m["lockmq_bridge_connected"] == 1 and m["lockmq_bridge_inflight"] == 0
    finally:
        upstream.close()
        if proc is not None:
            proc.stop()
        proxy.close()
        mosq.stop()


@pytest.mark.parametrize("version", [4, 5], ids=["v3.1.1", "v5"])
def test_commands_from_the_upstream_go_through_the_command_path(tmp_path, version):
    mosq = Mosquitto(tmp_path / "mosquitto")
    proc = BrokerProcess(str(tmp_path / "data"), {
        "broker": {"auth": "off"}, "commands": {"default_expiry_s": 1.0},
        "bridge": {"enabled": True, "upstream": f"127.0.0.1:{mosq.port}",
                   "topics": ["lock.events"], "version": version,
                   "command_filter": "gw7/command/+/+", "command_token": "ops"}})
    cloud = Client(mosq.port, v5=version == 5, client_id="cloud-ops")
    try:
        proc.wait_log(r"event=bridge_up")
        reply = "gw7/replies/ops" if version == 5 else "gw7/command/LOCK-X/unlock/result"
        assert int(getattr(r := cloud.subscribe(reply)[0], "value", r)) == 1
        time.sleep(0.5)   # (the bridge's own SUBSCRIBE is in place)
        props = None
        if version == 5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties
            props = Properties(PacketTypes.PUBLISH)
            props.ResponseTopic = reply
            props.CorrelationData = b"c-7"
        cloud.c.publish("gw7/command/LOCK-X/unlock", b"2", qos=1, properties=props)
        m = cloud.inbox.get(timeout=30)
        res = json.loads(m.payload)
        # no lock LOCK-X is connected: the command path holds it until it expires
        assert res["sn"] == "LOCK-X" and res["kind"] == "unlock" and res["status"] == "OFFLINE"
        if version == 5:
            assert m.properties.CorrelationData == b"c-7"
        assert proc.metrics()["lockmq_bridge_commands_total"] == 1
    finally:
        cloud.close()
        proc.stop()
        mosq.stop()
