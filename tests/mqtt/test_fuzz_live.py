"""Random packet sequences from many clients against a live listener: each client
gets answers or a clean DISCONNECT, never an internal error, and the broker keeps
serving everyone else."""

from __future__ import annotations

import random
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockmq.mqtt import codec as c

from .test_codec import packets

#: topics and filters a client might send, valid or not
NAMES = st.sampled_from(["door/events", "door/+", "#", "+/x", "$devices", "lockmq/command/L1/unlock",
                         "lockmq/result/x", "lockmq/devices/+", "$share/g/door/events",
                         "$share//x", "a//b", "bad topic", "", "door/#/x", "lockmq/x"])


@st.composite
def sessions(draw):
    version = draw(st.sampled_from([c.V311, c.V5]))
    pkts = draw(st.lists(packets(version), max_size=8))
    for p in pkts:   # steer names towards the interesting ones
        if isinstance(p, c.Publish) and draw(st.booleans()):
            p.topic = draw(NAMES)
        if isinstance(p, c.Subscribe):
            for s in p.subscriptions:
                if draw(st.booleans()):
                    s.filter = draw(NAMES)
    first = c.Connect(draw(st.sampled_from(["", "fz", "fz.2"])), version,
                      draw(st.booleans()), draw(st.integers(0, 5)))
    return version, [first, *pkts]


@pytest.mark.slow  # 60 random sessions (~15 s); tests/mqtt's other files run real peers by default
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(sessions())
def test_random_sessions_get_answers_or_a_clean_disconnect(mqtt_broker, case):
    version, pkts = case
    port = mqtt_broker.broker.mqtt.port
    s = socket.create_connection(("127.0.0.1", port), 5)
    s.settimeout(2)
    try:
        s.sendall(b"".join(p.encode(version) for p in pkts))
        dec = c.Decoder(1 << 22, version)
        while True:
            try:
                data = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not data:
                break
            dec.feed(data)
            while (p := dec.next_packet()) is not None:
                assert not (isinstance(p, c.Disconnect) and p.reason == 0x83), p
    finally:
        s.close()
    assert mqtt_broker.broker.stats.c.get("mqtt_internal_errors", 0) == 0
