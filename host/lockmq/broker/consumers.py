"""A consumer's requests: SUBSCRIBE, UNSUBSCRIBE, PULL, ACK, NACK, and the MESSAGES and
NOTIFY frames that answer them.

:class:`Consumers` owns these opcodes' handlers (registered in the connection's
dispatch table by the server) and every connection's subscriptions; it talks to a
connection only through :class:`~.peer.Peer`. The work itself is the clusters'
(``clusters.py``: leases, retries, dead letters); a cluster calls back through its
member (:meth:`Consumers._wake`) when work arrives for an idle member.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from lockmq import accel
from lockmq.config import ConsumersSection
from lockmq.protocol import (Ack, ErrorCode, Flag, Nack, Notify, Op, Pull, Subscribe,
                             SubscribeAck, Unsubscribe)
from lockmq.protocol.batch import SHAPES, encode_message, json_headers, message_shape, \
    messages_head
from lockmq.security import BrokerGuard, SecurityError

from .clusters import Cluster, ClusterError, Lease, Member, ParkedPull
from .core import BrokerCore
from .logs import EventLog, Stats
from .peer import Handler, Peer

_RESP = Flag.RESPONSE
# a pull's MESSAGES body written in one buffer (None: the Python loop below)
_encode_leases_c = accel.speedups.encode_leases if accel.COMPILED else None


class Subscriptions:
    """One connection's subscriptions by id, and whether it hit the cap already."""

    __slots__ = ("by_id", "next_id", "cap_logged")

    def __init__(self) -> None:
        self.by_id: dict[int, tuple[Cluster, Member]] = {}
        self.next_id = 1
        self.cap_logged = False


class Consumers:
    """The consumer opcodes of every connection (see the module docstring)."""

    def __init__(self, cfg: ConsumersSection, stats: Stats, log: EventLog,
                 guard: BrokerGuard, core: BrokerCore) -> None:
        self.cfg = cfg
        self.stats = stats
        self.log = log
        self.guard = guard
        self.core = core
        #: connection id -> its subscriptions (only connections that subscribed)
        self.by_conn: dict[int, Subscriptions] = {}

    def handlers(self) -> dict[int, Handler]:
        """This feature's part of the dispatch table."""
        return {Op.SUBSCRIBE: self.on_subscribe, Op.UNSUBSCRIBE: self.on_unsubscribe,
                Op.PULL: self.on_pull, Op.ACK: self.on_ack, Op.NACK: self.on_nack}

    def count(self, peer: Peer) -> int:
        """How many subscriptions ``peer`` holds."""
        subs = self.by_conn.get(peer.id)
        return len(subs.by_id) if subs is not None else 0

    def connection_closed(self, peer: Peer) -> None:
        """``peer`` is gone: its members leave their clusters (their leases go back)."""
        subs = self.by_conn.pop(peer.id, None)
        if subs is None:
            return
        for cluster, member in list(subs.by_id.values()):
            member.unpark()
            cluster.leave(member, reason="disconnected")

    # -- requests -------------------------------------------------------------------

    def on_subscribe(self, peer: Peer, frame: Any) -> None:
        s = Subscribe.decode(frame.body)
        principal = peer.principal
        try:
            self.guard.check_consume(principal, s.topic, s.cluster)
        except SecurityError as exc:
            peer.refused(exc, frame.opaque)
            return
        subs = self.by_conn.get(peer.id)
        cap = self.cfg.max_subscriptions_per_connection
        if subs is not None and len(subs.by_id) >= cap:   # a cap: retrying won't help
            self.stats.inc("subscriptions_refused")
            if not subs.cap_logged:
                subs.cap_logged = True
                self.log("subscription_limit", conn=peer.id, peer=peer.peer,
                         principal=principal.name, cap=cap, level="warning")
            peer.send_error(ErrorCode.LIMIT_EXCEEDED,
                            f"this connection already holds {cap} subscriptions "
                            "(consumers.max_subscriptions_per_connection): unsubscribe "
                            "first or use another connection", frame.opaque)
            return
        ordered = bool(s.flags & Subscribe.ORDERED) or self.cfg.ordered_default
        try:
            cluster = self.core.cluster(s.cluster, s.topic, ordered, principal=principal)
        except ClusterError as exc:
            peer.send_error(int(getattr(ErrorCode, exc.code, ErrorCode.INTERNAL)),
                            exc.message, frame.opaque)
            return
        if subs is None:
            subs = self.by_conn[peer.id] = Subscriptions()
        sub_id = subs.next_id
        subs.next_id += 1
        member = Member(sub_id, principal.name, peer.peer, partial(self._wake, peer),
                        s.max_inflight, s.lease_ms)
        subs.by_id[sub_id] = (cluster, member)
        peer.send_frame(Op.SUBSCRIBE_ACK, SubscribeAck(sub_id, cluster.backlog()).encode(),
                        frame.opaque, _RESP)
        cluster.join(member)   # (a NOTIFY it causes goes out after the SUBSCRIBE_ACK)

    def _sub(self, peer: Peer, sub_id: int, opaque: int) -> tuple[Cluster, Member] | None:
        subs = self.by_conn.get(peer.id)
        s = subs.by_id.get(sub_id) if subs is not None else None
        if s is None:
            peer.send_error(ErrorCode.UNKNOWN_SUBSCRIPTION,
                            f"no subscription {sub_id} on this connection", opaque)
        return s

    def on_unsubscribe(self, peer: Peer, frame: Any) -> None:
        u = Unsubscribe.decode(frame.body)
        s = self._sub(peer, u.sub_id, frame.opaque)
        if s is None:
            return
        del self.by_conn[peer.id].by_id[u.sub_id]
        s[1].unpark()
        s[0].leave(s[1], reason="unsubscribed")
        peer.send_frame(Op.OK, b"", frame.opaque, _RESP)

    def on_pull(self, peer: Peer, frame: Any) -> None:
        p = Pull.decode(frame.body)
        s = self._sub(peer, p.sub_id, frame.opaque)
        if s is None:
            return
        cluster, member = s
        self.stats.c["pulls"] += 1
        earlier = member.unpark()   # a new PULL answers the one still waiting, empty
        if earlier is not None:
            self._send_messages(peer, member.member_id, [], earlier.opaque)
        leases = cluster.pull(member, max(1, p.max_messages))
        if leases or p.wait_ms <= 0:
            self._send_messages(peer, p.sub_id, leases, frame.opaque)
            return
        wait = min(p.wait_ms, self.cfg.visibility_timeout_ms, 60_000)
        timer = asyncio.get_running_loop().call_later(
            wait / 1000.0, self._park_expired, peer, member)
        member.park(ParkedPull(frame.opaque, max(1, p.max_messages), timer))

    def _park_expired(self, peer: Peer, member: Member) -> None:
        parked = member.unpark()
        if parked is not None:
            self._send_messages(peer, member.member_id, [], parked.opaque)

    def _wake(self, peer: Peer, member: Member) -> None:
        """Called by the cluster when work arrives for an idle member."""
        if peer.closed:
            return
        subs = self.by_conn.get(peer.id)
        s = subs.by_id.get(member.member_id) if subs is not None else None
        if s is None:
            return
        cluster = s[0]
        parked = member.parked
        if parked is not None:
            leases = cluster.pull(member, parked.max_messages)
            if leases:
                member.unpark()
                self._send_messages(peer, member.member_id, leases, parked.opaque)
            return
        self.stats.c["notifies"] += 1
        avail = min(0xFFFFFFFF, cluster.available())
        peer.send_frame(Op.NOTIFY, Notify(member.member_id, avail).encode())

    def _send_messages(self, peer: Peer, sub_id: int, leases: list[Lease],
                       opaque: int) -> None:
        stats = self.stats
        stats.c["messages_delivered"] += len(leases)
        if leases:   # stored -> first delivery (not retries, not redeliveries)
            now_us = self.core.clock.wall_ms() * 1000.0   # the store's clock
            observe = stats.latency.publish_deliver.observe
            for lease in leases:
                if lease.deliveries == 1 and not lease.retries:
                    observe((now_us - lease.rec.broker_ts_us) / 1e6)
        peer.send_frame(Op.MESSAGES, encode_leases(sub_id, leases), opaque, _RESP)

    def on_ack(self, peer: Peer, frame: Any) -> None:
        ack = Ack.decode(frame.body)
        leases = ack.leases
        s = self._sub(peer, ack.sub_id, frame.opaque)
        if s is None:
            return
        cluster, member = s
        bad = cluster.ack_many(member, leases)   # the whole frame at once
        self.stats.c["acks"] += len(leases) - len(bad)
        self._lease_reply(peer, frame, bad, len(leases))
        cluster.settled(member)

    def on_nack(self, peer: Peer, frame: Any) -> None:
        nack = Nack.decode(frame.body)
        delay_ms, reason, leases = nack.delay_ms, nack.reason, nack.leases
        s = self._sub(peer, nack.sub_id, frame.opaque)
        if s is None:
            return
        cluster, member = s
        bad = []
        for qoff, delivery in leases:
            try:
                cluster.nack(member, qoff, delivery, delay_ms or None, reason)
            except ClusterError:
                bad.append((qoff, delivery))
        self.stats.c["nacks"] += len(leases) - len(bad)
        self._lease_reply(peer, frame, bad, len(leases))
        cluster.settled(member)

    def _lease_reply(self, peer: Peer, frame: Any, bad: list[tuple[int, int]],
                     total: int) -> None:
        if bad:
            self.stats.c["unknown_leases"] += len(bad)
            if frame.flags & Flag.ONEWAY:
                return
            shown = ", ".join(f"({q},{d})" for q, d in bad[:20])
            peer.send_error(ErrorCode.UNKNOWN_LEASE,
                            f"{len(bad)} of {total} leases unknown, expired or not yours "
                            f"(the others were applied): {shown}", frame.opaque)
        elif not frame.flags & Flag.ONEWAY:
            peer.send_frame(Op.OK, b"", frame.opaque, _RESP)


def encode_leases(sub_id: int, leases: list[Lease]) -> bytes:
    """MESSAGES body straight from cluster leases: the delivery hot path.

    The bytes are the protocol's (``lockmq.protocol.batch``); this only walks the
    leases. A message without headers (the common case) costs one cache lookup and
    one ``pack``; a retried one gets ``{"retries": n}`` added to its headers.
    Compiled, a batch without headers or retries is one C call (the same bytes)."""
    if _encode_leases_c is not None:
        body = _encode_leases_c(sub_id, leases)
        if body is not None:
            return body
    return _encode_leases_py(sub_id, leases)


def _encode_leases_py(sub_id: int, leases: list[Lease]) -> bytes:
    """:func:`encode_leases` in Python: every batch (the reference of the C one)."""
    parts = [messages_head(sub_id, len(leases))]
    append = parts.append
    shapes = SHAPES
    for lease in leases:
        r = lease.rec
        p = r.payload
        if r.headers or lease.retries:
            h = dict(r.headers or {})
            if lease.retries:
                h["retries"] = lease.retries
            append(encode_message(lease.wire, lease.deliveries, r.sn, r.seq, r.lock_ts_ms,
                                  r.broker_ts_us, r.topic, p, json_headers(h)))
            continue
        got = shapes.get((r.sn, r.topic, len(p)))
        if got is None:
            got = message_shape(r.sn, r.topic, len(p))
        append(got[0](lease.wire, lease.deliveries, r.seq, r.lock_ts_ms, r.broker_ts_us,
                      got[1], p))
    return b"".join(parts)
