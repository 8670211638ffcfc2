"""The MQTT codec: every packet round-trips in both versions, in any chunking; bad
bytes are an MqttError with a reason code, never another exception or a hang."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockmq.mqtt import codec as c

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=20)
blob = st.binary(max_size=40)
pid = st.integers(1, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)


def props_for(version):
    if version == c.V311:
        return st.just({})
    return st.fixed_dictionaries({}, optional={
        "session_expiry": u32, "receive_maximum": st.integers(1, 0xFFFF),
        "user_property": st.lists(st.tuples(text, text), min_size=1, max_size=3),
        "reason_string": text, "correlation_data": blob, "response_topic": text,
        "content_type": text, "message_expiry": u32,
        "subscription_id": st.lists(st.integers(1, 268_435_455), min_size=1, max_size=2),
    })


@st.composite
def packets(draw, version):
    props = props_for(version)
    kind = draw(st.sampled_from(["connect", "connack", "publish", "ack", "subscribe",
                                 "suback", "unsubscribe", "unsuback", "ping", "disconnect"]))
    v5 = version == c.V5
    if kind == "connect":
        will = draw(st.none() | st.builds(c.Will, text, blob, st.integers(0, 2), st.booleans(),
                                          props))
        user = draw(st.none() | text)
        pw = draw(st.none() | blob) if (user is not None or v5) else None
        return c.Connect(draw(text), version, draw(st.booleans()),
                         draw(st.integers(0, 0xFFFF)), user, pw, will, draw(props))
    if kind == "connack":
        return c.ConnAck(draw(st.integers(0, 5)) if not v5 else draw(st.integers(0, 255)),
                         draw(st.booleans()), draw(props))
    if kind == "publish":
        qos = draw(st.integers(0, 2))
        return c.Publish(draw(text), draw(blob), qos, draw(st.booleans()),
                         draw(st.booleans()) if qos else False, draw(pid) if qos else 0,
                         draw(props))
    if kind == "ack":
        ptype = draw(st.sampled_from([c.PUBACK, c.PUBREC, c.PUBREL, c.PUBCOMP]))
        if not v5:
            return c.Ack(ptype, draw(pid))
        reason = draw(st.integers(0, 255))
        return c.Ack(ptype, draw(pid), reason, draw(props) if reason else {})
    if kind == "subscribe":
        subs = draw(st.lists(st.builds(
            c.Subscription, text, st.integers(0, 2),
            st.booleans() if v5 else st.just(False), st.booleans() if v5 else st.just(False),
            st.integers(0, 2) if v5 else st.just(0)), min_size=1, max_size=3))
        return c.Subscribe(draw(pid), subs, draw(props))
    if kind == "suback":
        return c.SubAck(draw(pid), draw(st.lists(st.sampled_from([0, 1, 2, 0x80]), min_size=1)),
                        draw(props))
    if kind == "unsubscribe":
        return c.Unsubscribe(draw(pid), draw(st.lists(text, min_size=1, max_size=3)), draw(props))
    if kind == "unsuback":
        return c.UnsubAck(draw(pid), draw(st.lists(st.sampled_from([0, 0x11, 0x87]), max_size=3))
                          if v5 else [], draw(props))
    if kind == "ping":
        return c.Ping(draw(st.sampled_from([c.PINGREQ, c.PINGRESP])))
    reason = draw(st.integers(0, 255)) if v5 else 0
    return c.Disconnect(reason, draw(props) if reason else {})


def decode_all(data: bytes, version: int, chunks: list[int]) -> list:
    dec = c.Decoder(1 << 20, version)
    out, i = [], 0
    for n in chunks + [len(data)]:
        dec.feed(data[i:i + n])
        i += n
        while (p := dec.next_packet()) is not None:
            out.append(p)
    assert dec.buffered == 0
    return out


@pytest.mark.parametrize("version", [c.V311, c.V5])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_every_packet_round_trips_in_any_chunking(version, data):
    pkts = data.draw(st.lists(packets(version), min_size=1, max_size=4))
    wire = b"".join(p.encode(version) for p in pkts)
    chunks = data.draw(st.lists(st.integers(1, 7), max_size=20))
    assert decode_all(wire, version, chunks) == pkts


@pytest.mark.parametrize("version", [c.V311, c.V5])
@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=64))
def test_hostile_bytes_raise_mqtt_errors_only(version, garbage):
    dec = c.Decoder(4096, version)
    dec.feed(garbage)
    try:
        while dec.next_packet() is not None:
            pass
    except c.MqttError as exc:
        assert 0x80 <= exc.reason <= 0xA2


def test_an_oversized_packet_is_refused_from_its_header():
    dec = c.Decoder(1000)
    dec.feed(bytes((0x30,)) + bytes((0xFF, 0xFF, 0xFF, 0x7F)))   # 268 MB announced
    with pytest.raises(c.PacketTooLarge) as err:
        dec.next_packet()
    assert err.value.reason == 0x95


def test_a_connect_of_another_protocol_version_is_named():
    wire = c.Connect("x", c.V5).encode()
    wire = wire.replace(b"MQTT\x05", b"MQTT\x03")
    dec = c.Decoder()
    dec.feed(wire)
    with pytest.raises(c.MqttError) as err:
        dec.next_packet()
    assert err.value.reason == 0x84


def test_reserved_flags_and_qos3_are_malformed():
    for raw in (bytes((0x82, 5, 0, 1, 0, 1, 0x61)),       # SUBSCRIBE with flags 2: ok shape,
                bytes((0x36, 3, 0, 1, 0x61)),              # PUBLISH QoS 3
                bytes((0xC1, 0))):                         # PINGREQ with flags 1
        dec = c.Decoder(version=c.V311)
        dec.feed(raw)
        with pytest.raises(c.MqttError):
            dec.next_packet()


@pytest.mark.parametrize("version", [c.V311, c.V5])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_the_delivery_paths_publish_bytes_equal_the_packets(version, data):
    qos = data.draw(st.integers(0, 1))
    props = data.draw(props_for(version))
    p = c.Publish(data.draw(text), data.draw(st.binary(max_size=300)), qos, False,
                  data.draw(st.booleans()) if qos else False, data.draw(pid) if qos else 0,
                  props)
    fast = c.publish_bytes(c.encode_str(p.topic), p.payload, p.qos, p.dup, p.packet_id,
                           c.encode_props(props) if version == c.V5 else None)
    assert fast == p.encode(version)
