"""Tokens as MQTT username/password, with the same rights as on the lockmq protocol:
a bad password, a subscription and a publish without the right are refused with
their reason codes (MQTT 5) or the v3.1.1 equivalents."""

from __future__ import annotations

import subprocess

import pytest

from lockmq.security import Permissions
from lockmq.testing import SecureBroker, merge_tables, wait_for

from .helpers import needs, MOSQUITTO_PUB, MOSQUITTO_SUB, MQTT_ON, Client, mqtt_port


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    sb = SecureBroker(tmp_path_factory.mktemp("secure"), merge_tables(MQTT_ON), tokens={
        "reader": Permissions(consume=("door.*",)),
        "writer": Permissions(publish=("door.*",)),
        "nobody": Permissions()})
    proc = sb.start()
    sb.mqtt_port = mqtt_port(proc)
    yield sb
    sb.close()


def _rc(code) -> int:
    return int(getattr(code, "value", code))


@pytest.mark.parametrize("v5", [False, True], ids=["v3.1.1", "v5"])
def test_a_wrong_token_is_refused_at_connect(secure, v5):
    c = Client(secure.mqtt_port, v5=v5, username="reader", password="not-a-token")
    try:
        # v3.1.1's return code 4 reaches paho's API as the v5 code it stands for
        assert _rc(c.wait_connack()[1]) == 0x86   # bad user name or password
    finally:
        c.close()


@pytest.mark.parametrize("version", ["mqttv311", "5"])
def test_mosquitto_clients_name_the_refusal(secure, version):
    r = subprocess.run([needs(MOSQUITTO_SUB), "-p", str(secure.mqtt_port), "-V", version,
                        "-t", "door/x", "-u", "reader", "-P", "wrong", "-C", "1", "-W", "5"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0 and "bad user name or password" in (r.stderr + r.stdout).lower()
    if version != "5":
        return
    r = subprocess.run([needs(MOSQUITTO_PUB), "-p", str(secure.mqtt_port), "-V", "5", "-q", "1",
                        "-t", "door/events", "-m", "x", "-u", "reader",
                        "-P", secure.tok["reader"]], capture_output=True, text=True, timeout=20)
    out = (r.stderr + r.stdout).lower()   # mosquitto_pub warns with the reason and string
    assert "not authorized" in out and "needs the publish right" in out, out


@pytest.mark.parametrize("v5", [False, True], ids=["v3.1.1", "v5"])
def test_a_subscription_without_the_right_is_refused(secure, v5):
    c = Client(secure.mqtt_port, v5=v5, username="nobody", password=secure.tok["nobody"])
    try:
        assert _rc(c.wait_connack()[1]) == 0
        assert _rc(c.subscribe("door/events")[0]) == (0x87 if v5 else 0x80)
    finally:
        c.close()
    c = Client(secure.mqtt_port, v5=v5, username="reader", password=secure.tok["reader"])
    try:
        assert _rc(c.subscribe("door/events")[0]) == 1                # the right: granted
        assert _rc(c.subscribe("$share/billing/door/events")[0]) == 1
    finally:
        c.close()


def test_a_publish_without_the_right_is_refused_with_its_reason_code(secure):
    c = Client(secure.mqtt_port, v5=True, username="reader", password=secure.tok["reader"])
    try:
        info = c.c.publish("door/events", b"x", qos=1)
        rc = wait_for(lambda: c.pubacks.get(info.mid), "the PUBACK")
        assert _rc(rc) == 0x87
    finally:
        c.close()
    w = Client(secure.mqtt_port, v5=True, client_id="writer-1", username="writer",
               password=secure.tok["writer"])
    try:
        info = w.c.publish("door/events", b"x", qos=1)
        wait_for(lambda: info.mid in w.pubacks, "the PUBACK")
        assert _rc(w.pubacks[info.mid]) == 0
    finally:
        w.close()


def test_mqtt_over_tls_with_a_token(tmp_path):
    import re
    import ssl

    sb = SecureBroker(tmp_path, {"mqtt": {"enabled": True, "port": 0, "tls_port": -1}},
                      tls=True, tokens={"reader": Permissions(consume=("door.*",))})
    proc = sb.start()
    try:
        line = proc.wait_log(r"event=mqtt_started")
        tls_port = int(re.search(r"\btls_port=(\d+)", line).group(1))
        assert re.search(r"\bport=", line) is None   # no plain listener asked for
        import paho.mqtt.client as mqtt
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="tls-1",
                        protocol=mqtt.MQTTv5)
        c.tls_set(sb.certs.ca_pem, tls_version=ssl.PROTOCOL_TLS_CLIENT)
        c.username_pw_set("reader", sb.tok["reader"])
        got = []
        c.on_connect = lambda cl, u, f, rc, p: got.append(int(getattr(rc, "value", rc)))
        c.connect("127.0.0.1", tls_port, 30)
        c.loop_start()
        wait_for(lambda: got, "the CONNACK over TLS")
        assert got == [0]
        c.disconnect()
        c.loop_stop()
    finally:
        sb.close()


def test_the_listener_shows_in_metrics(secure):
    bad = Client(secure.mqtt_port, v5=True, username="reader", password="wrong")
    bad.wait_connack()
    bad.close()
    c = Client(secure.mqtt_port, v5=True, username="reader", password=secure.tok["reader"])
    try:
        info = c.c.publish("door/events", b"x", qos=1)
        wait_for(lambda: c.pubacks.get(info.mid), "the refusal")
        m = secure.broker.metrics()
        assert m["lockmq_mqtt_connections"] >= 1 and "lockmq_mqtt_sessions" in m
        assert m["lockmq_mqtt_connect_refused_total"] >= 1
        assert m["lockmq_mqtt_publish_refused_total"] >= 1
    finally:
        c.close()


def test_a_revoked_token_ends_its_mqtt_session_at_once(tmp_path):
    sb = SecureBroker(tmp_path, merge_tables(MQTT_ON), tokens={"temp": Permissions(consume=("door.*",))})
    proc = sb.start()
    try:
        port = mqtt_port(proc)
        c = Client(port, v5=True, client_id="temp-1", username="temp",
                   password=sb.tok["temp"])
        assert int(getattr(r := c.wait_connack()[1], "value", r)) == 0
        tid = sb.tok["temp"].split("_")[1]
        assert sb.tokens.revoke(tid)
        rc = c.disconnects.get(timeout=15)        # the broker ends it: 0x87
        assert int(getattr(rc, "value", rc)) == 0x87
        c.close()
        again = Client(port, v5=True, client_id="temp-2", username="temp",
                       password=sb.tok["temp"])
        assert int(getattr(r := again.wait_connack()[1], "value", r)) == 0x86
        again.close()
    finally:
        sb.close()
