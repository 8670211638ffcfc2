"""The MQTT listener: its sockets, the live connections, the persistent sessions and
the timers that join wildcard subscriptions to new topics and expire sessions.

Built by the broker from narrow collaborators (the core, the publish path, the
command path, the guard, the log and counters) when ``[mqtt] enabled`` is true;
see docs/mqtt.md for what a client sees.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from functools import partial
from typing import Any, Callable

from lockmq.config import ANY_FREE_PORT, Config, MqttSection

from . import topics as t
from .codec import reason as rc
from .bridge import Bridge
from .connection import MqttConnection
from .rights import Rights
from .devicestate import DeviceStates
from .retained import RetainedStore
from .sessions import Session, SessionStore, session_key
from .webhooks import WebhookSink


class MqttServer:
    """The MQTT side of one broker (see the module docstring)."""

    def __init__(self, config: Config, core: Any, publisher: Any, commands: Any, guard: Any,
                 log: Any, stats: Any, new_member: Callable[..., Any],
                 cluster_error: type[Exception]) -> None:
        self.config = config
        #: the broker's cluster Member class, and the error its clusters raise (handed
        #: in by the broker: this package never imports lockmq.broker)
        self.new_member = new_member
        self.cluster_error = cluster_error
        self.settings: MqttSection = config.mqtt
        self.core = core
        self.publisher = publisher
        self.commands = commands
        self.rights = Rights(guard, getattr(commands, "admission", None))
        self.guard = guard
        self.log = log
        self.stats = stats
        self.ordered = config.consumers.ordered_default
        self.max_publish_batch = config.broker.max_publish_batch
        self.sessions = SessionStore(config.broker.data_dir)
        self.retained = RetainedStore(config.broker.data_dir)
        self.device_states = DeviceStates(core, config.devices.events_topic)
        self.conns: set[MqttConnection] = set()
        #: the connection of each live session, by session key
        self.live: dict[str, MqttConnection] = {}
        self.servers: list[asyncio.base_events.Server] = []
        self.port = 0
        self.tls_port = 0
        self._known_topics: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False
        #: the northbound bridge (``[bridge] enabled``), or None
        self.bridge: Bridge | None = None
        #: the webhook sink (``[webhooks] enabled``), or None
        self.webhooks: WebhookSink | None = None

    # -- life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the bridge if configured, load the sessions and listen (plain and/or
        TLS) if ``[mqtt] enabled``."""
        if self.config.bridge.enabled:
            self.bridge = Bridge(self.config.bridge, self.core, self.log, self.stats,
                                 self.new_member, self.commands, self.rights)
            self.bridge.start()
        if self.config.webhooks.enabled:
            self.webhooks = WebhookSink(self.config.webhooks, self.core, self.log, self.stats,
                                        self.new_member, self.cluster_error)
            self.webhooks.start()
        s = self.settings
        if not s.enabled:
            return
        self.sessions.load()
        self.retained.load()
        now = int(time.time() * 1000)
        for sess in self.sessions.sessions.values():
            if not sess.disconnected_ms:   # connected when the broker stopped
                sess.disconnected_ms = now
        self._known_topics = set(self.core.topics())
        self.device_states.follow()
        self.rights.on_revoked(self._revoked)
        host = s.host or self.config.broker.host
        loop = asyncio.get_running_loop()
        for port, tls in ((s.port, False), (s.tls_port, True)):
            if not port:
                continue
            ctx = self.guard.tls_context() if tls else None
            if tls and ctx is None:
                raise ValueError("mqtt.tls_port needs [security] tls_cert and tls_key")
            srv = await loop.create_server(
                partial(MqttConnection, self, tls), host, 0 if port == ANY_FREE_PORT else port,
                backlog=self.config.broker.backlog, reuse_address=True, ssl=ctx,
                ssl_handshake_timeout=self.config.broker.handshake_timeout_s if tls else None)
            bound = srv.sockets[0].getsockname()[1]
            for sock in srv.sockets:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            self.servers.append(srv)
            if tls:
                self.tls_port = bound
            else:
                self.port = bound
            self.guard.log_listener(bound, tls)
        self._arm()
        self.log("mqtt_started", port=self.port or None, tls_port=self.tls_port or None,
                 sessions=len(self.sessions.sessions), envelope=s.envelope)

    def gauges(self) -> dict[str, tuple[str, float]]:
        """``/metrics`` gauges: connections, sessions, the bridge's state."""
        out = {"mqtt_connections": ("MQTT connections open now", float(len(self.conns))),
               "mqtt_sessions": ("MQTT sessions kept (live or waiting for their client)",
                                 float(len(self.sessions.sessions) + sum(
                                     1 for k in self.live if k not in self.sessions.sessions)))}
        if self.bridge is not None:
            out.update(self.bridge.gauges())
        return out

    async def stop(self) -> None:
        """Stop listening, tell every client the server is going away, save sessions."""
        self._closing = True
        if self.bridge is not None:
            await self.bridge.stop()
        if self.webhooks is not None:
            await self.webhooks.stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for srv in self.servers:
            srv.close()
        for conn in list(self.conns):
            conn.disconnect(rc.SERVER_SHUTTING_DOWN, "the broker is shutting down")
        for srv in self.servers:
            try:
                await asyncio.wait_for(srv.wait_closed(), 1.0)
            except asyncio.TimeoutError:
                pass
        if self.sessions.sessions:
            self.sessions.save()
        self.log("mqtt_stopped")

    def _revoked(self, matches: Callable[[Any], bool], why: str) -> int:
        """Principals stopped standing: their MQTT connections end at once (MQTT 5:
        DISCONNECT 0x87). Returns 0: no pending item was cancelled here."""
        n = 0
        for conn in list(self.conns):
            if conn.principal is not None and not conn.closed and matches(conn.principal):
                conn.disconnect(rc.NOT_AUTHORIZED, f"session ended: {why}")
                n += 1
        if n:
            self.stats.inc("mqtt_sessions_revoked", n)
        return 0

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(
            self.settings.topic_scan_ms / 1000.0, self._tick)

    def _tick(self) -> None:
        """New topics to the wildcard subscriptions; expired sessions away."""
        self._timer = None
        if self._closing:
            return
        try:
            topics = set(self.core.topics())
            new = sorted(x for x in topics - self._known_topics if t.mappable(x))
            self._known_topics = topics
            if new:
                for conn in list(self.live.values()):
                    for topic in new:
                        conn.join_new_topic(topic)
            self._expire_sessions()
            changed = self.device_states.follow()
            if changed:
                for conn in list(self.live.values()):
                    conn.device_states_changed(changed)
        except Exception as exc:  # noqa: BLE001 -- the timer must keep going
            self.log("mqtt_tick_failed", error=repr(exc), level="error")
        self._arm()

    # -- sessions -------------------------------------------------------------------------

    def new_client_id(self) -> str:
        """A client id for a client that sent none (MQTT 5 Assigned Client Identifier)."""
        return "auto-" + secrets.token_hex(8)

    def open_session(self, conn: MqttConnection, owner: str, client_id: str, clean: bool,
                     expiry_s: int) -> bool:
        """Bind ``conn`` to its session (taking it over from an older connection);
        returns MQTT's "session present"."""
        key = session_key(owner, client_id)
        old = self.live.get(key)
        self.live[key] = conn
        if old is not None and old is not conn:
            self.stats.inc("mqtt_takeovers")
            old.disconnect(rc.SESSION_TAKEN_OVER, "another connection took this session")
            if old.session is not None and not old.session.expiry_s:
                self._end_session(old.session)   # it ended with its connection
        saved = self.sessions.get(owner, client_id)
        if saved is not None and (clean or saved.expired(time.time() * 1000)):
            self._end_session(saved)
            saved = None
        present = saved is not None
        sess = saved or Session(owner, client_id)
        sess.expiry_s = expiry_s
        sess.disconnected_ms = 0
        conn.session = sess
        if expiry_s:
            self.sessions.put(sess)
        elif saved is not None:
            self.sessions.drop(sess)
        return present

    def session_changed(self, conn: MqttConnection) -> None:
        """A persistent session's subscriptions changed: save them."""
        s = conn.session
        if s is not None and s.expiry_s and self.live.get(s.key) is conn:
            self.sessions.put(s)

    def set_expiry(self, conn: MqttConnection, expiry_s: int) -> None:
        """An MQTT 5 DISCONNECT changed the session expiry."""
        s = conn.session
        if s is not None:
            s.expiry_s = min(expiry_s, self.settings.max_session_expiry_s)

    def session_closed(self, conn: MqttConnection) -> None:
        """``conn`` closed: its session waits for it (persistent) or ends."""
        s = conn.session
        if s is None or self.live.get(s.key) is not conn:
            return   # taken over: the new connection owns the session now
        del self.live[s.key]
        if not s.expiry_s:
            self._end_session(s)
            return
        s.disconnected_ms = int(time.time() * 1000)
        self.sessions.put(s)

    def _expire_sessions(self) -> None:
        now = time.time() * 1000
        for s in list(self.sessions.sessions.values()):
            if s.key not in self.live and s.expired(now):
                self.stats.inc("mqtt_sessions_expired")
                self.log("mqtt_session_expired", client=s.client_id, owner=s.owner)
                self._end_session(s)

    def _end_session(self, s: Session) -> None:
        """Forget a session and the private clusters of its subscriptions."""
        for rec in s.subs.values():
            group, _flt = t.split_shared(rec.filter)
            if group is not None:
                continue
            for topic in rec.topics:
                name = t.private_cluster(s.owner, s.client_id, rec.filter, topic)
                c = self.core.clusters.get(name)
                if c is None or not c.members:
                    self.core.forget_cluster(name)
        self.sessions.drop(s)

    def matching_topics(self, flt: str) -> list[str]:
        """The lockmq topics an MQTT filter matches now."""
        return [x for x in self.core.topics()
                if t.mappable(x) and t.matches(flt, t.to_mqtt(x))]


async def start_mqtt(config: Config, core: Any, publisher: Any, commands: Any, guard: Any,
                     log: Any, stats: Any, new_member: Callable[..., Any],
                     cluster_error: type[Exception]) -> MqttServer | None:
    """The broker's hook: the MQTT listener (``[mqtt] enabled``), the bridge
    (``[bridge] enabled``) and the webhooks (``[webhooks] enabled``) started; None
    when none is on."""
    if not (config.mqtt.enabled or config.bridge.enabled or config.webhooks.enabled):
        return None
    srv = MqttServer(config, core, publisher, commands, guard, log, stats, new_member,
                     cluster_error)
    await srv.start()
    return srv
