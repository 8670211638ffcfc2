"""What an MQTT interoperability suite checks (the scenarios of Eclipse Paho's
client_test.py, written here with paho-mqtt and raw packets): offline queueing on a
wildcard, overlapping subscriptions, redelivery on reconnect, zero-length client ids,
``$`` topics out of ``#``."""

from __future__ import annotations

import time

from lockmq.mqtt import codec as c

from .helpers import Client
from .test_semantics import _next, _raw


def test_offline_messages_on_a_wildcard_for_topics_that_did_not_exist(mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    a = Client(port, v5=False, client_id="offline-a", clean=False)
    a.subscribe("+/+", qos=2)
    a.close()
    b = Client(port, v5=False, client_id="offline-b")
    for topic, qos in (("TopicA/B", 0), ("Topic/C", 1), ("TopicA/C", 2)):
        b.c.publish(topic, b"qos %d" % qos, qos=qos).wait_for_publish(10)
    b.close()
    a = Client(port, v5=False, client_id="offline-a", clean=False)
    got = sorted(a.inbox.get(timeout=10).payload for _ in range(3))
    assert got == [b"qos 0", b"qos 1", b"qos 2"]   # QoS 0 too: it is in the log
    a.close()


def test_overlapping_subscriptions_each_deliver_at_their_qos(mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    a = Client(port, v5=False, client_id="overlap")
    a.c.subscribe([("TopicA/#", 2), ("TopicA/+", 1)])
    assert list(a.subacks.get(timeout=10)) == [2, 1]
    a.c.publish("TopicA/C", b"overlapping", qos=2)
    got = sorted(a.inbox.get(timeout=10).qos for _ in range(2))
    assert got == [1, 2]
    a.close()


def test_unacknowledged_deliveries_come_again_after_a_reconnect(mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    s, dec = _raw(port, version=c.V311, client_id="redeliver", clean_start=False)
    assert _next(s, dec).reason == 0
    s.sendall(c.Subscribe(1, [c.Subscription("TopicA/#", 2)]).encode(c.V311))
    assert _next(s, dec).reasons == [2]
    s.sendall(c.Publish("TopicA/B", b"one", 1, packet_id=2).encode(c.V311)
              + c.Publish("TopicA/C", b"two", 1, packet_id=3).encode(c.V311))
    seen = []
    while len(seen) < 2:               # our PUBACKs and the two deliveries, unanswered
        p = _next(s, dec)
        if p.ptype == c.PUBLISH:
            seen.append(p.payload)
    s.close()                          # gone without acknowledging them
    time.sleep(0.2)
    s, dec = _raw(port, version=c.V311, client_id="redeliver", clean_start=False)
    ack = _next(s, dec)
    assert ack.reason == 0 and ack.session_present
    again = [_next(s, dec), _next(s, dec)]
    assert sorted(p.payload for p in again) == [b"one", b"two"]
    assert all(p.dup and p.qos == 2 for p in again)
    s.close()


def test_zero_length_client_ids_need_a_clean_session_in_v311(mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    s, dec = _raw(port, version=c.V311, client_id="", clean_start=False)
    assert _next(s, dec).reason == 2   # identifier rejected
    s.close()
    s, dec = _raw(port, version=c.V311, client_id="", clean_start=True)
    assert _next(s, dec).reason == 0
    s.close()


def test_a_filter_starting_with_a_wildcard_does_not_match_dollar_topics(mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    from lockmq.client import Producer
    a = Client(port, v5=True, client_id="dollar")
    a.subscribe("#")
    with Producer(mqtt_broker.address, producer_id="dollar-test") as p:
        p.send_sync("plain.topic", b"seen")
    assert mqtt_broker.call(lambda: mqtt_broker.broker.core.queue_end("$devices")) > 0
    m = a.inbox.get(timeout=10)
    assert m.topic == "plain/topic"
    time.sleep(0.3)
    assert a.inbox.empty()   # $devices has records: '#' does not reach them
    a.close()
