"""The firmware's broker link against a real-socket broker (tests/firmware/minibroker):
authentication, publish/ack, the offline queue across broker outages and power
cuts, BUSY, failover, exactly-once storage via (sn, seq)."""

from __future__ import annotations

import threading

import pytest

from lockmq.protocol import EventType, Method
from lockmq.testing import Lock
from lockmq.testing.lock import KEY, SN

from .helpers import fast_link
from .minibroker import MiniBroker


@pytest.fixture
def broker():
    b = MiniBroker({SN: KEY}, heartbeat_s=5)
    yield b
    b.close()


def test_boot_connect_publish_ack(flash, broker, lock_factory):
    fast_link(flash, [broker.port])
    lk: Lock = lock_factory(flash)
    lk.expect(r"^I sys boot fw=\S+ sn=LOCK0001 hw=sim$")
    lk.expect(rf"^I net connected broker=127.0.0.1:{broker.port}$")
    lk.send("card 0A1B2C3D")
    lk.send("badcard 77")
    lk.send("event tamper 3")
    for seq in range(1, 6):
        lk.expect(rf"^I evt acked seq={seq}$")
    assert broker.seqs(SN) == [1, 2, 3, 4, 5]
    ev = broker.stored[(SN, 1)]
    assert (ev.event_type, ev.method, ev.credential) == (EventType.UNLOCK, Method.CARD, bytes.fromhex("0A1B2C3D"))
    assert broker.stored[(SN, 2)].event_type == EventType.FAILED_ATTEMPT
    lk.send("status")
    lk.expect(r"^I sys status q=0 next_seq=6 dropped=0 link=up$")


def test_offline_queue_then_delivery_in_order(flash, lock_factory):
    b = MiniBroker({SN: KEY})
    port = b.port
    b.stop()                                   # broker down while events happen
    try:
        fast_link(flash, [port])
        lk = lock_factory(flash)
        lk.expect(r"^I sys ready$")
        lk.send("event unlock 20")
        lk.expect(r"^I evt queued seq=20 type=unlock$")
        lk.expect(r"^W net down err=refused")
        lk.kill()                              # and a power cut on top
        lk.start()
        lk.expect(r"^I q loaded len=20 next_seq=21 ")
        lk.expect(r"^W sys seq provisional next_seq=21$")      # a fresh board: not yet confirmed
        b.port = port
        b.start()
        lk.expect(r"^I sys seq confirmed next_seq=21$", timeout=20)
        lk.expect(r"^I evt acked seq=20$", timeout=20)
        assert b.seqs(SN) == list(range(1, 21))
        lk.kill()
        lk.start()
        lk.expect(r"^I q loaded len=0 next_seq=85 ")          # 21..84 reserved: skipped
        lk.send("event unlock")
        lk.expect(r"^I evt queued seq=85 type=unlock$")
        lk.expect(r"^I evt acked seq=85$")
    finally:
        b.close()


def test_broker_restart_mid_stream_nothing_lost_nothing_twice(flash, lock_factory):
    b = MiniBroker({SN: KEY})
    try:
        fast_link(flash, [b.port])
        lk = lock_factory(flash)
        lk.expect(r"^I net connected")
        lk.send("event unlock 200")
        lk.expect(r"^I evt acked seq=40$")
        b.stop()
        lk.expect(r"^W net down")
        b.start()
        lk.expect(r"^I net connected")
        assert b.wait_for(lambda: len(b.seqs(SN)) == 200, 30), lk.log()
        assert b.seqs(SN) == list(range(1, 201))
        lk.expect(r"^I evt acked seq=200$", timeout=20)
    finally:
        b.close()


def test_power_cut_mid_stream_exactly_once(flash, broker, lock_factory):
    fast_link(flash, [broker.port])
    lk = lock_factory(flash)
    lk.expect(r"^I net connected")
    lk.send("event failed_attempt 150")
    lk.expect(r"^I evt acked seq=30$")
    lk.kill()                                  # mid-stream: acks in flight are lost, records not
    queued = [int(m.group(1)) for m in lk.grep(r"^I evt queued seq=(\d+) ")]
    assert queued == list(range(1, len(queued) + 1)) and len(queued) >= 30
    lk.start()
    lk.expect(r"^I sys ready")
    lk.expect(r"^I net connected")
    assert broker.wait_for(lambda: len(broker.seqs(SN)) >= len(queued), 30), lk.log()
    lk.wait_drained()
    got = broker.seqs(SN)                       # every queued record stored once, in order;
    assert got in (queued, queued + [len(queued) + 1])   # + the one cut before its log line


def test_busy_is_retried_after_the_delay(flash, broker, lock_factory):
    fast_link(flash, [broker.port])
    broker.busy_next = 3
    lk = lock_factory(flash)
    lk.expect(r"^I net connected")
    lk.send("event tamper")
    lk.expect(r"^W evt busy retry_ms=300 seq=1 code=20$")
    lk.expect(r"^I evt acked seq=1$")
    assert broker.seqs(SN) == [1] and broker.publishes == 4


def test_wrong_key_is_refused_and_backs_off(flash, broker, lock_factory):
    fast_link(flash, [broker.port], key="ff" * 32)
    lk = lock_factory(flash)
    lk.expect(r"^E net auth failed")
    lk.expect(r"^W net down err=auth")
    delays = [int(lk.expect(r"^I net backoff ms=(\d+) attempt=\d+$").group(1)) for _ in range(4)]
    assert all(100 <= d <= 800 for d in delays)
    assert broker.auth_failures >= 2 and broker.sessions == 0


def test_failover_to_the_next_broker(flash, broker, lock_factory):
    dead = MiniBroker({SN: KEY})
    dead_port = dead.port
    dead.close()
    fast_link(flash, [dead_port, broker.port])
    lk = lock_factory(flash)
    lk.expect(rf"^W net down err=refused broker=127.0.0.1:{dead_port}$")
    lk.expect(rf"^I net connected broker=127.0.0.1:{broker.port}$")
    lk.send("event low_battery")
    lk.expect(r"^I evt acked seq=1$")


def test_heartbeat_reports_queue_and_heap(flash, lock_factory):
    b = MiniBroker({SN: KEY}, heartbeat_s=5)
    try:
        fast_link(flash, [b.port], heartbeat_s=5)
        lk = lock_factory(flash)
        lk.expect(r"^I net connected")
        lk.send("event unlock 300")                 # more than the queue holds at once
        lk.expect(r"^I evt acked seq=300$", timeout=60)
        m = lk.expect(r"^I mem peak=(\d+) alloc=\d+ free=\d+$", timeout=12)
        assert int(m.group(1)) < 120 * 1024        # live heap, within -X heapsize=128K
        assert b.wait_for(lambda: b.heartbeats) and b.heartbeats[0].free_heap > 0
        assert b.seqs(SN) == list(range(1, 301)) and not lk.grep(r"evt dropped")
    finally:
        b.close()


def test_reflashed_board_never_reuses_a_stored_seq(flash, broker, lock_factory):
    """A board flashed with a fresh file system forgets its sequence numbers; the
    broker still has 1..40 from it. Events queued before the first connect are
    renumbered above 40, so none is mistaken for a retransmission and dropped."""
    fast_link(flash, [broker.port])
    lk = lock_factory(flash)
    lk.expect(r"^I net connected")
    lk.send("event unlock 40")
    lk.expect(r"^I evt acked seq=40$", timeout=30)
    lk.kill()
    for f in ("queue.dat", "seq.dat", "seq.dat.bak", "cmd.dat"):
        (flash / f).unlink(missing_ok=True)                  # the reflash
    broker.stop()
    lk.start()
    lk.send("event tamper 3")
    lk.expect(r"^I evt queued seq=3 type=tamper$")           # provisional numbers
    broker.start()
    lk.expect(r"^W sys seq renumbered from=1 to=41 n=3$", timeout=20)
    lk.expect(r"^I evt acked seq=43$", timeout=20)
    assert broker.seqs(SN) == list(range(1, 44))
    assert [broker.stored[(SN, s)].event_type for s in (41, 42, 43)] == [4, 4, 4]


def test_tls_with_the_ca_verified(flash, lock_factory, tmp_path, needs_tls):
    """TLS as the lock does it: MicroPython's ssl with the CA given as DER, the server
    name checked. A broker whose certificate another CA signed is refused."""
    trustme = pytest.importorskip("trustme")
    import ssl

    ca = trustme.CA()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("broker.lock.test").configure_cert(ctx)
    b = MiniBroker({SN: KEY}, ssl_context=ctx)
    try:
        (flash / "ca.der").write_bytes(ssl.PEM_cert_to_DER_cert(ca.cert_pem.bytes().decode()))
        fast_link(flash, [b.port], tls={"enabled": True, "ca": "ca.der", "server_hostname": "broker.lock.test"})
        lk = lock_factory(flash)
        lk.expect(rf"^I net connected broker=127.0.0.1:{b.port}$", timeout=30)
        lk.send("event tamper")
        lk.expect(r"^I evt acked seq=1$")
        lk.kill()
        other = trustme.CA()
        (flash / "ca.der").write_bytes(ssl.PEM_cert_to_DER_cert(other.cert_pem.bytes().decode()))
        lk.start()
        lk.expect(r"^W net down err=\S+ broker=", timeout=30)
        lk.send("event tamper")
        lk.expect(r"^I evt queued seq=")
        lk.send("status")
        lk.expect(r"^I sys status q=1 .* link=down$")
        # the right CA but another name: refused too
        lk.kill()
        (flash / "ca.der").write_bytes(ssl.PEM_cert_to_DER_cert(ca.cert_pem.bytes().decode()))
        fast_link(flash, [b.port], tls={"enabled": True, "ca": "ca.der", "server_hostname": "evil.lock.test"})
        lk.start()
        lk.expect(r"^W net down err=\S+ broker=", timeout=30)
        assert b.sessions == 1
    finally:
        b.close()


def test_order_kept_when_the_broker_pushes_back(flash, broker, lock_factory):
    """BUSY on some publishes must not let later records overtake them (window 1)."""
    fast_link(flash, [broker.port])
    broker.busy_retry_ms = 50
    lk = lock_factory(flash)
    lk.expect(r"^I net connected")
    for _ in range(3):
        broker.busy_next += 2
        lk.send("event unlock 10")
        lk.wait_drained()
    assert broker.seqs(SN) == list(range(1, 31))       # stored in sequence order
    assert len(lk.grep(r"^W evt busy ")) == 6


def test_unknown_opcode_is_skipped_garbage_ends_the_session(flash, broker, lock_factory):
    from lockmq.protocol import encode_frame

    fast_link(flash, [broker.port])
    lk = lock_factory(flash)
    lk.expect(r"^I net connected")
    broker.send_raw(SN, encode_frame(0x7777, SN, b"from a newer broker", 5))
    lk.send("event tamper")
    lk.expect(r"^I evt acked seq=1$")               # same session: the frame was skipped
    assert broker.sessions == 1
    broker.send_raw(SN, b"\x09garbage-not-a-frame")
    lk.expect(r"^W net down err=protocol2 ")          # unsupported version byte
    lk.expect(r"^I net connected")
    assert broker.wait_for(lambda: broker.sessions == 2, timeout=5)


def test_a_silent_broker_times_out_and_the_lock_moves_on(flash, broker, lock_factory):
    """A broker that accepts the TCP connection and then says nothing (hung process,
    half-open proxy) must not hang the lock: every read has a deadline, and the
    link reports "timeout" (as it does for EAGAIN/ETIMEDOUT socket errors)."""
    import socket

    hung = socket.create_server(("127.0.0.1", 0))
    held = []
    stop = threading.Event()

    def accept() -> None:
        hung.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(hung.accept()[0])       # accept, never answer
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        fast_link(flash, [hung.getsockname()[1], broker.port], io_timeout_ms=1000)
        lk = lock_factory(flash)
        lk.expect(rf"^W net down err=timeout broker=127.0.0.1:{hung.getsockname()[1]}$", timeout=15)
        lk.expect(rf"^I net connected broker=127.0.0.1:{broker.port}$", timeout=15)
        lk.send("event tamper")
        lk.expect(r"^I evt acked seq=1$")
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        hung.close()


def test_queued_events_go_out_behind_auth_only_when_their_seq_is_trusted(flash, lock_factory):
    """SPEC 2, "Pipelined requests": a lock reconnecting with events queued sends the
    first ones in its AUTH's write (the broker here holds its CONNECT_ACK until a frame
    comes, so a lock that waited for it would send nothing early); a board with
    provisional numbers waits for the CONNECT_ACK's last_seq instead."""
    b = MiniBroker({SN: KEY})
    port = b.port
    b.hold_connect_ack_s = 1.0
    try:
        fast_link(flash, [port], window=2)
        lk = lock_factory(flash)
        lk.expect(r"^W sys seq provisional next_seq=1$")    # a fresh board
        lk.send("event unlock 3")
        lk.expect(r"^I sys seq confirmed next_seq=4$", timeout=20)
        lk.expect(r"^I evt acked seq=3$", timeout=20)
        assert b.early == []                                # provisional: it waited
        b.stop()
        lk.expect(r"^W net down")
        lk.send("event tamper 3")
        lk.expect(r"^I evt queued seq=6 type=tamper$")
        b.port = port
        b.start()
        lk.expect(r"^I evt acked seq=6$", timeout=20)
        assert b.early == [(SN, 4), (SN, 5)]                # the window, behind AUTH
        assert b.seqs(SN) == list(range(1, 7)) and not b.errors
    finally:
        b.close()
