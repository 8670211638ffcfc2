"""Commands over MQTT: ``mosquitto_rr`` (MQTT 5 request/response) sends a remote
unlock to the real firmware (MicroPython unix port) through
``lockmq/command/<SN>/unlock``; the lock's result comes back on the response topic
with the correlation data. MQTT 3.1.1 gets it on ``lockmq/result/<client id>``; a
token without the command right is refused with its reason code."""

from __future__ import annotations

import json
import subprocess

import pytest

from lockmq.security import Permissions
from lockmq.testing import Lock, SecureBroker, merge_tables, require_micropython, wait_for
from lockmq.testing.lock import build_flash

from .helpers import needs, MOSQUITTO_RR, MQTT_ON, Client, mqtt_port

SN = "LOCKMQTT1"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    require_micropython()
    root = tmp_path_factory.mktemp("cmd")
    sb = SecureBroker(root, merge_tables(MQTT_ON), locks=[SN], tokens={
        "opener": Permissions(command=(f"unlock:{SN}",)), "viewer": Permissions()})
    proc = sb.start()
    sb.mqtt_port = mqtt_port(proc)
    flash = build_flash(root / "board" / "flash", sn=SN, key=sb.keys[SN],
                        brokers=[("127.0.0.1", proc.port)])
    lock = Lock(flash)
    lock.expect(rf"^I net connected broker=127.0.0.1:{proc.port}", timeout=30)
    sb.lock = lock
    yield sb
    lock.close()
    sb.close()


def test_a_remote_unlock_from_mosquitto_rr_reaches_the_firmware(gateway):
    r = subprocess.run([needs(MOSQUITTO_RR), "-p", str(gateway.mqtt_port), "-V", "5",
                        "-u", "opener", "-P", gateway.tok["opener"],
                        "-t", f"lockmq/command/{SN}/unlock", "-e", "lockmq/result/rr-1",
                        "-i", "rr-1", "-m", "2", "-W", "30"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res == {"sn": SN, "kind": "unlock", "status": "OK", "detail": "unlocked 2s"}
    gateway.lock.expect(r"^I hw relay on$")
    gateway.lock.expect(r"^I cmd unlock id=\d+ ok$")


def test_v311_gets_the_result_on_its_result_topic_and_v5_its_correlation(gateway):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    c = Client(gateway.mqtt_port, v5=False, client_id="ops-1", username="opener",
               password=gateway.tok["opener"])
    try:
        assert c.subscribe("lockmq/result/ops-1")[0] in (0, 1)
        c.c.publish(f"lockmq/command/{SN}/unlock", b"3", qos=1)
        m = c.inbox.get(timeout=30)
        assert m.topic == "lockmq/result/ops-1"
        assert json.loads(m.payload)["detail"] == "unlocked 3s"
    finally:
        c.close()
    c = Client(gateway.mqtt_port, v5=True, client_id="ops-2", username="opener",
               password=gateway.tok["opener"])
    try:
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = "lockmq/result/ops-2/x"
        props.CorrelationData = b"req-42"
        c.c.publish(f"lockmq/command/{SN}/unlock", b"", qos=1, properties=props)
        m = c.inbox.get(timeout=30)
        assert m.topic == "lockmq/result/ops-2/x"
        assert m.properties.CorrelationData == b"req-42"
        assert json.loads(m.payload)["detail"] == "unlocked 5s"   # no payload: 5 s
    finally:
        c.close()


def test_a_token_without_the_command_right_is_refused(gateway):
    c = Client(gateway.mqtt_port, v5=True, client_id="viewer-1", username="viewer",
               password=gateway.tok["viewer"])
    try:
        info = c.c.publish(f"lockmq/command/{SN}/unlock", b"2", qos=1)
        rc = wait_for(lambda: c.pubacks.get(info.mid), "the PUBACK")
        assert int(getattr(rc, "value", rc)) == 0x87   # not authorized
        res = json.loads(c.inbox.get(timeout=10).payload)
        assert res["status"] == "REFUSED" and res["error"] == "FORBIDDEN"
    finally:
        c.close()
    assert gateway.lock.grep(r"cmd unlock id=\d+ ok") != []   # (only the allowed ones ran)
