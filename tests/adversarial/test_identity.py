"""Identities, reserved names, ownership and caps (issue 10, items 1, 10, 11, 12, 13).

Each test runs a real ``lockmq broker`` process (auth required) on 127.0.0.1, attacks
it over TCP as the review did, and checks three things: the attack is refused with its
error code, the refusal shows in the broker's log and in its metrics (``/metrics`` or
the admin ``stats`` op), and the legitimate path still works -- with the real firmware
(MicroPython unix port) where a lock is involved. Conditions are waited for, never
slept for.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from lockmq.protocol import (Ack, Command, CommandKind, CommandStatus, ErrorCode, Nack, Op,
                             Unsubscribe)
from lockmq.security import Permissions
from lockmq.store import NewRecord, open_store
from lockmq.testing import (BrokerProcess, Lock, Peer, Refused, SecureBroker,
                            refusal, require_micropython, set_config, wait_for)
from lockmq.testing.lock import build_flash

pytestmark = pytest.mark.timeout(300)

MAX_SEQ = 0xFFFFFFFF


# -- helpers kept in this module ----------------------------------------------------------


class Env(SecureBroker):
    """The auth-required broker with the peers a test opened and the admin views."""

    def __init__(self, root: Path, tables: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__(root, tables)   # a restart keeps the port SecureBroker got first
        self.wires: list[Peer] = []
        self.ops = self.grant("ops", admin=True)

    def grant(self, name: str, **perms: Any) -> str:
        """A one-hour token with these rights (lists of patterns)."""
        return self.token(name, Permissions(**{
            k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in perms.items()}),
            ttl_s=3600)

    def restart(self) -> BrokerProcess:
        assert self.broker is not None
        self.broker.stop()
        return self.start()

    @property
    def port(self) -> int:
        assert self.broker is not None
        return self.broker.port

    def service(self, token: str, client_id: str) -> Peer:
        """A token holder, authenticated, with ``client_id`` as its frame SN."""
        w = Peer(self.port, client_id)
        self.wires.append(w)
        w.auth_token(token)
        return w

    def admin(self, op: str, **args: Any) -> dict[str, Any]:
        with self.service(self.ops, "ops-tool") as w:
            return w.admin(op, **args)

    def stats(self) -> dict[str, Any]:
        return self.admin("stats")["broker"]

    def queue_end(self, topic: str) -> int:
        for t in self.admin("topics")["topics"]:
            if t["topic"] == topic:
                return int(t["queue_end"])
        return 0

    def close(self) -> None:
        for w in self.wires:
            w.close()
        super().close()


def subscribe(w: Peer, topic: str, cluster: str) -> int:
    return w.subscribe(topic, cluster).sub_id


def pull(w: Peer, sub_id: int, want: int = 1, timeout: float = 30.0) -> list[Any]:
    """Long-poll until at least ``want`` messages arrived."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < want:
        assert time.monotonic() < deadline, f"only {len(got)} of {want} messages arrived"
        got.extend(w.pull(sub_id, 100, wait_ms=500).messages)
    return got


def metric(broker: BrokerProcess, name: str) -> float:
    return broker.metrics().get(name, 0.0)


@pytest.fixture
def env(tmp_path):
    """``env(tables)``: a new :class:`Env` in its own folder; all are closed after the test."""
    numbers = itertools.count()
    with ExitStack() as stack:
        def make(tables: dict[str, dict[str, Any]] | None = None) -> Env:
            e = Env(tmp_path / f"env{next(numbers)}", tables)
            stack.callback(e.close)
            return e

        yield make


# -- the real firmware ----------------------------------------------------------------------


@pytest.fixture
def firmware(tmp_path):
    """``firmware(env, sn)``: the real firmware (unix port), registered in ``env``'s
    registry and provisioned for its broker; stopped after the test."""
    require_micropython()
    with ExitStack() as stack:
        def make(e: Env, sn: str) -> Lock:
            key = e.registry.add(sn)
            folder = build_flash(tmp_path / f"board-{sn}", sn, key, [("127.0.0.1", e.port)])
            set_config(folder, backoff_max_ms=2000)   # back soon after a broker restart
            lk = Lock(folder)
            stack.callback(lk.close)
            lk.expect(r"I net connected", timeout=60)
            return lk

        yield make


# -- item 1: the broker's own records, producer ids ------------------------------------------


async def _poison_like_v01(data_dir: str) -> None:
    """The state v0.1's attack left on disk: a record under the broker's id with seq
    0xFFFFFFFF, which made the duplicate table drop every later ``$broker`` record."""
    s = open_store(data_dir, min_free_bytes=0)
    try:
        await s.append([NewRecord("billing.x", "$broker", MAX_SEQ, 0, b"v0.1 attack")])
    finally:
        await s.close()


def test_item1_no_service_can_make_the_broker_drop_records(env, firmware):
    e = env({"devices": {"heartbeat_s": 1.0, "evict_after_s": 10.0},
             "consumers": {"retry_levels_s": [0.2], "visibility_timeout_ms": 60_000}})
    asyncio.run(_poison_like_v01(str(e.data)))
    billing = e.grant("billing", publish=["billing.*"], consume=["lock.*:billing"])
    evil = e.grant("evil", publish=["billing.*"])
    broker = e.start()
    mark = broker.mark()

    # 1a. the review's attack: client id "$broker", seq 0xFFFFFFFF. Refused at connect
    # (identity charset) or, at the latest, at the publish.
    w = Peer(e.port, "$broker")
    e.wires.append(w)
    try:
        w.auth_token(evil)
        err = refusal(lambda: w.publish("billing.x", MAX_SEQ))
        assert err.code == ErrorCode.FORBIDDEN and "reserved" in err.err.message
    except Refused as exc:
        assert exc.code in (ErrorCode.AUTH_FAILED, ErrorCode.INVALID_ARGUMENT,
                            ErrorCode.FORBIDDEN, ErrorCode.BAD_FRAME), exc
    # 1b. the per-PUBLISH check, whatever the handshake lets in: an admin token's frames
    # may carry any SN, but never the broker's.
    # (the protocol session answers INVALID_ARGUMENT for an id outside the identity
    # rule; the broker's producer-id check, FORBIDDEN: either way never stored)
    tool = e.service(e.ops, "ops-tool")
    err = refusal(lambda: tool.publish("billing.x", MAX_SEQ, sn="$broker"))
    assert err.code in (ErrorCode.FORBIDDEN, ErrorCode.INVALID_ARGUMENT)
    assert "broker" in err.err.message
    assert tool.publish("billing.x", 1).status == 0                # the connection stays

    # 1c. a producer id belongs to the principal that used it first
    prod = e.service(billing, "billing-prod")
    assert prod.publish("billing.events", 1).status == 0          # STORED
    for stolen in ("billing-prod", "BILLING-PROD"):               # ... also case-folded
        thief = e.service(evil, stolen)
        err = refusal(lambda: thief.publish("billing.events", MAX_SEQ))
        assert err.code == ErrorCode.FORBIDDEN and "another principal" in err.err.message
    assert prod.publish("billing.events", 2).status == 0          # not poisoned

    # seen in the log and in the metrics
    broker.wait_log(r"security_permission_denied.*reason=producer_id_taken", start=mark)
    assert metric(broker, 'lockmq_security_permission_denied_total'
                          '{reason="producer_id_taken"}') >= 2
    assert e.stats()["producer_ids_refused"] >= 2

    # the legitimate path: a real lock's records, the broker's own records, a nacked
    # event redelivered -- despite the poisoned duplicate table from v0.1
    devices0 = e.queue_end("$devices")
    lock = firmware(e, "LOCK-0001")
    wait_for(lambda: e.queue_end("$devices") > devices0, "the lock's online record")
    hb0 = e.queue_end("$heartbeats")
    wait_for(lambda: e.queue_end("$heartbeats") > hb0, "heartbeat records")
    consumer = e.service(billing, "billing-consumer")
    sub = subscribe(consumer, "lock.events", "billing")
    lock.send("event tamper")
    first = pull(consumer, sub)[0]
    assert first.sn == "LOCK-0001" and first.delivery == 1
    consumer.request(Op.NACK, Nack(sub, [first.lease], 0, "try again").encode())
    again = pull(consumer, sub)[0]
    assert (again.sn, again.seq, again.delivery) == (first.sn, first.seq, 2)
    consumer.request(Op.ACK, Ack(sub, [again.lease]).encode())
    assert e.queue_end("$retry.billing.0") >= 1                    # the retry was stored
    assert e.stats().get("system_records_duplicate", 0) == 0

    # ... and after a restart: ownership persisted, the broker's records still stored
    for w in e.wires:
        w.close()
    e.wires.clear()
    devices1 = e.queue_end("$devices")
    broker = e.restart()
    thief = e.service(evil, "billing-prod")
    err = refusal(lambda: thief.publish("billing.events", MAX_SEQ))
    assert err.code == ErrorCode.FORBIDDEN
    assert e.service(billing, "billing-prod").publish("billing.events", 3).status == 0
    lock.expect(r"I net connected", timeout=60)                   # the lock is back
    wait_for(lambda: e.queue_end("$devices") > devices1 + 2,
             "the shutdown, broker_start and online records")
    consumer = e.service(billing, "billing-consumer")
    sub = subscribe(consumer, "lock.events", "billing")
    lock.send("event tamper")
    m = pull(consumer, sub)[0]
    consumer.request(Op.NACK, Nack(sub, [m.lease], 0, "again").encode())
    again = pull(consumer, sub)[0]
    assert (again.seq, again.delivery) == (m.seq, 2)
    consumer.request(Op.ACK, Ack(sub, [again.lease]).encode())


# -- item 10: $ topics ---------------------------------------------------------------------


def test_item10_system_topics_need_the_system_right_internal_ones_are_closed(env, capsys):
    e = env()
    wild = e.grant("wild", publish=["*", "$*"])
    alarms = e.grant("alarms", system=["$alerts"])
    broker = e.start()
    mark = broker.mark()

    forged_online = b'{"sn":"LOCK-0001","event":"online","ts_ms":1,"peer":"x"}'
    w = e.service(wild, "wild-1")
    for topic in ("$devices", "$retry.billing.0", "$dlq.billing", "$heartbeats"):
        err = refusal(lambda: w.publish(topic, 1, forged_online))
        assert err.code == ErrorCode.FORBIDDEN, topic
        assert "written only by the broker" in err.err.message
    err = refusal(lambda: w.publish("$alerts", 2))                # "$*" is not the right
    assert err.code == ErrorCode.FORBIDDEN and "system right" in err.err.message
    assert w.publish("billing.x", 3).status == 0                   # its ordinary right works

    a = e.service(alarms, "alarms-1")
    assert a.publish("$alerts", 1).status == 0                     # the explicit right works
    for topic in ("$retry.billing.0", "$devices"):
        assert refusal(lambda: a.publish(topic, 2)).code == ErrorCode.FORBIDDEN
    tool = e.service(e.ops, "ops-tool")                            # admins: no exception
    assert refusal(lambda: tool.publish("$retry.billing.0", 1)).code == ErrorCode.FORBIDDEN

    broker.wait_log(r"security_permission_denied.*reason=internal_topic", start=mark)
    broker.wait_log(r"security_permission_denied.*reason=system_topic", start=mark)
    assert metric(broker, 'lockmq_security_permission_denied_total'
                          '{reason="internal_topic"}') >= 7

    # nothing forged reached the broker's topics; its own records are still written
    assert e.queue_end("$retry.billing.0") == 0 and e.queue_end("$dlq.billing") == 0
    watcher = e.service(e.ops, "ops-watch")
    sub = subscribe(watcher, "$devices", "ops-devices")
    recs = pull(watcher, sub)
    assert recs and all(r.sn == "$broker" for r in recs)
    assert all(b'"broker_start"' in bytes(r.payload) for r in recs)

    # the CLI warns when a system right is granted
    from lockmq.cli import main as cli
    capsys.readouterr()
    assert cli(["tokens", "create", "alarms2", "--system", "$alerts",
                "--data-dir", str(e.data)]) == 0
    assert "warning: --system" in capsys.readouterr().err
    assert cli(["tokens", "create", "bad", "--system", "alerts",
                "--data-dir", str(e.data)]) == 2


# -- item 11: cluster ownership --------------------------------------------------------------


def test_item11_a_cluster_belongs_to_its_creator(env):
    e = env({"consumers": {"visibility_timeout_ms": 60_000}})
    shop = e.grant("shop", publish=["orders.*"])
    billing = e.grant("billing", consume=["orders.*:billing"])
    evil = e.grant("evil", consume=["*"])
    broker = e.start()
    mark = broker.mark()

    prod = e.service(shop, "shop-1")
    cons = e.service(billing, "billing-1")
    sub = subscribe(cons, "orders.events", "billing")
    positions = e.data / "consume-billing.log"
    # the claim, then the positions timer's save of the member's activity (the join):
    # only after both is the file quiet, so the refusals below can be seen to leave it
    wait_for(lambda: positions.exists() and b'"counters"' in positions.read_bytes(),
             "the cluster's positions file with its activity")
    before = positions.read_bytes()

    # the attack: bind "billing" to another topic / join it from another principal
    x = e.service(evil, "evil-1")
    for topic in ("junk.topic", "orders.events"):
        err = refusal(lambda: subscribe(x, topic, "billing"))
        assert err.code == ErrorCode.FORBIDDEN and "another principal" in err.err.message
    # the owner binding it to another topic: refused, no side effects
    err = refusal(lambda: subscribe(e.service(billing, "billing-2"), "orders.other", "billing"))
    assert err.code == ErrorCode.INVALID_ARGUMENT and "orders.events" in err.err.message
    assert positions.read_bytes() == before
    info = e.admin("clusters", cluster="billing")["clusters"]
    assert [(c["topic"], c["owner"]) for c in info] == [("orders.events", "token:billing")]

    broker.wait_log(r"event=cluster_refused_owner", start=mark)
    assert metric(broker, "lockmq_clusters_refused_owner_total") >= 2
    assert metric(broker, "lockmq_clusters_refused_topic_total") >= 1

    # the legitimate path: billing still gets its messages
    assert prod.publish("orders.events", 1).status == 0
    m = pull(cons, sub)[0]
    cons.request(Op.ACK, Ack(sub, [m.lease]).encode())

    # ownership survives a restart
    for w in e.wires:
        w.close()
    e.wires.clear()
    broker = e.restart()
    x = e.service(evil, "evil-1")
    assert refusal(lambda: subscribe(x, "orders.events", "billing")).code == ErrorCode.FORBIDDEN
    cons = e.service(billing, "billing-1")
    sub = subscribe(cons, "orders.events", "billing")
    assert e.service(shop, "shop-1").publish("orders.events", 2).status == 0
    assert pull(cons, sub)[0].seq == 2

    # an admin can delete it (not while members are connected), freeing the name
    err = e.admin("clusters.delete", cluster="billing")
    assert err["ok"] is False and "members" in err["message"]
    cons.close()
    wait_for(lambda: e.admin("clusters.delete", cluster="billing")["ok"], "the delete")
    assert not positions.exists()
    sub = subscribe(e.service(evil, "evil-2"), "junk.topic", "billing")
    assert sub > 0


# -- item 12: no SN oracle, no lookalikes ----------------------------------------------------


def test_item12_sns_cannot_be_told_apart_and_lookalikes_are_refused(env, firmware):
    e = env()
    opener = e.grant("opener", command=["LOCK-0001", "LOCK-00X*"])
    e.registry.add("LOCK-0002")                                    # registered, outside the scope
    broker = e.start()
    mark = broker.mark()
    lock = firmware(e, "LOCK-0001")

    svc = e.service(opener, "opener-1")
    answers = []
    for target in ("LOCK-0002", "NOPE-0001", "LOCK-00X9"):   # registered / unregistered / in scope
        err = refusal(lambda: svc.request(Op.COMMAND, Command(
            target, 0, 0, CommandKind.UNLOCK, b"\x00\x03").encode()))
        answers.append((err.code, err.err.message, err.err.retry_after_ms))
    assert answers[0][0] == ErrorCode.FORBIDDEN
    assert answers[0] == answers[1] == answers[2]              # one answer for all three

    # lookalike client ids are refused, with the answer of a bad token
    bad_token = "lmq_" + "0" * 16 + "_" + "x" * 43
    w = Peer(e.port, "anything")
    e.wires.append(w)
    baseline = refusal(lambda: w.auth_token(bad_token))
    for lookalike in ("lock-0001", "LOCK-0001", "Lock-0002", "LOCK-0001\n"):
        w = Peer(e.port, lookalike)
        e.wires.append(w)
        err = refusal(lambda: w.auth_token(opener))
        assert err.code in (ErrorCode.AUTH_FAILED, ErrorCode.INVALID_ARGUMENT), lookalike
        if err.code == ErrorCode.AUTH_FAILED:
            assert err.err.message == baseline.err.message
    # ... and as a producer id in an admin's frames
    tool = e.service(e.ops, "ops-tool")
    err = refusal(lambda: tool.publish("lock.events", 1, sn="lock-0001"))
    assert err.code == ErrorCode.FORBIDDEN

    broker.wait_log(r"security_auth_failed.*reason=token_claims_lock", start=mark)
    m = broker.metrics()
    unknown = sum(v for k, v in m.items()     # the reason names the unregistered target
                  if k.startswith("lockmq_security_permission_denied_total")
                  and "unknown_lock" in k)
    assert unknown >= 1
    assert m['lockmq_security_permission_denied_total{reason="command_denied"}'] >= 2
    assert m['lockmq_security_auth_failed_total{reason="token_claims_lock"}'] >= 3

    # the legitimate path: the opener still unlocks its own (real) lock
    res = svc.request(Op.COMMAND, Command("LOCK-0001", 0, 0, CommandKind.UNLOCK,
                                          b"\x00\x03").encode())
    assert res.status == CommandStatus.OK
    lock.expect(r"I cmd unlock id=\d+ ok", timeout=30)


# -- item 13: caps ---------------------------------------------------------------------------


def test_item13_subscriptions_and_clusters_are_capped(env):
    e = env()   # the defaults: 64 subscriptions per connection, 32 clusters per owner
    wide = e.grant("wide", consume=["*"])
    other = e.grant("other", consume=["*"])
    broker = e.start()
    mark = broker.mark()

    w = e.service(wide, "wide-1")
    subs = [subscribe(w, "t.events", "c-0") for _ in range(64)]
    err = refusal(lambda: subscribe(w, "t.events", "c-0"))
    assert err.code == ErrorCode.LIMIT_EXCEEDED
    assert "max_subscriptions_per_connection" in err.err.message
    # the connection is still usable: release one, subscribe again
    w.request(Op.UNSUBSCRIBE, Unsubscribe(subs.pop()).encode())
    subs.append(subscribe(w, "t.events", "c-0"))

    w2 = e.service(wide, "wide-2")
    for i in range(1, 32):
        subscribe(w2, "t.events", f"c-{i}")
    err = refusal(lambda: subscribe(w2, "t.events", "c-32"))
    assert err.code == ErrorCode.LIMIT_EXCEEDED and "max_clusters_per_owner" in err.err.message
    files = sorted(p.name for p in e.data.glob("consume-*.log"))
    assert len(files) == 32 and "consume-c-32.log" not in files  # nothing left on disk
    assert subscribe(w2, "t.events", "c-0") > 0                    # its own clusters: fine

    broker.wait_log(r"event=subscription_limit", start=mark)
    broker.wait_log(r"event=cluster_refused_cap", start=mark)
    assert metric(broker, "lockmq_subscriptions_refused_total") >= 1
    assert metric(broker, "lockmq_clusters_refused_cap_total") >= 1

    # the legitimate path: another principal is not affected; an admin frees a slot
    assert subscribe(e.service(other, "other-1"), "t.events", "o-1") > 0
    w2.close()
    wait_for(lambda: e.admin("clusters.delete", cluster="c-31")["ok"], "the delete")
    assert subscribe(e.service(wide, "wide-3"), "t.events", "c-32") > 0
