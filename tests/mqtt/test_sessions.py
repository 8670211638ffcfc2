"""Persistent sessions (MQTT 3.1.1 clean session false, MQTT 5 Clean Start 0 with an
expiry) resume from their clusters' positions after a disconnect and a broker SIGKILL;
a clean session starts afresh."""

from __future__ import annotations

import pytest

from lockmq.client import Producer
from lockmq.testing import BrokerProcess, merge_tables

from .helpers import MQTT_ON, Client, mqtt_port

TOPIC = "door.events"


def _receive(c: Client, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        m = c.inbox.get(timeout=15)
        out.append(m.payload)
        c.ack(m)
    return out


@pytest.mark.parametrize("v5", [False, True], ids=["v3.1.1", "v5"])
def test_a_persistent_session_resumes_after_a_broker_sigkill(tmp_path, v5):
    proc = BrokerProcess(str(tmp_path / "data"), merge_tables(
        MQTT_ON, {"broker": {"auth": "off", "position_flush_ms": 20}}))
    try:
        port = mqtt_port(proc)
        opts = dict(client_id="durable", clean=False, manual_ack=True, expiry_s=3600)
        c = Client(port, v5=v5, **opts)
        assert c.wait_connack()[0].session_present is False
        assert c.subscribe("door/events")[0] == 1
        with Producer(proc.address, producer_id="sess-test") as prod:
            for i in range(10):
                prod.send_sync(TOPIC, b"r%02d" % i)
            assert _receive(c, 10) == [b"r%02d" % i for i in range(10)]
            c.close()
            for i in range(10, 20):          # published while the session is away
                prod.send_sync(TOPIC, b"r%02d" % i)
        proc.tables["mqtt"]["port"] = port   # clients know the port
        proc.restart(crash=True)             # SIGKILL, then start on the same data
        c = Client(port, v5=v5, **opts)
        assert c.wait_connack()[0].session_present is True
        got = []
        while b"r19" not in got:
            got += _receive(c, 1)
        # nothing acknowledged lost; at most the last acks before the kill come again
        assert sorted(set(got)) == [b"r%02d" % i for i in range(20 - len(set(got)), 20)]
        assert set(got) >= {b"r%02d" % i for i in range(10, 20)}
        c.close()
        c = Client(port, v5=v5, client_id="durable", clean=True, manual_ack=True)
        assert c.wait_connack()[0].session_present is False   # clean: the session is gone
        c.close()
    finally:
        proc.stop()
