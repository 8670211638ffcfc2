"""Automatic failover with a fence, over real processes (docs/operators.md, "Standby
gateway"): a sync primary with ``fence_after_s`` and a standby with
``promote_after_s``. The primary is SIGKILLed, SIGSTOPped and later resumed, or cut
off from its standby by the network; the standby promotes itself; no acknowledged record is lost, and the old primary, once
it runs again, acks nothing (fenced): never two primaries accepting writes."""

from __future__ import annotations

import re
import signal
import threading
import urllib.request

import pytest

from lockmq.protocol import Op, Publish, Role, encode_frame
from lockmq.testing import BrokerProcess, free_port, open_peer, wait_for
from tests.campus.test_standby import _drain, _producer, _status

FENCE_S = 1.0
PROMOTE_S = 3.5   # >= FENCE_S + FENCE_MARGIN_S (2 s)


def _pair(tmp):
    primary = BrokerProcess(str(tmp / "p" / "data"), {
        "broker": {"auth": "off"},
        "replication": {"sync": True, "fence_after_s": FENCE_S}})
    standby = BrokerProcess(str(tmp / "s" / "data"), {
        "broker": {"auth": "off", "port": free_port()},
        "replication": {"role": "standby", "primary": primary.address,
                        "promote_after_s": PROMOTE_S, "fetch_wait_ms": 200}}, start=False)
    standby.start(ready=r"standby_following")
    return primary, standby


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(lockmq_replication_\w+) (\S+)$", text, re.M)}


def _load(primary: BrokerProcess, n_acks: int):
    stop = threading.Event()
    acked: dict[str, list[int]] = {f"LOCK-{i}": [] for i in (1, 2)}
    threads = [threading.Thread(target=_producer, args=(primary.port, sn, lst, stop))
               for sn, lst in acked.items()]
    for t in threads:
        t.start()
    wait_for(lambda: sum(map(len, acked.values())) >= n_acks, f"{n_acks} acks", timeout=60)
    return stop, threads, acked


def _nothing_lost(standby: BrokerProcess, acked: dict[str, list[int]]) -> None:
    have = set(_drain(standby.port, "audit"))
    lost = [f"{sn}:{s}" for sn, lst in acked.items() for s in lst if f"{sn}:{s}" not in have]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:5]}"


def test_the_standby_is_watched_and_promotes_itself_when_the_primary_is_killed(tmp_path):
    primary, standby = _pair(tmp_path)
    try:
        wait_for(lambda: _status(primary.port)["in_sync"], "the standby in sync")
        # both sides can be watched: the standby has a page of its own while it follows
        wait_for(lambda: _metrics(standby.status_port).get(
            "lockmq_replication_auto_promote_safe") == 1, "the standby knows it is safe")
        m = _metrics(standby.status_port)
        assert m["lockmq_replication_primary"] == 0 and m["lockmq_replication_was_in_sync"] == 1
        assert m["lockmq_replication_primary_fence_seconds"] == FENCE_S
        p = _metrics(primary.status_port)
        assert p["lockmq_replication_primary"] == 1 and p["lockmq_replication_in_sync"] == 1
        assert p["lockmq_replication_standby_connected"] == 1 and p["lockmq_replication_fenced"] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{standby.status_port}/", timeout=10) as r:
            assert "promotes itself after 3.5 s" in r.read().decode()

        stop, threads, acked = _load(primary, 800)
        primary.kill()
        stop.set()
        for t in threads:
            t.join(15)
        standby.wait_log(r"standby_promoted.*unreachable", timeout=30)
        standby.wait_log(r"broker_started", timeout=30)
        _nothing_lost(standby, acked)
    finally:
        primary.kill()
        standby.stop()


@pytest.mark.slow  # the default tier's failover: the standby promotes itself when the primary is killed
def test_a_stopped_primary_that_comes_back_is_fenced_and_acks_nothing(tmp_path):
    primary, standby = _pair(tmp_path)
    try:
        wait_for(lambda: _status(primary.port)["in_sync"], "the standby in sync")
        stop, threads, acked = _load(primary, 600)
        primary.proc.send_signal(signal.SIGSTOP)   # hung, not dead: the split-brain case
        stop.set()
        standby.wait_log(r"standby_promoted.*unreachable", timeout=30)
        standby.wait_log(r"broker_started", timeout=30)
        primary.proc.send_signal(signal.SIGCONT)   # it runs again, still thinks it leads
        for t in threads:
            t.join(30)
        # a lock that still talks to the old primary gets no ack from it
        lock = open_peer(primary.port, sn="LOCK-9", role=Role.LOCK)
        try:
            op = lock.next_opaque()
            lock.raw(encode_frame(
                Op.PUBLISH, "LOCK-9", Publish("ev", 0, 0, b"late").encode(), op))
            answer = lock.wait(op, timeout=15)
            assert answer.opcode != Op.PUBLISH_ACK, "the old primary acked a write"
        finally:
            lock.close()
        primary.wait_log(r"replication_fenced")
        assert _metrics(primary.status_port)["lockmq_replication_fenced"] == 1
        # the promoted standby takes writes, and has everything the old primary acked
        newp = open_peer(standby.port, sn="LOCK-9", role=Role.LOCK)
        newp.publish("ev", 0, b"on the new primary")
        newp.close()
        _nothing_lost(standby, acked)
    finally:
        if primary.running():
            primary.proc.send_signal(signal.SIGCONT)
        primary.kill()
        standby.stop()


@pytest.mark.slow  # as above
def test_a_network_cut_between_the_pair_fences_the_primary_before_the_standby_serves(tmp_path):
    """The split-brain case: the locks still reach the primary, the standby does not.
    The standby promotes itself; the primary, cut off from it, was fenced first: it
    acks nothing the standby does not have."""
    from lockmq.testing.relay import CuttableRelay

    primary = BrokerProcess(str(tmp_path / "p" / "data"), {
        "broker": {"auth": "off"},
        "replication": {"sync": True, "fence_after_s": FENCE_S}})
    link = CuttableRelay(primary.port)
    standby = BrokerProcess(str(tmp_path / "s" / "data"), {
        "broker": {"auth": "off", "port": free_port()},
        "replication": {"role": "standby", "primary": link.address,
                        "promote_after_s": PROMOTE_S, "fetch_wait_ms": 200}}, start=False)
    standby.start(ready=r"standby_following")
    try:
        wait_for(lambda: _status(primary.port)["in_sync"], "the standby in sync")
        stop, threads, acked = _load(primary, 600)
        link.cut()
        standby.wait_log(r"standby_promoted.*unreachable", timeout=40)
        standby.wait_log(r"broker_started", timeout=30)
        primary.wait_log(r"replication_fenced")
        stop.set()
        for t in threads:
            t.join(30)
        assert primary.running()   # alive and reachable by the locks, but fenced
        lock = open_peer(primary.port, sn="LOCK-8", role=Role.LOCK)
        try:
            op = lock.next_opaque()
            lock.raw(encode_frame(Op.PUBLISH, "LOCK-8", Publish("ev", 0, 0, b"cut").encode(), op))
            assert lock.wait(op, timeout=15).opcode != Op.PUBLISH_ACK
        finally:
            lock.close()
        _nothing_lost(standby, acked)
    finally:
        link.close()
        primary.kill()
        standby.stop()
