"""One MQTT client connection: bytes -> codec -> session, subscriptions, publishes.

The connection speaks MQTT 3.1.1 or 5 (what the CONNECT says) and turns it into
lockmq's own operations, through the broker's own pieces only:

* CONNECT: the credentials through :class:`~lockmq.mqtt.rights.Rights` (the guard);
  a persistent session resumed from :class:`~lockmq.mqtt.sessions.SessionStore`;
* SUBSCRIBE: each (filter, topic) joins a consumer cluster (``BrokerCore.cluster``)
  as a :class:`~lockmq.broker.clusters.Member`: ``$share/<cluster>/<filter>`` the
  named cluster, a plain filter a private cluster of this session;
* a delivery is a lease (``Cluster.pull``); PUBACK acks it, a PUBACK with a reason
  code >= 0x80 (MQTT 5) nacks it (retry levels, then the dead-letter topic); a
  disconnect releases the leases at once, a lease that times out is redelivered;
* PUBLISH to a topic: stored through the publish path (one group commit per loop
  iteration with every other producer), PUBACK once durable;
* PUBLISH to ``lockmq/command/<SN>/<kind>``: a downlink command through the broker's
  command path (same rights, caps and expiry); the result comes back on the MQTT 5
  response topic with the correlation data, or on ``lockmq/result/<client id>``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from lockmq.protocol import ErrorCode
from lockmq.security import SecurityError
from lockmq.security.identity import owner_of
from lockmq.store import InvalidRecord, NewRecord

from . import codec as c
from . import topics as t
from .codec import reason as rc
from .commands import CommandSender, submit_command
from .delivery import json_envelope, user_properties
from .devicestate import PREFIX as DEVICES_PREFIX
from .rights import message_of, reason_of
from .sessions import NEVER, Session, SubRecord

if TYPE_CHECKING:   # (types only: the broker builds this package, not the reverse)
    from lockmq.broker.clusters import Lease, Member

    from .server import MqttServer

#: packet ids 1..65535 (0 is not a packet id)
_MAX_PID = 0xFFFF
#: deliveries sent per pump before yielding to the loop (QoS 0 has no window)
_PUMP_BATCH = 512
#: QoS 1 deliveries leased per pull (a member with a large window takes its turn)
_PULL_BATCH = 32


class Joined:
    """One (subscription, topic): the cluster and this connection's member in it."""

    __slots__ = ("sub", "cluster", "member", "private")

    def __init__(self, sub: "Sub", cluster: Any, member: "Member", private: bool) -> None:
        self.sub = sub
        self.cluster = cluster
        self.member = member
        self.private = private


class Sub:
    """One live subscription: its filter and the clusters it joined (one per topic)."""

    __slots__ = ("rec", "group", "filter", "joined")

    def __init__(self, rec: SubRecord, group: str | None, flt: str) -> None:
        self.rec = rec
        self.group = group
        self.filter = flt
        self.joined: dict[str, Joined] = {}


class MqttConnection(asyncio.Protocol):
    """One MQTT client (see the module docstring)."""

    def __init__(self, server: "MqttServer", tls: bool) -> None:
        self.server = server
        self.tls = tls
        s = server.settings
        self.decoder = c.Decoder(s.max_packet_bytes, c.V5)
        self.version = c.V5
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_ip = ""
        self.admitted = False
        self.connected = False     # CONNECT accepted
        self.closed = False
        self.principal: Any = None
        self.client_id = ""
        self.session: Session | None = None
        self.subs: dict[str, Sub] = {}
        #: subscriptions to lockmq/devices/... (lock states: no cluster)
        self.state_subs: dict[str, SubRecord] = {}
        self.keepalive = 0
        self.last_seen = time.monotonic()
        self.will: c.Will | None = None
        self.recv_max = s.max_inflight   # what we may have unacked towards the client
        self.client_max_packet = 0       # the client's Maximum Packet Size (0: none)
        #: packet id -> the lease it carries (QoS 1 deliveries awaiting PUBACK)
        self.inflight: dict[int, tuple[Joined, int, int] | None] = {}   # None: retained
        #: QoS 2 deliveries PUBREC'd and PUBREL'd, waiting for their PUBCOMP
        self._released: set[int] = set()
        self._next_pid = 1
        self._starved: set[Joined] = set()   # stopped for want of room, not of work
        self._paused = False
        self._timer: asyncio.TimerHandle | None = None
        #: publishes of this read, stored together: (record, qos, packet id)
        self._pubs: list[tuple[NewRecord, int, int, str | None]] = []
        self._topics_ok: set[str] = set()
        #: publishes handed to the store and not answered yet (flow control)
        self._pending_in = 0
        self._reading_paused = False
        self._producer_ok = False
        self._seq = 0
        self._qos2: set[int] = set()     # inbound QoS 2 packet ids stored, PUBREL awaited
        self._topic_fields: dict[str, bytes] = {}   # lockmq topic -> its MQTT name encoded

    # -- transport ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.peer_ip = str(peer[0])
        self.peer = f"{peer[0]}:{peer[1]}"
        if len(self.server.conns) >= self.server.settings.max_connections:
            self.server.stats.inc("mqtt_connections_refused")
            self.server.log.limited("mqtt_connection_limit", peer=self.peer,
                                    cap=self.server.settings.max_connections,
                                    level="warning")
            transport.close()
            self.closed = True
            return
        try:
            self.server.rights.admit(self.peer_ip)
            self.admitted = True
        except SecurityError as exc:
            self.server.log("mqtt_refused", peer=self.peer, reason=exc.reason, level="warning")
            transport.close()
            self.closed = True
            return
        self.server.conns.add(self)
        self._timer = asyncio.get_running_loop().call_later(
            self.server.settings.connect_timeout_s, self._connect_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone("connection lost" if exc is None else f"connection lost: {exc}")

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._pump_starved()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_seen = time.monotonic()
        self.decoder.feed(data)
        try:
            while not self.closed:
                p = self.decoder.next_packet()
                if p is None:
                    break
                self._handle(p)
        except c.MqttError as exc:
            self.server.stats.inc("mqtt_protocol_errors")
            self.server.log.limited("mqtt_protocol_error", peer=self.peer,
                                    client=self.client_id, reason=f"0x{exc.reason:02x}",
                                    error=exc.message, level="warning")
            self.disconnect(exc.reason, exc.message)
        except Exception as exc:  # noqa: BLE001 -- a bug here costs this client only
            self.server.stats.inc("mqtt_internal_errors")
            self.server.log("mqtt_internal_error", peer=self.peer, client=self.client_id,
                            error=repr(exc), level="error")
            self.disconnect(rc.IMPLEMENTATION_SPECIFIC, "internal error")
        finally:
            self._submit_publishes()

    def write(self, data: bytes) -> None:
        """Send bytes (nothing once closed)."""
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def send(self, packet: Any) -> None:
        """Send one packet in this connection's protocol version."""
        self.write(packet.encode(self.version))

    def disconnect(self, reason: int, message: str = "") -> None:
        """Close with ``reason`` (MQTT 5: a DISCONNECT carrying it; 3.1.1 just closes).
        The will, if any, is published."""
        if self.closed:
            return
        if self.connected and self.version == c.V5:
            props = {"reason_string": message[:200]} if message else {}
            self.send(c.Disconnect(reason, props))
        self._close(f"0x{reason:02x} {message}".strip())

    def _close(self, why: str) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self._gone(why)

    def _gone(self, why: str) -> None:
        """Everything a closed connection leaves: its leases, its session, its will."""
        if self.closed and self.transport is None:
            return
        first = not self.closed
        self.closed = True
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        srv = self.server
        srv.conns.discard(self)
        if self.admitted:
            self.admitted = False
            srv.rights.release(self.peer_ip)
        if not self.connected:
            return
        self.connected = False
        for sub in list(self.subs.values()):
            for j in sub.joined.values():
                j.member.unpark()
                j.cluster.leave(j.member, reason="mqtt disconnect")
        self.inflight.clear()
        if self.will is not None:
            self._publish_will()
        srv.session_closed(self)
        if first:
            srv.log("mqtt_disconnect", peer=self.peer, client=self.client_id, reason=why,
                    level="debug")

    # -- timers -------------------------------------------------------------------------

    def _connect_timeout(self) -> None:
        self._timer = None
        if not self.connected:
            self.server.stats.inc("mqtt_connect_timeouts")
            self._close("no CONNECT in time")

    def _keepalive_check(self) -> None:
        self._timer = None
        if self.closed:
            return
        idle = time.monotonic() - self.last_seen
        limit = self.keepalive * 1.5
        if idle >= limit:
            self.server.stats.inc("mqtt_keepalive_timeouts")
            self.disconnect(rc.KEEP_ALIVE_TIMEOUT, f"nothing received for {idle:.1f} s "
                            f"(keepalive {self.keepalive} s)")
            return
        self._timer = asyncio.get_running_loop().call_later(limit - idle, self._keepalive_check)

    # -- packets ------------------------------------------------------------------------

    def _handle(self, p: Any) -> None:
        pt = p.ptype
        if not self.connected:
            if pt != c.CONNECT:
                raise c.ProtocolViolation("the first packet must be CONNECT")
            self._on_connect(p)
            return
        if pt == c.PUBLISH:
            self._on_publish(p)
        elif pt == c.PUBACK:
            self._on_puback(p)
        elif pt == c.SUBSCRIBE:
            self._on_subscribe(p)
        elif pt == c.UNSUBSCRIBE:
            self._on_unsubscribe(p)
        elif pt == c.PINGREQ:
            self.send(c.Ping(c.PINGRESP))
        elif pt == c.DISCONNECT:
            if p.reason != 0x04:   # 0x04: "disconnect with will message"
                self.will = None
            if self.version == c.V5 and self.session is not None \
                    and "session_expiry" in p.props:
                self.server.set_expiry(self, int(p.props["session_expiry"]))
            self._close("client disconnect")
        elif pt == c.PUBREL:
            self._qos2.discard(p.packet_id)
            self.send(c.Ack(c.PUBCOMP, p.packet_id))
        elif pt == c.PUBREC:
            self._on_puback(p)           # the client has it: the lease is done
            if p.reason < 0x80:
                self._released.add(p.packet_id)
                self.send(c.Ack(c.PUBREL, p.packet_id))
        elif pt == c.PUBCOMP:
            self._released.discard(p.packet_id)
        elif pt == c.CONNECT:
            raise c.ProtocolViolation("a second CONNECT")
        elif pt == c.AUTH:
            raise c.MqttError(rc.BAD_AUTH_METHOD, "enhanced authentication is not offered: "
                              "send the token as the CONNECT password")
        else:
            raise c.ProtocolViolation(f"a client does not send packet type {pt}")

    def _refuse_connect(self, reason: int, message: str) -> None:
        self.server.stats.inc("mqtt_connect_refused")
        self.server.log("mqtt_connect_refused", peer=self.peer, client=self.client_id[:80],
                        reason=f"0x{reason:02x}", message=message, level="warning")
        if self.version == c.V5:
            self.send(c.ConnAck(reason, False, {"reason_string": message[:200]}))
        else:
            self.send(c.ConnAck(c.v311_connack_code(reason)))
        self._close(message)

    def _on_connect(self, p: c.Connect) -> None:
        self.version = self.decoder.version = p.version
        srv = self.server
        s = srv.settings
        try:
            self.principal = srv.rights.authenticate(p.username, p.password, self.peer_ip,
                                                     self.tls)
        except SecurityError as exc:
            self._refuse_connect(reason_of(exc), message_of(exc) or "authentication failed")
            return
        assigned = None
        cid = p.client_id
        if not cid:
            if not p.clean_start and p.version == c.V311:
                self._refuse_connect(rc.CLIENT_ID_NOT_VALID,
                                     "an empty client id needs clean session")
                return
            cid = assigned = srv.new_client_id()
        self.client_id = cid
        if p.will is not None:
            try:
                self._check_topic(t.to_lockmq(p.will.topic))
            except (t.TopicError, SecurityError) as exc:
                code = reason_of(exc) if isinstance(exc, SecurityError) else rc.TOPIC_NAME_INVALID
                self._refuse_connect(code, f"will topic: {exc}")
                return
            self.will = p.will
        owner = owner_of(self.principal)
        if p.version == c.V5:
            expiry = int(p.props.get("session_expiry", 0))
            rm = int(p.props.get("receive_maximum", 0xFFFF))
            if rm == 0:
                raise c.ProtocolViolation("Receive Maximum 0")
            self.recv_max = min(s.max_inflight, rm)
            self.client_max_packet = int(p.props.get("maximum_packet_size", 0))
        else:
            expiry = 0 if p.clean_start else NEVER
        expiry = min(expiry, s.max_session_expiry_s)   # (MQTT 5 "never" too: CONNACK says)
        self.keepalive = min(p.keepalive, s.max_keepalive_s) if p.keepalive else 0
        present = srv.open_session(self, owner, cid, p.clean_start, expiry)
        self.connected = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.keepalive:
            self._timer = asyncio.get_running_loop().call_later(self.keepalive * 1.5,
                                                               self._keepalive_check)
        props: dict[str, Any] = {}
        if p.version == c.V5:
            props = {"topic_alias_maximum": 0,
                     "receive_maximum": 0xFFFF, "maximum_packet_size": s.max_packet_bytes,
                     "wildcard_available": 1, "shared_available": 1,
                     "subscription_id_available": 1}
            if assigned:
                props["assigned_client_id"] = assigned
            if p.keepalive != self.keepalive:
                props["server_keep_alive"] = self.keepalive
            if expiry != int(p.props.get("session_expiry", 0)):
                props["session_expiry"] = expiry
        self.send(c.ConnAck(0, present, props))
        srv.stats.inc("mqtt_connects")
        srv.log("mqtt_connect", peer=self.peer, client=cid, principal=self.principal.name,
                version="5" if p.version == c.V5 else "3.1.1", clean=p.clean_start,
                session_present=present, level="debug")
        if present and self.session is not None:
            for rec in list(self.session.subs.values()):
                self._subscribe(rec, resumed=True)

    # -- subscriptions --------------------------------------------------------------------

    def _on_subscribe(self, p: c.Subscribe) -> None:
        sid = 0
        if "subscription_id" in p.props:
            sid = p.props["subscription_id"][0]
            if not sid:
                raise c.ProtocolViolation("Subscription Identifier 0")
        reasons = []
        retained: list[SubRecord] = []
        ordered = any(k == "ordered" and v.lower() in ("1", "true", "yes")
                      for k, v in p.props.get("user_property", ()))
        for s in p.subscriptions:
            rec = SubRecord(s.filter, s.qos, sid, ordered=ordered)
            existed = s.filter in self.subs
            code = self._subscribe(rec, resumed=False)
            reasons.append(code)
            if code < 0x80 and not s.filter.startswith(t.SHARE_PREFIX) and \
                    (s.retain_handling == 0 or (s.retain_handling == 1 and not existed)):
                retained.append(rec)
        self.send(c.SubAck(p.packet_id, reasons))
        self.server.session_changed(self)
        for rec in retained:
            self._send_retained(rec)

    def _subscribe(self, rec: SubRecord, resumed: bool) -> int:
        """Join the clusters of one subscription; the SUBACK reason code."""
        srv = self.server
        try:
            group, flt = t.split_shared(rec.filter)
            t.check_filter(flt)
            if group is not None and not t.valid_group(group):
                raise t.TopicError(f"share name {group!r}: it names a consumer cluster, "
                                   "1..64 characters of [A-Za-z0-9._%-]")
        except t.TopicError as exc:
            self._sub_refused(rec.filter, rc.TOPIC_FILTER_INVALID, str(exc))
            return rc.TOPIC_FILTER_INVALID
        if group is None and flt.startswith(t.RESULT_PREFIX):
            # command results go straight to the connection that sent the command
            # (never stored): the subscription is granted and joins nothing
            return 0
        if group is None and flt.startswith(DEVICES_PREFIX):
            # the locks' states (devicestate.py): the right to read the events topic
            events = srv.device_states.topic
            try:
                srv.rights.check_consume(self.principal, events, t.private_cluster(
                    owner_of(self.principal), self.client_id, flt, events))
            except SecurityError as exc:
                self._sub_refused(rec.filter, reason_of(exc), message_of(exc))
                return reason_of(exc)
            self.state_subs[flt] = rec
            if self.session is not None:
                self.session.subs[rec.filter] = rec
            if not resumed:
                self._send_states(rec, srv.device_states.matching(flt), retain=True)
            return min(rec.qos, 1)
        cap = srv.config.consumers.max_subscriptions_per_connection
        if rec.filter not in self.subs and len(self.subs) + len(self.state_subs) >= cap:
            self._sub_refused(rec.filter, rc.QUOTA_EXCEEDED,
                              f"this connection already holds {cap} subscriptions "
                              "(consumers.max_subscriptions_per_connection)")
            return rc.QUOTA_EXCEEDED
        old = self.subs.pop(rec.filter, None)
        if old is not None:   # the same filter again: it replaces the old one
            self._leave(old, forget=False)
            if not resumed:
                rec.topics = old.rec.topics
        sub = Sub(rec, group, flt)
        topics = srv.matching_topics(flt) if t.has_wildcard(flt) else [t.to_lockmq(flt)] \
            if self._exact_ok(flt) else []
        if not topics and not t.has_wildcard(flt):
            self._sub_refused(rec.filter, rc.TOPIC_FILTER_INVALID,
                              f"{flt!r} has no lockmq topic")
            return rc.TOPIC_FILTER_INVALID
        code = rec.qos
        for topic in topics:
            got = self._join(sub, topic, fresh=not resumed and topic not in rec.topics)
            if got is not None and not t.has_wildcard(flt):
                self._sub_refused(rec.filter, got[0], got[1])
                self._leave(sub, forget=True)
                return got[0]
        self.subs[rec.filter] = sub
        if self.session is not None:
            self.session.subs[rec.filter] = rec
        return code

    def _send_states(self, rec: SubRecord, states: Any, retain: bool) -> None:
        """Lock states to a ``lockmq/devices/...`` subscription (QoS 0: a state is
        replaced by the next, never queued)."""
        out = bytearray()
        for name, payload in states:
            out += c.Publish(name, payload, 0, retain).encode(self.version)
        self.write(bytes(out))

    def device_states_changed(self, changed: list[tuple[str, bytes]]) -> None:
        """Locks' states changed: to the subscriptions that match them."""
        for flt, rec in self.state_subs.items():
            self._send_states(rec, [x for x in changed if t.matches(flt, x[0])], retain=False)

    def _send_retained(self, rec: SubRecord) -> None:
        """The retained messages a new subscription matches (those it may read)."""
        srv = self.server
        out = bytearray()
        for name, payload, qos in srv.retained.matching(rec.filter):
            topic = t.to_lockmq(name)
            try:
                srv.rights.check_consume(self.principal, topic, t.private_cluster(
                    owner_of(self.principal), self.client_id, rec.filter, topic))
            except SecurityError:
                continue
            q = min(qos, rec.qos)
            pid = 0
            if q:
                pid = self._take_pid()
                self.inflight[pid] = None
            props = {"subscription_id": rec.sub_id} if rec.sub_id else {}
            out += c.Publish(name, payload, q, True, False, pid, props).encode(self.version)
            srv.stats.inc("mqtt_retained_sent")
        self.write(bytes(out))

    def _exact_ok(self, flt: str) -> bool:
        try:
            t.to_lockmq(flt)
            return True
        except t.TopicError:
            return False

    def _sub_refused(self, flt: str, code: int, message: str) -> None:
        self.server.stats.inc("mqtt_subscribe_refused")
        self.server.log("mqtt_subscribe_refused", client=self.client_id, filter=flt[:120],
                        reason=f"0x{code:02x}", message=message, level="warning")

    def join_new_topic(self, topic: str) -> None:
        """A topic appeared: wildcard subscriptions that match it join it (from its
        first record: it is newer than the subscription)."""
        name = t.to_mqtt(topic)
        for sub in self.subs.values():
            if topic not in sub.joined and t.has_wildcard(sub.filter) \
                    and t.matches(sub.filter, name):
                self._join(sub, topic, fresh=False)
                self.server.session_changed(self)

    def _join(self, sub: Sub, topic: str, fresh: bool) -> tuple[int, str] | None:
        """Join (or create) the cluster of ``sub`` on ``topic``; ``fresh``: a private
        cluster new to this session starts at the topic's end (MQTT: a subscription
        gets what is published after it). Returns (reason, message) if refused."""
        srv = self.server
        private = sub.group is None
        name = t.private_cluster(owner_of(self.principal), self.client_id, sub.filter, topic) \
            if private \
            else t.shared_cluster(sub.group or "", sub.filter, topic)
        try:
            srv.rights.check_consume(self.principal, topic, name)
        except SecurityError as exc:
            return reason_of(exc), message_of(exc)
        new = name not in srv.core.cluster_owners
        try:
            cluster = srv.core.cluster(name, topic, srv.ordered or sub.rec.ordered,
                                       principal=self.principal)
        except srv.cluster_error as exc:
            code = rc.NOT_AUTHORIZED if exc.code == "FORBIDDEN" else (
                rc.QUOTA_EXCEEDED if exc.code == "LIMIT_EXCEEDED" else rc.IMPLEMENTATION_SPECIFIC)
            return code, exc.message
        if private and new and fresh and not cluster.members:
            cluster.reset_to(srv.core.queue_end(topic))
            srv.core.spawn(srv.core.save_positions())   # now, not at the next flush
        cap = self.recv_max
        member = srv.new_member(len(sub.joined) + 1, f"mqtt:{self.client_id}"[:120], self.peer,
                                self._wake, cap)
        j = Joined(sub, cluster, member, private)
        sub.joined[topic] = j
        if topic not in sub.rec.topics:
            sub.rec.topics.append(topic)
        member.notify = lambda m, j=j: self._pump(j)   # type: ignore[misc]
        cluster.join(member)
        return None

    def _wake(self, member: "Member") -> None:   # replaced per member in _join
        pass

    def _on_unsubscribe(self, p: c.Unsubscribe) -> None:
        reasons = []
        for f in p.filters:
            sub = self.subs.pop(f, None)
            if sub is None and self.state_subs.pop(f, None) is not None:
                if self.session is not None:
                    self.session.subs.pop(f, None)
                reasons.append(0)
                continue
            if sub is None:
                reasons.append(0x11)   # no subscription existed
                continue
            self._leave(sub, forget=True)
            if self.session is not None:
                self.session.subs.pop(f, None)
            reasons.append(0)
        self.send(c.UnsubAck(p.packet_id, reasons))
        self.server.session_changed(self)

    def _leave(self, sub: Sub, forget: bool) -> None:
        """Leave every cluster of ``sub``; ``forget``: delete its private clusters."""
        for pid, got in list(self.inflight.items()):
            if got is not None and got[0].sub is sub:
                del self.inflight[pid]
        for j in sub.joined.values():
            self._starved.discard(j)
            j.member.unpark()
            j.cluster.leave(j.member, reason="mqtt unsubscribe")
            if forget and j.private:
                self.server.core.forget_cluster(j.cluster.name)
        sub.joined.clear()

    # -- deliveries ---------------------------------------------------------------------

    def _pump(self, j: Joined) -> None:
        """Lease one batch of what ``j``'s cluster has for us, if there is room, and
        come back for more on the next loop iteration: the other members the cluster
        notified in the same wake get their batch first (members compete), and a
        pull that comes back empty leaves the member waiting for the cluster's next
        notify (``wants_notify``)."""
        if self.closed or j.sub.joined.get(j.cluster.topic) is not j:
            return
        qos = j.sub.rec.qos
        room = min(self.recv_max - len(self.inflight), _PULL_BATCH) if qos else _PUMP_BATCH
        if room <= 0 or self._paused:
            self._starved.add(j)
            return
        self._starved.discard(j)
        leases = j.cluster.pull(j.member, room)
        if not leases:
            return
        out = bytearray()
        for lease in leases:
            data = self._deliver(j, lease, qos)
            if data is not None:
                out += data
        self.server.stats.inc("mqtt_delivered", len(leases))
        self.write(bytes(out))   # one write for the batch
        if not qos:
            j.cluster.ack_many(j.member, [(x.wire, x.deliveries) for x in leases])
        asyncio.get_running_loop().call_soon(self._pump, j)

    def _pump_starved(self) -> None:
        if not self._starved or self.closed:
            return
        for j in list(self._starved):
            self._starved.discard(j)
            self._pump(j)

    def _deliver(self, j: Joined, lease: "Lease", qos: int) -> bytes | None:
        """The PUBLISH of one lease (None: it cannot be sent to this client)."""
        rec = lease.rec
        srv = self.server
        pid = 0
        if qos:
            pid = self._take_pid()
            self.inflight[pid] = (j, lease.wire, lease.deliveries)
        if srv.settings.envelope == "json":
            payload = json_envelope(rec, lease.deliveries)
        else:
            payload = rec.payload
        props = None
        if self.version == c.V5:
            pr: dict[str, Any] = {"user_property": user_properties(rec, lease.deliveries)}
            if j.sub.rec.sub_id:
                pr["subscription_id"] = j.sub.rec.sub_id
            props = c.encode_props(pr)
        topic = self._topic_fields.get(rec.topic)
        if topic is None:
            if len(self._topic_fields) > 256:
                self._topic_fields.clear()
            topic = self._topic_fields[rec.topic] = c.encode_str(t.to_mqtt(rec.topic))
        data = c.publish_bytes(topic, payload, qos, lease.deliveries > 1, pid, props)
        if self.client_max_packet and len(data) > self.client_max_packet:
            # the client cannot take it: not sent (as the spec says), nacked, logged
            srv.stats.inc("mqtt_too_large_for_client")
            srv.log("mqtt_too_large_for_client", client=self.client_id, size=len(data),
                    limit=self.client_max_packet, msg=rec.msg_id, level="warning")
            if qos:
                del self.inflight[pid]
                j.cluster.nack(j.member, lease.wire, lease.deliveries, None,
                               "larger than the MQTT client's maximum packet size")
            return None
        return data

    def _take_pid(self) -> int:
        pid = self._next_pid
        while pid in self.inflight or pid in self._released:
            pid = pid % _MAX_PID + 1
        self._next_pid = pid % _MAX_PID + 1
        return pid

    def _on_puback(self, p: c.Ack) -> None:
        if p.packet_id not in self.inflight:
            return   # a lease we gave up (expired, released): nothing to finish
        got = self.inflight.pop(p.packet_id)
        if got is None:
            return   # a retained message: no lease
        j, wire, delivery = got
        try:
            if p.reason >= 0x80:
                j.cluster.nack(j.member, wire, delivery, None,
                               f"MQTT PUBACK reason 0x{p.reason:02x}")
            else:
                j.cluster.ack(j.member, wire, delivery)
                self.server.stats.inc("mqtt_acked")
        except self.server.cluster_error:
            self.server.stats.inc("mqtt_late_acks")   # expired and leased again meanwhile
        j.cluster.settled(j.member)
        self._pump_starved()

    # -- publishes ----------------------------------------------------------------------

    def _check_topic(self, topic: str) -> None:
        """The rights to publish to ``topic`` (and under this client id), once each."""
        if topic in self._topics_ok:
            return
        rights = self.server.rights
        rights.check_publish(self.principal, topic)
        if not self._producer_ok:
            rights.check_producer_id(self.principal, self.producer_id)
            self._producer_ok = True
            last = self.server.core.last_seq(self.producer_id)
            self._seq = 0 if last is None else last + 1
        if len(self._topics_ok) >= 64:
            self._topics_ok.clear()
        self._topics_ok.add(topic)

    @property
    def producer_id(self) -> str:
        """The producer id of this client's records: its client id."""
        return self.client_id

    def _on_publish(self, p: c.Publish) -> None:
        srv = self.server
        if "topic_alias" in p.props:
            raise c.MqttError(0x94, "topic aliases are not offered (Topic Alias Maximum 0)")
        if p.qos == 2 and p.packet_id in self._qos2:
            self.send(c.Ack(c.PUBREC, p.packet_id))   # a resend: stored already
            return
        srv.stats.inc("mqtt_publish_received")
        if p.topic.startswith(t.COMMAND_PREFIX):
            self._on_command(p)
            return
        try:
            topic = t.to_lockmq(p.topic)
            self._check_topic(topic)
        except t.TopicError as exc:
            self._pub_refused(p, rc.TOPIC_NAME_INVALID, str(exc))
            return
        except SecurityError as exc:
            self._pub_refused(p, reason_of(exc), message_of(exc))
            return
        seq = self._seq
        self._seq = (seq + 1) & 0xFFFFFFFF
        rec = NewRecord(topic, self.producer_id, seq, int(time.time() * 1000), p.payload)
        self._pubs.append((rec, p.qos, p.packet_id, p.topic if p.retain else None))
        if len(self._pubs) >= srv.max_publish_batch:
            self._submit_publishes()

    def _pub_refused(self, p: c.Publish, code: int, message: str) -> None:
        srv = self.server
        srv.stats.inc("mqtt_publish_refused")
        srv.log("mqtt_publish_refused", client=self.client_id, topic=p.topic[:120],
                reason=f"0x{code:02x}", message=message, level="warning")
        if self.version == c.V311:
            # 3.1.1 cannot say no to a PUBLISH: close rather than acknowledge it
            self._close(f"publish refused: {message}")
            return
        if p.qos == 1:
            self.send(c.Ack(c.PUBACK, p.packet_id, code, {"reason_string": message[:200]}))
        elif p.qos == 2:
            self.send(c.Ack(c.PUBREC, p.packet_id, code, {"reason_string": message[:200]}))
        else:
            self.disconnect(code, message)

    def _submit_publishes(self) -> None:
        pubs = self._pubs
        if not pubs:
            return
        self._pubs = []
        self._pending_in += len(pubs)
        if self._pending_in > self.server.settings.max_inflight * 4 and not self._reading_paused \
                and self.transport is not None:
            self._reading_paused = True   # the store is behind: stop reading this client
            self.transport.pause_reading()
        self.server.publisher.submit([x[0] for x in pubs],
                                     lambda res, pubs=pubs: self._stored(pubs, res))

    def _stored(self, pubs: list[tuple[NewRecord, int, int, str | None]],
                results: list[Any]) -> None:
        """The store's answer: PUBACK (PUBREC) what is durable; refuse what is not."""
        srv = self.server
        self._pending_in -= len(pubs)
        if self._reading_paused and self._pending_in <= srv.settings.max_inflight \
                and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        out = bytearray()
        for (rec, qos, pid, retain), res in zip(pubs, results):
            ok = not isinstance(res, Exception)
            if ok:
                srv.stats.inc("mqtt_publish_stored")
                if retain is not None and not srv.retained.put(retain, rec.payload, qos):
                    srv.stats.inc("mqtt_retained_refused")
            if not qos:
                continue
            if ok:
                if qos == 2:
                    self._qos2.add(pid)
                out += c.Ack(c.PUBACK if qos == 1 else c.PUBREC, pid).encode(self.version)
                continue
            code = rc.IMPLEMENTATION_SPECIFIC if isinstance(res, InvalidRecord) else (
                rc.SERVER_BUSY if getattr(res, "code", 0) in (int(ErrorCode.BUSY),
                                                             int(ErrorCode.STORAGE_FULL))
                else rc.UNSPECIFIED_ERROR)
            srv.stats.inc("mqtt_publish_failed")
            if self.version == c.V311:
                self.write(bytes(out))
                self._close(f"publish not stored: {res}")
                return
            out += c.Ack(c.PUBACK if qos == 1 else c.PUBREC, pid, code,
                         {"reason_string": str(getattr(res, "message", res))[:200]}
                         ).encode(self.version)
        if out:
            self.write(bytes(out))

    def _publish_will(self) -> None:
        w = self.will
        self.will = None
        if w is None or not self._producer_ok_for_will(w):
            return
        seq = self._seq
        self._seq = (seq + 1) & 0xFFFFFFFF
        rec = NewRecord(t.to_lockmq(w.topic), self.producer_id, seq, int(time.time() * 1000),
                        w.payload)
        self.server.stats.inc("mqtt_wills")
        self.server.publisher.submit([rec], lambda res: None)

    def _producer_ok_for_will(self, w: c.Will) -> bool:
        try:
            self._check_topic(t.to_lockmq(w.topic))
            return True
        except (t.TopicError, SecurityError):
            return False

    # -- commands -----------------------------------------------------------------------

    def _on_command(self, p: c.Publish) -> None:
        """``lockmq/command/<SN>/<kind>``: a downlink command (see docs/mqtt.md)."""
        response = p.props.get("response_topic") or f"{t.RESULT_PREFIX}{self.client_id}"
        corr = p.props.get("correlation_data")
        props: dict[str, Any] = {"content_type": "application/json"}
        if corr is not None:
            props["correlation_data"] = corr
        sender = CommandSender(self.principal, lambda: self.closed,
                               lambda payload: self.send_direct(response, payload, props))
        self.server.stats.inc("mqtt_commands")
        submit_command(self.server.commands, sender, p.topic[len(t.COMMAND_PREFIX):], p)
        self._command_acked(p, sender)

    def _command_acked(self, p: c.Publish, sender: CommandSender) -> None:
        """PUBACK a command once the command path took it (or with its refusal)."""
        if not p.qos:
            return
        ptype = c.PUBACK if p.qos == 1 else c.PUBREC
        if sender.refusal is not None and self.version == c.V5:
            code, msg = sender.refusal
            self.send(c.Ack(ptype, p.packet_id, code, {"reason_string": msg[:200]}))
            return
        if p.qos == 2:
            self._qos2.add(p.packet_id)
        self.send(c.Ack(ptype, p.packet_id))

    def send_direct(self, name: str, payload: bytes, props: dict[str, Any]) -> None:
        """A PUBLISH straight to this client, not stored (a command's result), QoS 0."""
        if self.closed:
            return
        self.send(c.Publish(name, payload, 0, False, False, 0,
                            props if self.version == c.V5 else {}))
