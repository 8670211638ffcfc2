"""The northbound bridge: lockmq topics forwarded to an upstream MQTT broker.

The bridge is a member of one consumer cluster per forwarded topic
(``<cluster>.<topic>``, per-lock ordered), so what it forwards is decided by the
commit log and the cluster's persisted position, never by an in-memory queue:

* a record is leased, PUBLISHed upstream at QoS 1, and acked to its cluster only
  when the upstream's PUBACK arrives -- the position moves past it only then;
* while the upstream (or the link) is down the bridge is simply not a member: the
  records wait in the log, bounded by retention, and ``lockmq_cluster_backlog``
  shows how many (the bridge's lag);
* a disconnect releases the leases at once; after the reconnect they are sent again,
  in order (QoS 1: the upstream may see a record twice, never miss one, and never a
  lock's records out of order: the cluster has one record of a lock in flight at once);
* a broker restart resumes from the saved position.

Commands from the upstream (``command_filter``): the bridge subscribes to that filter
upstream; a PUBLISH whose topic ends ``<SN>/<kind>`` goes through the broker's command
path with the rights of ``command_token`` (the guard decides, as for any command), and
the result is published upstream, QoS 0, on the MQTT 5 response topic (with the
correlation data) or on ``<the command's topic>/result``.

State for ``/metrics``: :meth:`Bridge.gauges` (connected, in flight, last error time),
counters in the broker's stats (``bridge_*``).
"""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import time
from typing import Any, Callable

from lockmq.config import BridgeSection

from lockmq.background import stop_task
from lockmq.security import SecurityError

from . import codec as c
from . import topics as t
from .commands import CommandSender, submit_command
from .delivery import json_envelope, user_properties
from .rights import Rights, message_of


class _Link:
    """One connection to the upstream: the members it holds and the leases in flight."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.inflight: dict[int, tuple[Any, Any, int, int]] = {}   # pid -> (cluster, member, wire, delivery)
        self.members: list[tuple[Any, Any]] = []
        self.next_pid = 1
        self.closed = False


class Bridge:
    """Forwards records to an upstream MQTT broker (see the module docstring)."""

    def __init__(self, settings: BridgeSection, core: Any, log: Any, stats: Any,
                 new_member: Callable[..., Any], commands: Any = None,
                 rights: Rights | None = None) -> None:
        self.s = settings
        self.commands = commands
        self.rights = rights
        #: whose rights upstream commands have (None: no commands from upstream)
        self.command_principal: Any = None
        self.core = core
        self.log = log
        self.stats = stats
        self.new_member = new_member
        self.clusters: list[Any] = []
        self.state = "starting"
        self.last_error = ""
        self.last_error_ts = 0.0
        self.link: _Link | None = None
        self._task: asyncio.Task[Any] | None = None
        self._stopping = False
        host, _, port = settings.upstream.rpartition(":")
        self.host, self.port = host, int(port)
        self.client_id = settings.client_id or f"lockmq-bridge-{socket.gethostname()}"[:64]

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Open the clusters (claimed by the broker) and start the link task."""
        for topic in self.s.topics:
            name = t._short(f"{self.s.cluster}.{topic}", 100)
            self.clusters.append(self.core.cluster(name, topic, True))
        if self.s.command_filter and self.rights is not None:
            try:
                self.command_principal = self.rights.authenticate(
                    None, self.s.command_token.encode(), "127.0.0.1", False)
            except SecurityError as exc:   # the bridge runs; upstream commands do not
                self.log("bridge_command_token_refused", error=message_of(exc),
                         level="error")
        self._task = asyncio.ensure_future(self._run())
        self.log("bridge_started", upstream=self.s.upstream, topics=",".join(self.s.topics),
                 cluster=self.s.cluster)

    async def stop(self) -> None:
        """Leave the clusters (leases go back) and close the link."""
        self._stopping = True
        await stop_task(self._task, self.log)
        if self.link is not None:
            self._drop(self.link, "bridge stopping")

    def gauges(self) -> dict[str, tuple[str, float]]:
        """The bridge's state for ``/metrics``."""
        lag = sum(cl.backlog() for cl in self.clusters)
        return {
            "bridge_connected": ("1 while the bridge's link to the upstream MQTT broker is up",
                                 1.0 if self.state == "connected" else 0.0),
            "bridge_lag": ("Records of the bridged topics not yet acknowledged by the "
                           "upstream", float(lag)),
            "bridge_inflight": ("Records sent upstream, waiting for their PUBACK",
                                float(len(self.link.inflight)) if self.link else 0.0),
            "bridge_last_error_timestamp_seconds": (
                "When the link last failed (Unix time; 0: never); the error is in the "
                "bridge_down log line", self.last_error_ts),
        }

    # -- the link ---------------------------------------------------------------------

    async def _run(self) -> None:
        delay = self.s.reconnect_min_s
        while not self._stopping:
            self.state = "connecting"
            try:
                await self._session()
                delay = self.s.reconnect_min_s   # it was up: start the backoff again
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- any failure: log, back off, again
                self._failed(exc)
            if self._stopping:
                return
            self.state = "waiting"
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, self.s.reconnect_max_s)

    def _failed(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.last_error_ts = time.time()
        self.stats.inc("bridge_errors")
        self.log("bridge_down", upstream=self.s.upstream, error=self.last_error,
                 level="warning")

    async def _session(self) -> None:
        s = self.s
        ctx = None
        if s.tls:
            ctx = ssl.create_default_context(cafile=s.ca_file or None)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=ctx), 10)
        v = s.version
        dec = c.Decoder(1 << 20, v)
        conn = c.Connect(self.client_id, v, True, s.keepalive_s,
                         s.username or None, s.password.encode() if s.password else None)
        writer.write(conn.encode())
        link = _Link(writer)
        try:
            ack = await asyncio.wait_for(self._read_one(reader, dec), 10)
            if not isinstance(ack, c.ConnAck):
                raise ConnectionError(f"upstream answered CONNECT with packet type {ack.ptype}")
            if ack.reason:
                raise ConnectionError(f"upstream refused the bridge: CONNACK reason "
                                      f"0x{ack.reason:02x}")
            self.link = link
            self.state = "connected"
            self.stats.inc("bridge_connects")
            self.log("bridge_up", upstream=s.upstream, client=self.client_id)
            for cl in self.clusters:
                m = self.new_member(len(link.members) + 1, f"bridge:{self.client_id}",
                                    s.upstream, lambda _m: None, s.max_inflight)
                m.notify = lambda _m, cl=cl, m=m: self._pump(link, cl, m)
                link.members.append((cl, m))
                cl.join(m)
            if self.command_principal is not None:
                writer.write(c.Subscribe(1, [c.Subscription(s.command_filter, 1)]).encode(v))
            await self._read_loop(reader, dec, link)
            raise ConnectionError("upstream closed the connection")
        finally:
            self._drop(link, "link down")

    async def _read_one(self, reader: asyncio.StreamReader, dec: c.Decoder) -> Any:
        while True:
            p = dec.next_packet()
            if p is not None:
                return p
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("upstream closed the connection")
            dec.feed(data)

    async def _read_loop(self, reader: asyncio.StreamReader, dec: c.Decoder,
                         link: _Link) -> None:
        ka = self.s.keepalive_s
        last_ping = time.monotonic()
        while not link.closed:
            try:
                data = await asyncio.wait_for(reader.read(65536), ka / 2)
            except asyncio.TimeoutError:
                if time.monotonic() - last_ping > ka * 1.5:
                    raise ConnectionError("upstream silent past the keepalive") from None
                link.writer.write(c.Ping(c.PINGREQ).encode(self.s.version))
                continue
            if not data:
                return
            last_ping = time.monotonic()
            dec.feed(data)
            while (p := dec.next_packet()) is not None:
                if p.ptype == c.PUBACK:
                    self._acked(link, p)
                elif p.ptype == c.PUBLISH:
                    self._command(link, p)
                elif p.ptype == c.DISCONNECT:
                    raise ConnectionError(f"upstream disconnected: reason 0x{p.reason:02x}")

    def _command(self, link: _Link, p: c.Publish) -> None:
        """A PUBLISH from the upstream: a command if it matches ``command_filter``."""
        v = self.s.version
        if self.command_principal is None or not t.matches(self.s.command_filter, p.topic):
            if p.qos:
                link.writer.write(c.Ack(c.PUBACK, p.packet_id).encode(v))
            return
        levels = p.topic.split("/")
        response = p.props.get("response_topic") or f"{p.topic}/result"
        props: dict[str, Any] = {"content_type": "application/json"}
        if "correlation_data" in p.props:
            props["correlation_data"] = p.props["correlation_data"]

        def reply(payload: bytes) -> None:
            if not link.closed:
                link.writer.write(c.Publish(response, payload, 0, False, False, 0,
                                            props if v == c.V5 else {}).encode(v))

        sender = CommandSender(self.command_principal, lambda: link.closed, reply)
        self.stats.inc("bridge_commands")
        submit_command(self.commands, sender, "/".join(levels[-2:]), p)
        if p.qos:
            reason = sender.refusal[0] if sender.refusal and v == c.V5 else 0
            link.writer.write(c.Ack(c.PUBACK, p.packet_id,   # (subscribed at QoS 1)
                                    reason).encode(v))

    def _drop(self, link: _Link, why: str) -> None:
        """The link is gone: leave every cluster (the leases go back at once)."""
        if link.closed:
            return
        link.closed = True
        if self.link is link:
            self.link = None
        for cl, m in link.members:
            cl.leave(m, reason=f"bridge {why}")
        link.members.clear()
        link.inflight.clear()
        try:
            link.writer.close()
        except Exception:  # noqa: BLE001
            pass
        if self.state == "connected":
            self.state = "disconnected"

    # -- forwarding ---------------------------------------------------------------------

    def _pump(self, link: _Link, cl: Any, m: Any) -> None:
        """Lease what ``cl`` has for the bridge, while the upstream window has room."""
        if link.closed:
            return
        room = self.s.max_inflight - len(link.inflight)
        if room <= 0:
            return   # a PUBACK pumps again
        leases = cl.pull(m, min(room, 64))
        if not leases:
            return
        out = bytearray()
        v = self.s.version
        for lease in leases:
            pid = link.next_pid
            while pid in link.inflight:
                pid = pid % 0xFFFF + 1
            link.next_pid = pid % 0xFFFF + 1
            link.inflight[pid] = (cl, m, lease.wire, lease.deliveries)
            rec = lease.rec
            props: dict[str, Any] = {}
            if self.s.envelope == "json":
                payload = json_envelope(rec, lease.deliveries)
            else:
                payload = rec.payload
            if v == c.V5:
                props["user_property"] = user_properties(rec, lease.deliveries)
            name = self.s.remote_prefix + t.to_mqtt(rec.topic)
            if self.s.per_lock_topics:
                name = f"{name}/{rec.sn}"
            out += c.Publish(name, payload, 1, False, lease.deliveries > 1, pid,
                             props).encode(v)
        link.writer.write(bytes(out))
        self.stats.inc("bridge_sent", len(leases))
        asyncio.get_running_loop().call_soon(self._pump, link, cl, m)

    def _acked(self, link: _Link, p: c.Ack) -> None:
        got = link.inflight.pop(p.packet_id, None)
        if got is None:
            return
        cl, m, wire, delivery = got
        try:
            if p.reason >= 0x80:   # the upstream refused it: retry later (then dead letter)
                cl.nack(m, wire, delivery, None, f"upstream PUBACK reason 0x{p.reason:02x}")
                self.stats.inc("bridge_refused")
            else:
                cl.ack(m, wire, delivery)
                self.stats.inc("bridge_forwarded")
        except Exception:  # noqa: BLE001 -- the lease expired meanwhile: sent again later
            self.stats.inc("bridge_late_acks")
        cl.settled(m)
        for cl2, m2 in link.members:
            self._pump(link, cl2, m2)
