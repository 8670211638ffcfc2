"""A standby gateway over real processes (issue #16): it follows the primary's log
byte for byte, holds acks in sync mode, is promoted after the primary is SIGKILLed
mid-stream and then serves every acknowledged record, with consumer positions."""

from __future__ import annotations

import filecmp
import os
import threading

from lockmq.store.names import positions_file_name
from lockmq.store.positions import parse_meta
from lockmq.protocol import ErrorCode, Op, Publish, Role, encode_frame
from lockmq.testing import (BrokerProcess, Peer, free_port, open_peer, refusal, run_cli,
                            wait_for)

SEG = 64 * 1024   # small segments: the copy must roll exactly where the primary did


def _primary(tmp, sync: bool = False) -> BrokerProcess:
    return BrokerProcess(str(tmp / "p" / "data"), {
        "broker": {"auth": "off"}, "store": {"segment_bytes": SEG},
        "replication": {"sync": sync, "sync_timeout_s": 3.0}})


def _standby(tmp, primary: BrokerProcess) -> BrokerProcess:
    sb = BrokerProcess(str(tmp / "s" / "data"), {
        "broker": {"auth": "off", "port": free_port()}, "store": {"segment_bytes": SEG},
        "replication": {"role": "standby", "primary": primary.address,
                        "fetch_wait_ms": 200}}, start=False)
    return sb.start(ready=r"standby_following")


def _peer(port: int, token: str | None, role: int = Role.SERVICE, sn: str = "svc") -> Peer:
    """A service peer: auth off, or logged in with ``token``."""
    if token is None:
        return open_peer(port, sn=sn, role=role)
    p = Peer(port, sn)
    p.auth_token(token)
    return p


def _status(port: int, token: str | None = None) -> dict:
    p = _peer(port, token, Role.ADMIN)
    try:
        return p.admin("replica.status")
    finally:
        p.close()


def _producer(port: int, sn: str, acked: list[int], stop: threading.Event,
              first_seq: int = 0, limit: int = 5000) -> None:
    """Pipelined publishes (16 in flight), recording every acknowledged seq."""
    try:
        p = open_peer(port, sn=sn, role=Role.LOCK)
        for start in range(first_seq, first_seq + limit, 16):
            if stop.is_set():
                return
            batch = {p.next_opaque(): s for s in range(start, start + 16)}
            p.raw(b"".join(encode_frame(Op.PUBLISH, sn, Publish("ev", s, 0, b"r" * 40).encode(),
                                        op) for op, s in batch.items()))
            acked.extend(s for op, s in batch.items()
                         if p.wait(op, timeout=10).opcode == Op.PUBLISH_ACK)
    except (OSError, ConnectionError, TimeoutError):
        return                                   # the primary was killed


def _saved_position(data_dir, cluster: str, topic: str) -> int:
    """The cluster's last saved position in ``data_dir`` (read-only: the standby
    may be writing the file)."""
    try:
        data = (data_dir / positions_file_name(cluster)).read_bytes()
    except FileNotFoundError:
        return -1
    return parse_meta(data)[1].get(topic, -1)


def _drain(port: int, cluster: str, topic: str = "ev", token: str | None = None) -> list[str]:
    """Every message id the cluster gets from its position on (acked as read)."""
    cons = _peer(port, token)
    try:
        sub = cons.subscribe(topic, cluster).sub_id
        out: list[str] = []
        while True:
            got = cons.pull(sub, 500, wait_ms=300).messages
            if not got:
                return out
            cons.ack(sub, [m.lease for m in got])
            out.extend(m.message_id for m in got)
    finally:
        cons.close()


def test_standby_copies_the_log_byte_for_byte_and_refuses_clients(tmp_path):
    primary = _primary(tmp_path)
    standby = _standby(tmp_path, primary)
    try:
        pub = open_peer(primary.port, sn="LOCK-1", role=Role.LOCK)
        for seq in range(3000):   # ~ 6 segments of 64 KiB
            pub.publish("ev", seq, b"x" * 40)
        end = _status(primary.port)["log_end"]
        wait_for(lambda: _status(primary.port)["acked"] >= end, "the standby caught up")
        # bad fetches get a clear error and cost nothing else
        adm = open_peer(primary.port, role=Role.ADMIN)
        for args in ({"from": -1}, {"from": end + 1}, {"from": 0, "max_bytes": "x"},
                     {"from": 0, "wait_ms": 1.5}):
            r = adm.admin("replica.fetch", **args)
            assert r["ok"] is False and r["error"] == "INVALID_ARGUMENT", (args, r)
        adm.close()
        assert _status(primary.port)["acked"] >= end
        # a standby that follows serves no client: "not the primary", try the next
        no = refusal(lambda: open_peer(standby.port, sn="LOCK-1", role=Role.LOCK))
        assert no.code == ErrorCode.BUSY and "not the primary" in no.err.message
    finally:
        standby.stop()
        primary.stop()
    pseg = tmp_path / "p" / "data" / "message.log"
    sseg = tmp_path / "s" / "data" / "message.log"
    names = sorted(os.listdir(pseg))
    assert len([n for n in names if n.endswith(".log")]) >= 4
    assert sorted(os.listdir(sseg)) == names
    last = [n for n in names if n.endswith(".log")][-1]
    match, mismatch, errors = filecmp.cmpfiles(pseg, sseg, [n for n in names if n != last],
                                               shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
    # the active segment: the primary's shutdown wrote more ($devices) after the
    # standby had stopped; what the standby has is the primary's, byte for byte
    copy = (sseg / last).read_bytes()
    assert int(last[:-4]) + len(copy) >= end
    assert (pseg / last).read_bytes()[:len(copy)] == copy


def test_sync_primary_killed_mid_stream_standby_promoted_loses_nothing(tmp_path):
    primary = _primary(tmp_path, sync=True)
    standby = _standby(tmp_path, primary)
    try:
        wait_for(lambda: _status(primary.port)["in_sync"], "the standby in sync")
        # a consumer cluster reads part of the log first: its position must carry over
        pre = open_peer(primary.port, sn="LOCK-0", role=Role.LOCK)
        for seq in range(200):
            pre.publish("ev", seq, b"y" * 40)
        pre.close()
        cons = open_peer(primary.port)
        sub = cons.subscribe("ev", "backend").sub_id
        first: list[str] = []
        while len(first) < 120:
            got = cons.pull(sub, 120 - len(first), wait_ms=500).messages
            cons.ack(sub, [m.lease for m in got])
            first.extend(m.message_id for m in got)
        cons.close()
        # positions are copied every 200 ms (not with each ack): wait for this one
        wait_for(lambda: _saved_position(tmp_path / "s" / "data", "backend", "ev") >= 120,
                 "the cluster's position on the standby")
        stop = threading.Event()
        acked: dict[str, list[int]] = {f"LOCK-{i}": [] for i in (1, 2, 3)}
        threads = [threading.Thread(target=_producer, args=(primary.port, sn, lst, stop))
                   for sn, lst in acked.items()]
        for t in threads:
            t.start()
        wait_for(lambda: sum(map(len, acked.values())) >= 1500, "1500 acks", timeout=60)
        primary.kill()                            # mid-stream, under load
        stop.set()
        for t in threads:
            t.join(15)
        assert run_cli("standby", "promote", "--data-dir", standby.data_dir) == 0
        standby.wait_log(r"broker_started", timeout=30)
        # the producers fail over and send again what was not acked: dedup drops
        # what the standby already had
        for sn, lst in acked.items():
            p = open_peer(standby.port, sn=sn, role=Role.LOCK)
            top = max(lst) if lst else -1
            for seq in range(max(0, top - 64), top + 33):
                p.publish("ev", seq, b"r" * 40)
            p.close()
        rest = _drain(standby.port, "backend")
    finally:
        primary.kill()
        standby.stop()
    got = first + rest
    assert len(got) == len(set(got)), "a record was delivered twice after dedup"
    have = set(got)
    lost = [f"{sn}:{s}" for sn, lst in acked.items() for s in lst if f"{sn}:{s}" not in have]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:5]}"
    # the cluster's position came along: what it had read is not read again
    assert not set(first) & set(rest)


def test_producer_with_a_broker_list_fails_over_to_the_promoted_standby(tmp_path):
    """``AsyncProducer("primary,standby")`` under load; the primary is SIGKILLed and
    the standby promoted: every send completes, each message is stored once."""
    import asyncio

    from lockmq.client import AsyncProducer

    primary = _primary(tmp_path, sync=True)
    standby = _standby(tmp_path, primary)
    results: list = []
    half = threading.Event()

    async def produce() -> None:
        async with AsyncProducer(f"{primary.address},{standby.address}",
                                 producer_id="svc-1", send_timeout_s=90) as prod:
            prod.backoff.cap_s = 0.5
            futs = []
            for i in range(3000):
                futs.append(prod.send_async("ev", b"m%05d" % i))
                if i % 100 == 99:
                    await asyncio.sleep(0.01)   # a steady stream, not one burst
                if i == 1500:
                    half.set()
            results.extend(await asyncio.gather(*futs, return_exceptions=True))

    try:
        wait_for(lambda: _status(primary.port)["in_sync"], "the standby in sync")
        t = threading.Thread(target=asyncio.run, args=(produce(),))
        t.start()
        half.wait(60)
        primary.kill()
        assert run_cli("standby", "promote", "--data-dir", standby.data_dir) == 0
        standby.wait_log(r"broker_started", timeout=30)
        t.join(120)
        assert not t.is_alive()
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors[:3]
        ids = _drain(standby.port, "audit")
    finally:
        primary.kill()
        standby.stop()
    assert len(ids) == len(set(ids)) == 3000


def test_async_standby_loses_at_most_the_unfetched_tail_and_promotes_itself(tmp_path):
    """Without sync, a primary crash may lose what the standby had not fetched -- but
    only a tail: per producer, the standby holds a gap-free prefix of the acked
    records. ``promote_after_s`` promotes the standby on its own."""
    primary = _primary(tmp_path, sync=False)
    sb = BrokerProcess(str(tmp_path / "s" / "data"), {
        "broker": {"auth": "off", "port": free_port()}, "store": {"segment_bytes": SEG},
        "replication": {"role": "standby", "primary": primary.address,
                        "promote_after_s": 1.0}}, start=False)
    standby = sb.start(ready=r"standby_following")
    try:
        stop = threading.Event()
        acked: dict[str, list[int]] = {f"LOCK-{i}": [] for i in (1, 2)}
        threads = [threading.Thread(target=_producer, args=(primary.port, sn, lst, stop))
                   for sn, lst in acked.items()]
        for t in threads:
            t.start()
        wait_for(lambda: sum(map(len, acked.values())) >= 1000, "1000 acks", timeout=60)
        primary.kill()
        stop.set()
        for t in threads:
            t.join(15)
        standby.wait_log(r"standby_promoted.*unreachable", timeout=30)
        standby.wait_log(r"broker_started", timeout=30)
        have = set(_drain(standby.port, "audit"))
        # promoted for good: a restart with the same config serves, never follows again
        standby.restart(crash=True)
        standby.wait_log(r"standby_already_promoted")
        assert len(set(_drain(standby.port, "audit-2"))) == len(have)
    finally:
        primary.kill()
        standby.stop()
    for sn, lst in acked.items():
        held = [s for s in lst if f"{sn}:{s}" in have]
        assert held == lst[:len(held)], f"{sn}: a hole in the replicated records"


def test_sync_primary_degrades_loudly_when_the_standby_is_gone_and_recovers(tmp_path):
    """A sync primary whose standby died still acks (after ``sync_timeout_s``), with
    a warning and a metric; when the standby is back and caught up, acks wait again."""
    primary = _primary(tmp_path, sync=True)
    standby = _standby(tmp_path, primary)
    try:
        wait_for(lambda: _status(primary.port)["in_sync"], "the standby in sync")
        standby.kill()
        mark = primary.mark()
        pub = open_peer(primary.port, sn="LOCK-1", role=Role.LOCK, timeout=30)
        pub.publish("ev", 1, b"x" * 40)               # acked once replication degraded
        primary.wait_log(r"replication_degraded", start=mark)
        assert not _status(primary.port)["in_sync"]
        assert any("replication_degraded" in k and v >= 1
                   for k, v in primary.metrics().items())
        pub.publish("ev", 2, b"x" * 40)               # async now: acked at once
        standby.start(ready=r"standby_following")
        wait_for(lambda: _status(primary.port)["in_sync"], "back in sync")
        ack = pub.publish("ev", 3, b"x" * 40)
        # sync again: the ack came only once the standby had the record durably
        assert _status(primary.port)["acked"] > ack.offset
    finally:
        standby.stop()
        primary.stop()


def test_standby_authenticates_with_the_replicate_right_and_nothing_more(tmp_path, capsys):
    """With auth required the standby presents a token; ``replicate`` lets it fetch
    the log and refuses every other admin op; a bad token copies nothing."""
    import json
    import shutil

    from lockmq.security import Permissions
    from lockmq.testing import SecureBroker

    sec = SecureBroker(tmp_path / "p", tables={"store": {"segment_bytes": SEG}},
                       locks=["LOCK-1"], tokens={"ops": Permissions(admin=True)})
    capsys.readouterr()
    assert run_cli("tokens", "create", "standby", "--replicate", "--json",
                   "--data-dir", str(sec.data)) == 0
    sec.tok["standby"] = json.loads(capsys.readouterr().out)["token"]
    primary = sec.start()
    standby = bad = None
    try:
        repl = Peer(primary.port, "standby-1")
        repl.auth_token(sec.tok["standby"])
        refused = repl.admin("stats")
        assert refused["ok"] is False and refused["error"] == "FORBIDDEN"
        assert repl.admin("replica.status")["ok"] is True
        repl.close()
        lock = Peer(primary.port, "LOCK-1")
        lock.auth_lock(sec.keys["LOCK-1"])
        for seq in range(50):
            lock.publish("lock.events", seq, b"z" * 40)
        bad = BrokerProcess(str(tmp_path / "bad" / "data"), {
            "broker": {"port": free_port()},
            "replication": {"role": "standby", "primary": primary.address,
                            "token": "lmq_not-a-token"}}, start=False)
        bad.start(ready=r"standby_following")
        bad.wait_log(r"standby_primary_unreachable")
        # the operator copies the master key once (the registry follows by itself)
        (tmp_path / "s" / "data").mkdir(parents=True)
        shutil.copy(sec.data / "master.key", tmp_path / "s" / "data" / "master.key")
        standby = BrokerProcess(str(tmp_path / "s" / "data"), {
            "broker": {"port": free_port()}, "store": {"segment_bytes": SEG},
            "replication": {"role": "standby", "primary": primary.address,
                            "token": sec.tok["standby"]}}, start=False)
        standby.start(ready=r"standby_following")
        ops = Peer(primary.port, "ops")
        ops.auth_token(sec.tok["ops"])
        end = ops.admin("replica.status")["log_end"]
        wait_for(lambda: ops.admin("replica.status")["acked"] >= end, "the standby caught up")
        ops.close()
        lock.close()
        capsys.readouterr()
        assert run_cli("standby", "status", "--broker", primary.address,
                       "--token", sec.tok["ops"]) == 0
        st = json.loads(capsys.readouterr().out)
        assert st["role"] == "primary" and st["acked"] >= end
    finally:
        for b in (standby, bad):
            if b is not None:
                b.stop()
        sec.close()
    assert os.path.getsize(tmp_path / "bad" / "data" / "message.log" /
                           "00000000000000000000.log") == 0


def test_a_lock_fails_over_to_the_promoted_standby_with_nothing_lost(tmp_path):
    """The real firmware (MicroPython unix port) with ``brokers = [primary, standby]``,
    auth required on both: events acked by the sync primary and events queued while
    it is dead all end up on the promoted standby, once each."""
    import shutil

    from lockmq.security import Permissions
    from lockmq.testing import Lock, SecureBroker
    from lockmq.testing.lock import build_flash
    from lockmq.testing.micropython import require_micropython

    require_micropython()
    sn = "LOCKFO01"
    sec = SecureBroker(tmp_path / "p", tables={"replication": {"sync": True}}, locks=[sn],
                       tokens={"standby": Permissions(replicate=True),
                               "audit": Permissions(consume=("lock.*",), admin=True)})
    # the standby gets the master key by hand, the registry from the primary
    (tmp_path / "s" / "data").mkdir(parents=True)
    shutil.copy(sec.data / "master.key", tmp_path / "s" / "data" / "master.key")
    primary = sec.start()
    standby = BrokerProcess(str(tmp_path / "s" / "data"), {
        "broker": {"port": free_port()},
        "replication": {"role": "standby", "primary": primary.address,
                        "token": sec.tok["standby"], "fetch_wait_ms": 200}},
        start=False).start(ready=r"standby_following")
    audit = sec.tok["audit"]
    flash = build_flash(tmp_path / "board", sn=sn, key=sec.keys[sn],
                        brokers=[("127.0.0.1", primary.port), ("127.0.0.1", standby.port)])
    lk = Lock(flash)
    try:
        wait_for(lambda: _status(primary.port, audit)["in_sync"], "the standby in sync")
        lk.expect(rf"net connected broker=127.0.0.1:{primary.port}", timeout=30)
        for _ in range(5):
            lk.send("event unlock 3")
        lk.wait_drained()
        primary.kill()
        for _ in range(5):                       # queued in the lock while it is cut off
            lk.send("event tamper")
        # the standby refuses the lock until it is promoted ("not the primary")
        lk.expect(rf"net down err=error20 broker=127.0.0.1:{standby.port}", timeout=30)
        assert run_cli("standby", "promote", "--data-dir", standby.data_dir) == 0
        lk.expect(rf"net connected broker=127.0.0.1:{standby.port}", timeout=60)
        lk.wait_drained()
        queued = {int(m.group(1)) for m in lk.grep(r"evt queued seq=(\d+)")}
        ids = _drain(standby.port, "audit", topic="lock.events", token=audit)
    finally:
        lk.close()
        standby.stop()
        sec.close()
    assert len(ids) == len(set(ids)), "an event was stored twice"
    seqs = {int(i.split(":")[1]) for i in ids if i.startswith(sn + ":")}
    assert len(queued) >= 10 and queued <= seqs, sorted(queued - seqs)
