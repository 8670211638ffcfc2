"""The broker as a subprocess (``lockmq broker``): SIGKILL mid-stream, restart, nothing
acknowledged lost; SIGTERM shuts down gracefully; the status page answers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Callable

from lockmq.broker.lane import LANE_TYPE
from lockmq.protocol import Op, Publish, Role, encode_frame
from lockmq.security import Permissions
from lockmq.testing import BrokerProcess, Peer, SecureBroker, open_peer, signal_until_exit

LOCKMQ = os.path.join(os.path.dirname(sys.executable), "lockmq")
#: the sealed locks' topic (a lock's own topics: security.lock_topics)
TOPIC = "lock.events"


def _start(data: str) -> BrokerProcess:
    """``lockmq broker`` with auth off (a restart keeps its port)."""
    return BrokerProcess(data, {"broker": {"auth": "off"}})


def _window(p: Peer, first_seq: int, frame: Callable[[int, int], bytes]) -> dict[int, int]:
    """32 PUBLISH frames (``frame(seq, opaque)``) from ``first_seq`` on, in one write:
    their opaque -> seq."""
    ops = {p.next_opaque(): seq for seq in range(first_seq, first_seq + 32)}
    p.raw(b"".join(frame(seq, op) for op, seq in ops.items()))
    return ops


def _producer(port: int, sn: str, acked: list[int], stop: threading.Event) -> None:
    """Pipelined sends (32 in flight), recording every acknowledged seq."""
    try:
        p = open_peer(port, sn=sn, role=Role.LOCK)
        seq = 0
        while not stop.is_set() and seq < 20_000:
            ops = _window(p, seq, lambda s, op: encode_frame(
                Op.PUBLISH, sn, Publish("ev", s, 0, b"r" * 24).encode(), op))
            seq += 32
            for op, s in ops.items():
                if p.wait(op, timeout=5).opcode == Op.PUBLISH_ACK:
                    acked.append(s)
    except (OSError, ConnectionError, TimeoutError):
        return                                   # the broker was killed


def _drain(cons: Peer, topic: str) -> list[str]:
    """Every message id the ``backend`` cluster gets on ``topic`` until two pulls come
    back empty (each batch acked); the peer is closed after."""
    sub = cons.subscribe(topic, "backend").sub_id
    ids: list[str] = []
    empty = 0
    while empty < 2:
        got = cons.pull(sub, 500, wait_ms=300).messages
        empty = 0 if got else empty + 1
        if got:
            cons.ack(sub, [m.lease for m in got])
            ids.extend(m.message_id for m in got)
    cons.close()
    return ids


def _assert_none_lost(acked: dict[str, list[int]], seen: set[str]) -> None:
    missing = [f"{sn}:{s}" for sn, lst in acked.items() for s in lst if f"{sn}:{s}" not in seen]
    assert not missing, f"{len(missing)} acknowledged records lost: {missing[:5]}"


def test_sigkill_mid_stream_loses_no_acknowledged_message(tmp_path):
    proc = _start(str(tmp_path / "data"))
    port = proc.port
    stop = threading.Event()
    acked: dict[str, list[int]] = {f"LOCK-{i}": [] for i in range(3)}
    threads = [threading.Thread(target=_producer, args=(port, sn, lst, stop))
               for sn, lst in acked.items()]
    for t in threads:
        t.start()
    consumed_before: set[str] = set()
    try:
        cons = open_peer(port)
        sub = cons.subscribe("ev", "backend").sub_id
        deadline = time.monotonic() + 90             # generous: a shared, loaded machine
        while len(consumed_before) < 1000 and time.monotonic() < deadline:
            got = cons.pull(sub, 100, wait_ms=500).messages
            if got:
                cons.ack(sub, [m.lease for m in got])
                consumed_before.update(m.message_id for m in got)
        held = cons.pull(sub, 50).messages              # leased, never acked
        time.sleep(0.5)                                 # positions saved meanwhile
        while sum(len(v) for v in acked.values()) < 3000 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        proc.kill()                                     # mid-stream
        stop.set()
        for t in threads:
            t.join(15)
    total_acked = sum(len(v) for v in acked.values())
    assert total_acked >= 3000 and len(consumed_before) >= 1000

    proc.start()
    try:
        after = _drain(open_peer(port), "ev")
        _assert_none_lost(acked, consumed_before | set(after))
        redelivered = consumed_before & set(after)
        # a restart redelivers at most the window (the 50 held + what was acked since
        # the last position save), never the backlog already consumed
        assert len(redelivered) <= 50 + 100
        assert {m.message_id for m in held} <= set(after)
        assert len(after) == len(set(after))
    finally:
        assert proc.stop(20) == 0


def test_sigterm_is_graceful_and_status_page_answers(tmp_path):
    proc = _start(str(tmp_path / "data"))
    port, sport = proc.port, proc.status_port
    try:
        p = open_peer(port, sn="LOCK-1", role=Role.LOCK)
        for seq in range(10):
            p.publish("t", seq)
        page = urllib.request.urlopen(f"http://127.0.0.1:{sport}/summary",
                                      timeout=5).read().decode()
        assert "lockmq broker" in page and "locks online 1" in page
        dash = urllib.request.urlopen(f"http://127.0.0.1:{sport}/", timeout=5).read().decode()
        assert dash.startswith("<!doctype html>") and "Locks online" in dash
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{sport}/metrics", timeout=5).read()
        assert b"lockmq_publish_stored_total 10.0" in metrics
    finally:
        rc = proc.stop(20)
    assert rc == 0, proc.log_tail()
    f = p.read_frame()                             # told why, then closed
    assert f is not None and f.opcode == Op.DISCONNECT
    assert p.read_frame() is None
    proc.start()
    try:
        c = open_peer(port)
        assert {t["topic"]: t["queue_end"] for t in c.admin("topics")["topics"]}["t"] == 10
    finally:
        proc.stop(20)


def test_more_sigterms_during_shutdown_still_exit_cleanly(tmp_path):
    """systemd, an orchestrator or an impatient operator may signal again while the
    broker shuts down: that must not turn a clean exit (0) into a death by SIGTERM,
    not even in the last moments after the event loop has closed."""
    proc = _start(str(tmp_path / "data"))
    p = open_peer(proc.port, sn="LOCK-1", role=Role.LOCK)
    p.publish("t", 0)
    assert proc.proc is not None
    assert signal_until_exit(proc.proc) == 0, proc.log_tail()
    p.close()


def test_second_broker_on_the_same_data_dir_fails_clearly(tmp_path):
    data = str(tmp_path / "data")
    proc = _start(data)
    try:
        out = subprocess.run([LOCKMQ, "broker", "--host", "127.0.0.1", "--port",
                              "0", "--status-port", "0", "--data-dir", data,
                              "--auth", "off"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1
        assert "event=broker_failed" in out.stderr and "in use" in out.stderr
    finally:
        proc.stop(20)


def _sealed_producer(port: int, sn: str, key: bytes, acked: list[int], stop: threading.Event,
                     broken: list[str]) -> None:
    """A lock with frame MACs sending pipelined sealed records (32 in flight), each
    answer opened by its session (a wrong tag or counter lands in ``broken``)."""
    try:
        p = Peer(port, sn)
        p.auth_lock(key, mac=True)
        seq = 1
        while not stop.is_set() and seq < 20_000:
            ops = _window(p, seq, lambda s, op: p.session.seal(
                Op.PUBLISH, sn, Publish(TOPIC, s, 0, b"r" * 24).encode(), op))
            seq += 32
            for _ in range(32):
                f = p.read(timeout=5)
                if f is None:
                    return                       # the broker was killed
                p.session.receive(f)             # its tag checked, in order
                if f.opcode == Op.PUBLISH_ACK:
                    acked.append(ops[f.opaque])
    except (OSError, ConnectionError, TimeoutError):
        return                                   # the broker was killed
    except Exception as exc:  # noqa: BLE001 -- a tag or protocol failure: the test's
        broken.append(f"{sn}: {exc!r}")


def test_sigkill_under_sealed_locks_in_the_lane_loses_no_acknowledged_record(tmp_path):
    """Locks that seal their frames (the firmware's default on plain TCP), read and
    acked by the compiled lane: SIGKILL mid-stream, restart, every acked record there
    once. Every ack the locks got carried the right tag and counter."""
    sns = [f"LOCK-M{i}" for i in range(3)]
    secure = SecureBroker(tmp_path, {"security": {"lock_message_rate": 0}}, locks=sns,
                          tokens={"backend": Permissions(consume=("lock.*:backend",))})
    try:
        proc = secure.start()
        stop = threading.Event()
        acked: dict[str, list[int]] = {sn: [] for sn in sns}
        broken: list[str] = []
        threads = [threading.Thread(target=_sealed_producer,
                                    args=(proc.port, sn, secure.keys[sn], acked[sn], stop,
                                          broken)) for sn in sns]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 90             # generous: a shared, loaded machine
        try:
            while sum(len(v) for v in acked.values()) < 3000 and time.monotonic() < deadline:
                time.sleep(0.02)
            if LANE_TYPE is not None:   # (pure Python: the same locks on the Python path)
                assert proc.metrics()["lockmq_lane_joins_total"] >= 1
        finally:
            proc.kill()                                 # mid-stream
            stop.set()
            for t in threads:
                t.join(15)
        assert not broken, broken
        assert sum(len(v) for v in acked.values()) >= 3000
        proc.start()
        cons = Peer(proc.port, "")
        cons.auth_token(secure.tok["backend"])
        stored = _drain(cons, TOPIC)
        _assert_none_lost(acked, set(stored))
        assert len(stored) == len(set(stored))
    finally:
        secure.close()
