"""The standard semantics a client relies on: keepalive, will, QoS 2 in, an MQTT 5
PUBACK reason code as a nack (retry levels, then the dead-letter topic), session
takeover, an assigned client id, the topic mapping."""

from __future__ import annotations

import socket
import time

from hypothesis import given
from hypothesis import strategies as st

from lockmq.client import Producer
from lockmq.mqtt import codec as c
from lockmq.mqtt import topics as t
from lockmq.testing import FAST_TIMERS, BrokerThread, merge_tables, wait_for

from .helpers import MQTT_ON, Client


def _raw(port: int, version: int = c.V5, **kw) -> tuple[socket.socket, c.Decoder]:
    s = socket.create_connection(("127.0.0.1", port), 10)
    s.settimeout(10)
    s.sendall(c.Connect(version=version, **kw).encode())
    return s, c.Decoder(version=version)


def _next(s: socket.socket, dec: c.Decoder):
    while (p := dec.next_packet()) is None:
        data = s.recv(65536)
        if not data:
            return None
        dec.feed(data)
    return p


def test_a_silent_client_is_dropped_after_one_and_a_half_keepalives_and_its_will_sent(
        mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    watcher = Client(port, v5=True, client_id="watcher")
    try:
        watcher.subscribe("door/wills")
        s, dec = _raw(port, client_id="silent", keepalive=1,
                      will=c.Will("door/wills", b"silent is gone", 1))
        ack = _next(s, dec)
        assert isinstance(ack, c.ConnAck) and ack.reason == 0
        bye = _next(s, dec)          # we send nothing: the server gives up on us
        assert isinstance(bye, c.Disconnect) and bye.reason == 0x8D
        assert watcher.inbox.get(timeout=10).payload == b"silent is gone"
        s.close()
    finally:
        watcher.close()


def test_a_clean_disconnect_sends_no_will_and_pings_keep_a_client(mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    watcher = Client(port, v5=False, client_id="watcher2")
    try:
        watcher.subscribe("door/wills")
        s, dec = _raw(port, version=c.V311, client_id="polite", keepalive=1,
                      will=c.Will("door/wills", b"nope", 0))
        assert _next(s, dec).reason == 0
        for _ in range(4):           # 2 s of pings: longer than 1.5 keepalives
            s.sendall(c.Ping(c.PINGREQ).encode(c.V311))
            assert _next(s, dec).ptype == c.PINGRESP
            time.sleep(0.5)
        s.sendall(c.Disconnect().encode(c.V311))
        assert _next(s, dec) is None
        with Producer(mqtt_broker.address, producer_id="sem") as p:
            p.send_sync("door.wills", b"marker")
        assert watcher.inbox.get(timeout=10).payload == b"marker"   # no will before it
    finally:
        watcher.close()


def test_qos2_publishes_are_stored_once_and_completed(mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    sub = Client(port, v5=True, client_id="q2-sub")
    try:
        sub.subscribe("door/q2", qos=2)
        s, dec = _raw(port, client_id="q2-pub")
        assert _next(s, dec).reason == 0
        pub = c.Publish("door/q2", b"once", 2, packet_id=7)
        s.sendall(pub.encode(c.V5))
        assert _next(s, dec) == c.Ack(c.PUBREC, 7)
        pub.dup = True
        s.sendall(pub.encode(c.V5))  # a resend before PUBREL: not stored again
        assert _next(s, dec) == c.Ack(c.PUBREC, 7)
        s.sendall(c.Ack(c.PUBREL, 7).encode(c.V5))
        assert _next(s, dec) == c.Ack(c.PUBCOMP, 7)
        m = sub.inbox.get(timeout=10)
        assert m.payload == b"once" and m.qos == 2   # and out at QoS 2: PUBREC acks it
        time.sleep(0.3)
        assert sub.inbox.empty()
        s.close()
    finally:
        sub.close()


def test_retained_messages_go_to_new_subscriptions_and_survive_a_restart(tmp_path):
    b = BrokerThread(str(tmp_path / "data"), **merge_tables(FAST_TIMERS, MQTT_ON)).start()
    try:
        port = b.broker.mqtt.port
        pub = Client(port, v5=False, client_id="state")
        for name, state in (("lock/state/A", b"online"), ("lock/state/B", b"offline")):
            info = pub.c.publish(name, state, qos=1, retain=True)
            info.wait_for_publish(10)
        pub.close()
    finally:
        b.stop()
    b = BrokerThread(str(tmp_path / "data"), **merge_tables(FAST_TIMERS, MQTT_ON)).start()
    try:
        port = b.broker.mqtt.port
        sub = Client(port, v5=True, client_id="dash")
        sub.subscribe("lock/state/+")
        got = {m.topic: (m.payload, m.retain) for m in (sub.inbox.get(timeout=10),
                                                       sub.inbox.get(timeout=10))}
        assert got == {"lock/state/A": (b"online", True), "lock/state/B": (b"offline", True)}
        clear = Client(port, v5=True, client_id="clear")
        clear.c.publish("lock/state/B", b"", qos=1, retain=True).wait_for_publish(10)
        clear.close()
        late = Client(port, v5=False, client_id="late")
        late.subscribe("lock/state/#")
        m = late.inbox.get(timeout=10)
        assert (m.topic, m.payload, m.retain) == ("lock/state/A", b"online", True)
        time.sleep(0.3)
        assert late.inbox.empty()   # B was cleared
        sub.close()
        late.close()
    finally:
        b.stop()


def test_a_puback_reason_code_is_a_nack_then_a_dead_letter(tmp_path):
    b = BrokerThread(str(tmp_path / "data"), **merge_tables(FAST_TIMERS, MQTT_ON, {
        "consumers": {"time_scale": 0.01, "max_retries": 2}})).start()
    try:
        port = b.broker.mqtt.port
        s, dec = _raw(port, client_id="refuser")
        assert _next(s, dec).reason == 0
        s.sendall(c.Subscribe(1, [c.Subscription("$share/picky/door/events", 1)]).encode(c.V5))
        assert _next(s, dec).reasons == [1]
        with Producer(b.address, producer_id="nack-test") as p:
            p.send_sync("door.events", b"poison")
        deliveries = []
        while len(deliveries) < 3:   # the first delivery and two retries
            m = _next(s, dec)
            deliveries.append(m)
            s.sendall(c.Ack(c.PUBACK, m.packet_id, 0x80).encode(c.V5))   # unspecified error
        assert [m.payload for m in deliveries] == [b"poison"] * 3
        wait_for(lambda: b.call(lambda: b.broker.core.queue_end("$dlq.picky")) == 1,
                 "the dead letter")
        s.close()
    finally:
        b.stop()


def test_a_second_connection_takes_the_session_over(mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    s1, d1 = _raw(port, client_id="twin")
    assert _next(s1, d1).reason == 0
    s2, d2 = _raw(port, client_id="twin")
    assert _next(s2, d2).reason == 0
    bye = _next(s1, d1)
    assert isinstance(bye, c.Disconnect) and bye.reason == 0x8E
    s1.close()
    s2.close()


def test_an_empty_client_id_is_assigned_one_and_bad_input_named(mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    s, d = _raw(port, client_id="")
    ack = _next(s, d)
    assert ack.reason == 0 and ack.props["assigned_client_id"].startswith("auto-")
    s.sendall(c.Subscribe(1, [c.Subscription("door/#/x", 1),
                              c.Subscription("lockmq/command/x", 1)]).encode(c.V5))
    assert _next(s, d).reasons == [0x8F, 0x8F]
    s.sendall(b"\x30\x02\x00")                      # a PUBLISH cut inside its topic
    s.sendall(b"\xf0\x00")                          # ... and a reserved packet type
    bye = _next(s, d)
    assert isinstance(bye, c.Disconnect) and bye.reason in (0x81, 0x82)
    s.close()


lockmq_topics = st.text("abcXYZ019._$%-", min_size=1, max_size=60)


@given(lockmq_topics)
def test_the_topic_mapping_is_reversible(topic):
    if t.mappable(topic):
        assert t.to_lockmq(t.to_mqtt(topic)) == topic


def test_filters_match_as_mqtt_says():
    assert t.matches("lock/#", "lock/events") and t.matches("lock/#", "lock")
    assert t.matches("+/events", "lock/events") and not t.matches("+", "lock/events")
    assert not t.matches("#", "$devices") and t.matches("$devices", "$devices")
    assert t.matches("/+", "/x") and not t.matches("lock/+", "lock/a/b")


def test_a_locks_online_state_is_a_retained_message(tmp_path):
    from lockmq.protocol import Role
    from lockmq.testing import open_peer

    b = BrokerThread(str(tmp_path / "data"), **merge_tables(FAST_TIMERS, {
        "mqtt": {"enabled": True, "port": -1, "topic_scan_ms": 50}})).start()
    try:
        port = b.broker.mqtt.port
        lock = open_peer(b.port, sn="LOCK-ST1", role=Role.LOCK)
        wait_for(lambda: b.call(lambda: b.broker.mqtt.device_states.states.get(
            "lockmq/devices/LOCK-ST1")), "the online event followed", timeout=10)
        dash = Client(port, v5=True, client_id="dash-st")
        dash.subscribe("lockmq/devices/+")
        m = dash.inbox.get(timeout=10)
        assert m.topic == "lockmq/devices/LOCK-ST1" and m.retain
        assert b'"state":"online"' in m.payload
        lock.close()
        m = dash.inbox.get(timeout=15)        # the change, as it happens
        assert m.topic == "lockmq/devices/LOCK-ST1" and not m.retain
        assert b'"state":"offline"' in m.payload
        dash.close()
    finally:
        b.stop()


def test_connections_over_the_cap_are_closed_at_once(tmp_path):
    b = BrokerThread(str(tmp_path / "data"), **merge_tables(FAST_TIMERS, {
        "mqtt": {"enabled": True, "port": -1, "max_connections": 1}})).start()
    try:
        port = b.broker.mqtt.port
        s1, d1 = _raw(port, client_id="first")
        assert _next(s1, d1).reason == 0
        s2, d2 = _raw(port, client_id="second")
        try:
            assert _next(s2, d2) is None  # closed without a word: over the cap
        except ConnectionResetError:      # (or reset: our CONNECT was still unread)
            pass
        s1.close()
        s2.close()
        wait_for(lambda: b.call(lambda: len(b.broker.mqtt.conns)) == 0, "the first gone")
        s3, d3 = _raw(port, client_id="third")
        assert _next(s3, d3).reason == 0
        s3.close()
    finally:
        b.stop()
