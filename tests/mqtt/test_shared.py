"""``$share/<cluster>/<filter>``: MQTT clients (paho v3.1.1 and v5, mosquitto_sub)
join a lockmq consumer cluster beside a lockmq-client member; members join, leave
and are killed mid-stream, and every record is handled exactly once through the
idempotency helper (a redelivered record is a duplicate there, never lost)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

from lockmq.client import Consumer, Producer
from lockmq.client.idempotency import idempotency_store
from lockmq.testing import wait_for

from .helpers import needs, MOSQUITTO_SUB, Client, LineReader, user_props

N = 400
TOPIC = "door.events"
SHARE = "$share/workers/door/events"

KILLED_MEMBER = textwrap.dedent("""
    import sys, time
    import paho.mqtt.client as mqtt
    from paho.mqtt.properties import Properties
    from paho.mqtt.packettypes import PacketTypes
    from lockmq.client.idempotency import idempotency_store
    port, db = int(sys.argv[1]), sys.argv[2]
    idem = idempotency_store(db)
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="killed", protocol=mqtt.MQTTv5)
    c.manual_ack_set(True)
    n = [0]
    def on_message(cl, u, m):
        time.sleep(0.01)    # slow: holds leases when it is killed
        idem.once(m.payload.decode(), lambda conn: conn.execute(
            "INSERT INTO effects(id, by) VALUES (?, 'killed')", (m.payload.decode(),)))
        cl.ack(m.mid, m.qos)
        n[0] += 1
        if n[0] == 1:
            print("handling", flush=True)
    c.on_message = on_message
    c.on_connect = lambda cl, u, f, rc, p: cl.subscribe("$share/workers/door/events", 1)
    p = Properties(PacketTypes.CONNECT); p.ReceiveMaximum = 16
    c.connect("127.0.0.1", port, 30, properties=p)
    c.loop_forever()
""")


def _effects_db(path: str):
    idem = idempotency_store(path)
    idem.once("setup", lambda conn: conn.execute(
        "CREATE TABLE IF NOT EXISTS effects (id TEXT PRIMARY KEY, by TEXT)"))
    return idem


def _worker(client: Client, idem, name: str, stop: threading.Event) -> threading.Thread:
    """Handle ``client``'s messages: the effect and its mark in one transaction, then
    the PUBACK (a crash in between redelivers; the mark makes it a duplicate)."""
    def run() -> None:
        while not stop.is_set():
            try:
                m = client.inbox.get(timeout=0.1)
            except Exception:  # noqa: BLE001 -- queue.Empty
                continue
            rid = m.payload.decode()
            idem.once(rid, lambda conn: conn.execute(
                "INSERT INTO effects(id, by) VALUES (?, ?)", (rid, name)))
            client.ack(m)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def test_mqtt_and_lockmq_members_share_a_cluster_exactly_once(mqtt_broker, tmp_path):
    port = mqtt_broker.broker.mqtt.port
    db = str(tmp_path / "effects.db")
    idem = _effects_db(db)
    stop = threading.Event()
    done = lambda: idem.count() - 1 >= N   # noqa: E731 -- minus the "setup" mark

    def lockmq_handler(msg):
        rid = msg.payload.decode()
        idem.once(rid, lambda conn: conn.execute(
            "INSERT INTO effects(id, by) VALUES (?, 'lockmq')", (rid,)))

    v5 = Client(port, v5=True, client_id="member-v5", manual_ack=True)
    assert v5.wait_connack()[1] == 0
    assert [int(r.value) if hasattr(r, "value") else r for r in v5.subscribe(SHARE)] == [1]
    _worker(v5, idem, "v5", stop)
    lm = Consumer(mqtt_broker.address, topic=TOPIC, cluster="workers", handler=lockmq_handler)
    lm.start()
    killed = subprocess.Popen([sys.executable, "-c", KILLED_MEMBER, str(port), db],
                              stdout=subprocess.PIPE, text=True)
    sub = subprocess.Popen([needs(MOSQUITTO_SUB), "-p", str(port), "-V", "mqttv311", "-q", "1",
                            "-i", "member-mosq", "-t", SHARE],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = LineReader(sub)
    killed_out = LineReader(killed)

    def members() -> int:
        c = mqtt_broker.call(lambda: mqtt_broker.broker.core.clusters.get("workers"))
        return len(c.members) if c is not None else 0

    wait_for(lambda: members() == 4, "four members in the cluster")
    prod = Producer(mqtt_broker.address, producer_id="shared-test")
    v311 = None
    try:
        def send(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                prod.send_async(TOPIC, b"r%05d" % i)

        send(0, 100)
        killed_out.wait(1, "lines from the member to kill")
        assert killed_out.lines[0] == "handling"
        v311 = Client(port, v5=False, client_id="member-v311", manual_ack=True)   # joins
        assert v311.subscribe(SHARE)[0] == 1
        wait_for(lambda: members() == 5, "the v3.1.1 member joined")
        _worker(v311, idem, "v311", stop)
        send(100, 250)
        killed.send_signal(signal.SIGKILL)     # killed holding leases: they go to the others
        killed.wait(10)
        send(250, 320)
        v311.close()                           # leaves mid-stream
        send(320, N)

        # mosquitto_sub acks as it prints: its lines are handled here, in order
        def drain_mosq() -> None:
            handled = 0
            while not stop.is_set():
                while handled < len(lines.lines):
                    rid = lines.lines[handled]
                    idem.once(rid, lambda conn: conn.execute(
                        "INSERT INTO effects(id, by) VALUES (?, 'mosquitto_sub')", (rid,)))
                    handled += 1
                time.sleep(0.02)
        threading.Thread(target=drain_mosq, daemon=True).start()
        wait_for(done, f"{N} records handled", timeout=60)
    finally:
        stop.set()
        prod.close()
        lm.stop()
        v5.close()
        if killed.poll() is None:
            killed.kill()
        sub.terminate()
        sub.wait(10)
    ids = [r[0] for r in idem.once("read", lambda conn: conn.execute(
        "SELECT id FROM effects").fetchall())[1]]
    assert sorted(ids) == ["r%05d" % i for i in range(N)]   # each once, none lost
    by = dict(idem.once("read2", lambda conn: conn.execute(
        "SELECT by, count(*) FROM effects GROUP BY by").fetchall())[1])
    assert by.get("killed", 0) >= 1 and sum(by.values()) == N
    assert len(by) >= 3, by   # the work was shared


def test_a_plain_subscription_is_a_private_cluster_with_the_record_id(mqtt_broker):
    port = mqtt_broker.broker.mqtt.port
    a = Client(port, v5=True, client_id="a")
    b = Client(port, v5=False, client_id="b")
    try:
        a.subscribe("door/#")
        b.subscribe("door/events")
        with Producer(mqtt_broker.address, producer_id="plain-test") as prod:
            for i in range(5):
                prod.send_sync(TOPIC, b"p%d" % i)
        got_a = [a.inbox.get(timeout=10) for _ in range(5)]
        got_b = [b.inbox.get(timeout=10) for _ in range(5)]
        # each private cluster gets every record, in order
        assert [m.payload for m in got_a] == [m.payload for m in got_b] == \
            [b"p%d" % i for i in range(5)]
        assert got_a[0].topic == "door/events"
        assert user_props(got_a[3])["msg_id"] == "plain-test:3"
    finally:
        a.close()
        b.close()


def test_an_mqtt5_member_can_ask_for_per_lock_order(mqtt_broker):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    port = mqtt_broker.broker.mqtt.port
    members = [Client(port, v5=True, client_id=f"ord-{i}", manual_ack=True) for i in range(2)]
    try:
        props = Properties(PacketTypes.SUBSCRIBE)
        props.UserProperty = ("ordered", "true")
        for m in members:
            m.c.subscribe("$share/ordered/door/events", 1, properties=props)
            m.subacks.get(timeout=10)
        cl = mqtt_broker.call(lambda: mqtt_broker.broker.core.clusters["ordered"])
        assert cl.ordered
        prods = [Producer(mqtt_broker.address, producer_id=f"LOCK-{k}") for k in range(3)]
        for i in range(10):
            for p in prods:
                p.send_async(TOPIC, b"%d" % i)
        seen: dict[str, list[int]] = {}
        got = 0
        deadline = time.monotonic() + 30
        while got < 30:   # ack in arrival order, alternating members
            assert time.monotonic() < deadline, f"{got} of 30 delivered: {seen}"
            for m in members:
                try:
                    msg = m.inbox.get(timeout=0.05)
                except Exception:  # noqa: BLE001 -- queue.Empty
                    continue
                sn = user_props(msg)["sn"]
                seen.setdefault(sn, []).append(int(msg.payload))
                m.ack(msg)
                got += 1
        assert all(v == list(range(10)) for v in seen.values()) and len(seen) == 3
        for p in prods:
            p.close()
    finally:
        for m in members:
            m.close()
