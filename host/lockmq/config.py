"""The broker's configuration: one TOML file, every limit a setting with a default.

``lockmq broker`` runs on the embedded defaults below (port 6800 as in the paper,
data in ``./data``). A TOML file given with ``--config`` changes any of them; the
command-line flags (``--port``, ``--data-dir`` ...) override the file. Each table of
the file maps to one dataclass here::

    [broker]        # network, limits per connection, auth, logging
    port = 6800
    [devices]       # heartbeats and eviction
    [consumers]     # leases, in-flight caps, retries, dead letters, ordering
    [clusters]      # consumer-cluster lifecycle: expiry of unused clusters
    [commands]      # downlink commands to locks
    [registry]      # discovery: register with the campus registries
    [store]         # passed to lockmq.store.StoreConfig (durability, retention ...)
    [security]      # passed to lockmq.security (keys, tokens, rate limits)

An unknown table or key is an error that names it: a typo must not silently fall
back to a default. :func:`validate_config` is the one validator: ``lockmq broker
--check-config`` and the broker's start both run it, so they refuse the same files
with the same one-line :class:`ConfigError` (file, ``table.key``, what is wrong).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from lockmq.config_base import (ANY_FREE_PORT, AUTH_MODES, ROCKETMQ_LEVELS_S, ConfigError,
                                _apply, _toml_value, check_auth_mode)

#: ``field(metadata=RESTART)``: a setting a reload cannot apply to the running broker
#: (``lockmq.broker.reload`` lists it under ``needs_restart``).
RESTART = {"restart": True}

#: ``[security]`` keys that used to exist and must not be accepted silently.
_REMOVED_SECURITY_KEYS = {
    "require_auth": 'authentication has one switch: [broker] auth = "required" | "off"; '
                    "remove [security] require_auth",
}


@dataclass
class BrokerSection:
    """Network, per-connection limits, authentication and logging.

    Attributes:
        host: address to listen on.
        port: TCP port of the lockmq protocol (the paper's 6800).
        status_port: HTTP status page and metrics (0 disables it; -1 = any free
            port, the one bound is logged as ``status_port=`` in ``broker_started``).
        status_host: address of the status page (default loopback only).
        status_request_timeout_s: a status-page request must be read, answered and
            written within this many seconds in all (a header trickled every few
            seconds does not keep it open); past it: 408 and close.
        status_max_connections: status-page connections open at once; more are
            answered 503 and closed at once.
        data_dir: the store's directory (commit log, indexes, consume positions).
        backlog: listen backlog asked of the kernel (capped by net.core.somaxconn).
        max_frame: largest frame accepted, in bytes (checked before buffering).
        max_conn_buffer_bytes: unsent bytes queued for one connection above which the
            broker stops reading from it until the peer drains its socket.
        max_connections: connections held at once; 0 = as many as the open-file
            limit allows (minus a reserve for log files).
        handshake_timeout_s: time a new connection has to finish CONNECT/AUTH.
        auth: ``"required"`` (default; every connection authenticates through
            lockmq.security) or ``"off"`` (tests and development: any claimed
            identity is accepted, every principal may do everything). The one
            switch for authentication: any other spelling (``false``, ``"none"``,
            ``"OFF"`` ...) is a configuration error, and ``[security]`` has no
            setting that turns authentication off.
        max_publish_batch: most publish frames handed to the store in one append.
        position_flush_ms: how often consumer positions are saved.
        retention_interval_s: how often the store's retention (``[store]
            retention_ms`` / ``retention_bytes``) is enforced; segments a consumer
            cluster still needs are kept unless the size limit forces it.
        shutdown_grace_s: time given to in-flight writes on SIGTERM/SIGINT.
        log_level: DEBUG, INFO, WARNING or ERROR.
        log_format: ``"kv"`` (key=value, one line per event) or ``"json"``.
        log_file: file the log lines are appended to (created owner-only); empty =
            stderr (journald under systemd). Reopened when logrotate moves it away.
    """

    host: str = "0.0.0.0"
    port: int = 6800
    status_port: int = 6801
    status_host: str = "127.0.0.1"
    status_request_timeout_s: float = 10.0
    status_max_connections: int = 16
    data_dir: str = "./data"
    backlog: int = 4096
    max_frame: int = 1024 * 1024
    max_conn_buffer_bytes: int = 4 * 1024 * 1024
    max_connections: int = 0
    handshake_timeout_s: float = 10.0
    auth: str = "required"
    max_publish_batch: int = 4096
    position_flush_ms: int = 200
    retention_interval_s: float = 60.0
    shutdown_grace_s: float = 5.0
    log_level: str = "INFO"
    log_format: str = "kv"
    log_file: str = ""


@dataclass
class DevicesSection:
    """Heartbeats and the online list (RocketMQ NameServer: 30 s / 120 s).

    Attributes:
        heartbeat_s: interval told to clients in CONNECT_ACK.
        evict_after_s: a connection silent this long is closed and, for a lock,
            reported ``evicted`` on ``$devices``.
        sweep_interval_s: how often silence is checked.
        events_topic: system topic of online/offline/evicted events.
        heartbeats_topic: system topic where each lock heartbeat is written as JSON
            (lock health; the Spark offline report reads it); empty = off.
        heartbeat_record_gap_s: at most one heartbeat record per lock is stored per
            interval of this many seconds, whatever the lock sends (0 = heartbeat_s).
            Every HEARTBEAT is still answered and still counts as a sign of life.
    """

    heartbeat_s: float = 30.0
    evict_after_s: float = 120.0
    sweep_interval_s: float = 5.0
    events_topic: str = "$devices"
    heartbeats_topic: str = "$heartbeats"
    heartbeat_record_gap_s: float = 0.0


@dataclass
class ConsumersSection:
    """Consumer clusters: leases, caps, retries and dead letters.

    Attributes:
        visibility_timeout_ms: an unacked delivery is redelivered after this long.
        max_inflight_per_member: leased messages one member may hold.
        max_inflight_per_cluster: leased (or held for ordering) messages per cluster.
        max_pull: most messages returned by one PULL.
        max_retries: nacks before a message goes to ``$dlq.<cluster>`` (RocketMQ: 16).
        retry_levels_s: backoff of the n-th retry (the last level repeats).
        time_scale: multiplies every retry delay and the visibility timeout
            (0.001 makes RocketMQ's levels milliseconds, for tests).
        ordered_default: per-lock ordering when SUBSCRIBE does not say.
        start: where a new cluster starts: ``"earliest"`` (all retained messages)
            or ``"latest"`` (only messages published after it first subscribes).
        max_retry_held: due retry messages moved to the ready queue at most, per
            cluster; the rest stay in their retry topic until there is room.
        max_window: most queue offsets between a cluster's saved position (its
            oldest unfinished message) and its read position; beyond it the cluster
            reads nothing new until the oldest is acked, retried or expires
            (RocketMQ's consumeConcurrentlyMaxSpan). Bounds memory and what a
            restart redelivers.
        lease_sweep_ms: how often expired leases are looked for.
        max_subscriptions_per_connection: subscriptions one connection holds at
            once; one more is refused with LIMIT_EXCEEDED.
        max_clusters_per_owner: consumer clusters one principal (token name) may own
            (each keeps a position file on disk); one more is refused with
            LIMIT_EXCEEDED until an admin deletes one (``clusters.delete``). Admins
            are not limited.

    The broker's consumer clusters read this very object (``lockmq.broker.clusters``
    takes it), so a reload that changes a field here changes them at once; a field
    marked ``RESTART`` is read once at start (``lockmq.broker.reload`` derives its
    list of live settings from these fields).
    """

    visibility_timeout_ms: int = 30_000
    max_inflight_per_member: int = 1024
    max_inflight_per_cluster: int = 16_384
    max_pull: int = 512
    max_retries: int = 16
    retry_levels_s: list[float] = field(default_factory=lambda: list(ROCKETMQ_LEVELS_S))
    time_scale: float = 1.0
    ordered_default: bool = False
    start: str = "earliest"
    max_retry_held: int = 100_000
    max_window: int = 100_000
    lease_sweep_ms: int = field(default=100, metadata=RESTART)   # (the sweep timer's period)
    max_subscriptions_per_connection: int = 64
    max_clusters_per_owner: int = 32

    def retry_level(self, retries: int) -> int:
        """Level (index into ``retry_levels_s``) of retry number ``retries`` (1-based);
        the last level repeats."""
        return min(max(retries, 1), len(self.retry_levels_s)) - 1

    def level_delay_ms(self, level: int) -> float:
        """Delay of a level, scaled by ``time_scale``."""
        return self.retry_levels_s[level] * 1000.0 * self.time_scale

    def level_for_delay(self, delay_ms: float) -> int:
        """The first level at least ``delay_ms`` long (the last if none is)."""
        for i in range(len(self.retry_levels_s)):
            if self.level_delay_ms(i) >= delay_ms:
                return i
        return len(self.retry_levels_s) - 1

    def retry_delay_ms(self, retries: int) -> float:
        """Backoff before retry number ``retries`` (1-based); the last level repeats."""
        return self.level_delay_ms(self.retry_level(retries))


@dataclass
class ClustersSection:
    """The life cycle of consumer clusters.

    Attributes:
        offsets_retention_ms: a cluster with no member connected and no committed
            progress for this long is expired: its position, owner, topic binding
            and retry state are deleted (logged and counted), as Kafka expires a
            group's offsets (``offsets.retention.minutes``). 7 days; -1 keeps
            clusters forever. The last activity is saved with the cluster's
            position, so the clock survives restarts.
    """

    offsets_retention_ms: int = 7 * 24 * 3600 * 1000

    def offsets_retention(self) -> int | None:
        """``offsets_retention_ms``, or None for "forever" (-1)."""
        return None if self.offsets_retention_ms == -1 else self.offsets_retention_ms


@dataclass
class CommandsSection:
    """Downlink commands (remote unlock, card list sync ...).

    Attributes:
        default_expiry_s: expiry of a command that does not give one.
        max_expiry_s: longest expiry accepted.
        max_pending_per_lock: commands waiting for one lock (queued or awaiting its
            result).
        max_pending_bytes_per_lock: bytes of arguments waiting for one lock.
        max_pending_per_sender: commands one token (one principal) may have waiting,
            over all locks: one token cannot fill the broker's queue.
        max_pending_bytes_per_sender: bytes one token may have waiting.
        max_pending_total: commands waiting in the whole broker.
        max_pending_bytes_total: bytes of commands waiting in the whole broker.
        admin_reserve_pct: share of every broker-wide cap (waiting commands here,
            scheduled items and bytes, undecided transactions) that only admin
            principals may use, so that services together cannot crowd out an
            admin's unlock (``lockmq.broker.admission.Admission.share``).
        lock_max_frame_default: the frame limit assumed for a lock that has not
            stated one in CONNECT (older firmware, or not seen since the broker
            started): the firmware's 4 KiB. A command whose frame would be larger is
            refused at submit time.
        max_delivery_attempts: times a command is sent to a lock that drops its
            link without answering it; then the sender gets FAILED (a command that
            breaks the lock's link is not resent forever).
        result_timeout_s: how long a forwarded command waits for the lock's result.
    """

    default_expiry_s: float = 60.0
    max_expiry_s: float = 24 * 3600.0
    max_pending_per_lock: int = 64
    max_pending_bytes_per_lock: int = 256 * 1024
    max_pending_per_sender: int = 1000
    max_pending_bytes_per_sender: int = 4 * 1024 * 1024
    max_pending_total: int = 100_000
    max_pending_bytes_total: int = 64 * 1024 * 1024
    admin_reserve_pct: int = 10
    lock_max_frame_default: int = 4096
    max_delivery_attempts: int = 3
    result_timeout_s: float = 30.0


@dataclass
class ScheduledSection:
    """Scheduled publishes and commands (``lockmq.broker.scheduler``).

    Attributes:
        max_per_principal: scheduled items one token (or lock) may have waiting;
            beyond it a new one gets LIMIT_EXCEEDED.
        max_total: scheduled items waiting in the whole broker (LIMIT_EXCEEDED).
        max_bytes_total: payload bytes held for waiting items (they are kept in
            memory to be written on time; LIMIT_EXCEEDED). Non-admins share all but
            ``commands.admin_reserve_pct`` of it (and of ``max_total``).
        max_bytes_per_principal: payload bytes one token may have waiting.
        max_horizon_s: how far ahead a deliver-at / not-before time may be
            (INVALID_ARGUMENT); keep it below the store's retention.
        max_sleep_ms: longest the timer sleeps between looks at the clock (it wakes
            earlier for the earliest due item).
        batch: items written to their topics in one group commit.
        refresh_after_s: a waiting item stored longer ago than this is written to
            ``$scheduled`` again (same id), so retention never deletes the record of
            a waiting item; keep it well below ``[store] retention_ms``.
    """

    max_per_principal: int = 10_000
    max_total: int = 200_000
    max_bytes_total: int = 256 * 1024 * 1024
    max_bytes_per_principal: int = 32 * 1024 * 1024
    max_horizon_s: float = 40 * 24 * 3600.0
    max_sleep_ms: int = 1000
    batch: int = 2000
    refresh_after_s: float = 24 * 3600.0


@dataclass
class RegistrySection:
    """Discovery: this gateway registers with the campus registries (``lockmq registry``).

    Attributes:
        addresses: ``host:port`` of every registry (empty: do not register). The
            gateway registers with each and heartbeats every ``heartbeat_s``.
        token: the token the registries accept (from their token file).
        name: this gateway's name in the registry (default: the advertised address).
        building: the building this gateway serves (clients may look up by it).
        advertise: ``host:port`` clients should connect to (default:
            ``[broker] host`` and the listening port).
        topics: topics announced even before they hold a record (the topics of
            the store are always announced).
        max_topics: most topics announced (the registry has its own cap too).
        heartbeat_s: seconds between heartbeats (RocketMQ: 30; the registry evicts
            a gateway silent for its ``--evict-after``, 120 s by default).
        insecure: send ``token`` over plain TCP to a registry that is not on this
            host (use TLS instead: ``tls_ca``).
        tls_ca: reach the registries over TLS, verified against this CA (a registry
            run with ``--tls-cert/--tls-key``).
    """

    addresses: list[str] = field(default_factory=list)
    token: str = ""
    name: str = ""
    building: str = ""
    advertise: str = ""
    topics: list[str] = field(default_factory=list)
    max_topics: int = 1000
    heartbeat_s: float = 30.0
    insecure: bool = False
    tls_ca: str = ""

    def validate(self) -> None:
        """Raise ``ValueError`` naming a bad ``registry.*`` setting."""
        if self.heartbeat_s <= 0 or self.max_topics <= 0:
            raise ValueError("registry.heartbeat_s and registry.max_topics must be positive")
        for item in [*self.addresses, *self.topics]:
            if not isinstance(item, str) or not item:
                raise ValueError("registry.addresses and registry.topics must be lists of "
                                 "non-empty strings")


@dataclass
class TransactionsSection:
    """Transactional messages (half messages, check-back; docs/operators.md).

    Attributes:
        check_after_s: a half message with no commit or rollback for this long is
            checked back with a producer of its group (RocketMQ's transactionTimeout).
        check_interval_s: time between two check-backs of the same transaction.
        max_checks: check-backs sent (answered UNKNOWN or not at all) before the
            broker applies ``on_check_limit`` (RocketMQ's transactionCheckMax).
        on_check_limit: what becomes of a transaction still undecided after
            ``max_checks``: "rollback" (dropped) or "commit" (delivered); logged.
        max_pending_per_principal: undecided transactions one principal may hold.
        max_pending_total: undecided transactions in the whole broker.
    """

    check_after_s: float = 6.0
    check_interval_s: float = 60.0
    max_checks: int = 15
    on_check_limit: str = "rollback"
    max_pending_per_principal: int = 10_000
    max_pending_total: int = 100_000

    def validate(self) -> None:
        """Raise ``ValueError`` for an out-of-range setting."""
        if self.on_check_limit not in ("rollback", "commit"):
            raise ValueError("transactions.on_check_limit must be 'rollback' or 'commit'")
        if not (self.check_after_s > 0 and self.check_interval_s > 0 and self.max_checks >= 0
                and self.max_pending_per_principal > 0 and self.max_pending_total > 0):
            raise ValueError("transactions: check_after_s, check_interval_s, "
                             "max_pending_* must be > 0 and max_checks >= 0")


@dataclass
class MqttSection:
    """The MQTT 3.1.1 / 5 listener for backends (``lockmq.mqtt``; docs/mqtt.md).

    Attributes:
        enabled: serve MQTT (off by default: the lockmq protocol is the only way in).
        host: address to listen on ("" = ``[broker] host``).
        port: plain-TCP MQTT port (1883 is MQTT's; -1 = any free port, logged as
            ``port=`` in ``mqtt_started``; 0 = no plain listener). Tokens go over it
            only from ``[security] allow_plain_tokens_from``, as on the main port.
        tls_port: MQTT over TLS with the broker's ``[security] tls_cert``/``tls_key``
            (8883 is MQTT's; -1 = any free port; 0 = none).
        max_packet_bytes: largest MQTT packet accepted (refused before it is buffered).
        max_inflight: QoS 1 deliveries waiting for their PUBACK on one connection (the
            client's Receive Maximum may lower it).
        connect_timeout_s: time a new connection has to send its CONNECT.
        max_keepalive_s: largest keepalive granted (MQTT 5 Server Keep Alive).
        max_session_expiry_s: longest a persistent session outlives its connection
            (MQTT 3.1.1 clean session false: exactly this long).
        envelope: what a delivered PUBLISH carries: "raw" (the record's payload; MQTT 5
            adds sn, seq, msg_id and lock_ts_ms as user properties) or "json" (a JSON
            object with those fields and the payload in base64, for MQTT 3.1.1 clients).
        topic_scan_ms: how often wildcard subscriptions look for new topics.
        max_connections: MQTT connections held at once (more are closed at once;
            ``[security]`` limits per address apply too).
    """

    enabled: bool = False
    host: str = ""
    port: int = 1883
    tls_port: int = 0
    max_packet_bytes: int = 1 << 20
    max_inflight: int = 256
    connect_timeout_s: float = 10.0
    max_keepalive_s: int = 3600
    max_session_expiry_s: int = 7 * 24 * 3600
    envelope: str = "raw"
    topic_scan_ms: int = 1000
    max_connections: int = 10_000

    def validate(self) -> None:
        """Raise ``ValueError`` naming a bad ``mqtt.*`` setting."""
        for name in ("port", "tls_port"):
            if not -1 <= getattr(self, name) <= 65535:
                raise ValueError(f"mqtt.{name} must be a port, 0 (none) or -1 (any free port)")
        for name in ("max_packet_bytes", "max_inflight", "connect_timeout_s",
                     "max_keepalive_s", "max_session_expiry_s", "topic_scan_ms",
                     "max_connections"):
            if getattr(self, name) <= 0:
                raise ValueError(f"mqtt.{name} must be positive")
        if self.envelope not in ("raw", "json"):
            raise ValueError("mqtt.envelope must be 'raw' or 'json'")
        if self.enabled and not self.port and not self.tls_port:
            raise ValueError("mqtt.port and mqtt.tls_port are both 0: nothing to listen on")


@dataclass
class BridgeSection:
    """A northbound bridge: chosen topics forwarded to an upstream MQTT broker (the
    campus's or a cloud's) at least once, as a consumer cluster whose position is
    persisted (``lockmq.mqtt.bridge``; docs/mqtt.md).

    Attributes:
        enabled: run the bridge.
        upstream: ``host:port`` of the upstream MQTT broker.
        topics: lockmq topics to forward (each read by the cluster ``<cluster>.<topic>``,
            per-lock ordered: a lock's records reach the upstream in its order).
        cluster: name of the bridge's consumer clusters (their positions are what the
            bridge has forwarded and the upstream acknowledged).
        remote_prefix: prepended to a record's MQTT topic name upstream
            (``building-7/`` + ``lock/events``).
        per_lock_topics: append the record's SN as a last level upstream
            (``building-7/lock/events/LOCK-0042``: per-device rules and filters).
        client_id: the bridge's MQTT client id upstream ("" = ``lockmq-bridge-<host>``).
        username: user name upstream ("" = none).
        password: password upstream ("" = none).
        version: MQTT version spoken upstream: 4 (3.1.1) or 5.
        tls: connect to the upstream with TLS (system CAs, or ``ca_file``).
        ca_file: CA bundle for the upstream's certificate ("" = the system's).
        envelope: "json" (the record's id fields with the payload in base64: what an
            idempotent upstream consumer keys on) or "raw" (MQTT 5 carries the ids as
            user properties).
        max_inflight: records sent upstream and not yet acknowledged (PUBACK).
        keepalive_s: MQTT keepalive upstream.
        reconnect_min_s: first wait before reconnecting (doubles, with jitter).
        reconnect_max_s: longest wait before reconnecting.
        command_filter: an upstream topic filter whose PUBLISHes are commands for the
            locks (their topic ends ``<SN>/<kind>``, as ``lockmq/command/<SN>/<kind>``)
            ("" = none); they go through the same rights as any command, those of
            ``command_token``.
        command_token: the lockmq token whose rights upstream commands have.
    """

    enabled: bool = False
    upstream: str = ""
    topics: list[str] = field(default_factory=list)
    cluster: str = "bridge"
    remote_prefix: str = ""
    per_lock_topics: bool = False
    client_id: str = ""
    username: str = ""
    password: str = ""
    version: int = 5
    tls: bool = False
    ca_file: str = ""
    envelope: str = "json"
    max_inflight: int = 100
    keepalive_s: int = 30
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    command_filter: str = ""
    command_token: str = ""

    def validate(self) -> None:
        """Raise ``ValueError`` naming a bad ``bridge.*`` setting."""
        if not self.enabled:
            return
        host, sep, port = self.upstream.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError("bridge.upstream must be host:port")
        if not self.topics:
            raise ValueError("bridge.topics must name at least one topic")
        if self.version not in (4, 5):
            raise ValueError("bridge.version must be 4 (MQTT 3.1.1) or 5")
        if self.envelope not in ("raw", "json"):
            raise ValueError("bridge.envelope must be 'raw' or 'json'")
        if self.max_inflight <= 0 or self.keepalive_s <= 0 or self.reconnect_min_s <= 0 \
                or self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("bridge: max_inflight, keepalive_s and reconnect_min_s must be "
                             "positive, reconnect_max_s >= reconnect_min_s")
        if self.command_filter and not self.command_token:
            raise ValueError("bridge.command_filter needs bridge.command_token (whose rights "
                             "upstream commands have)")


@dataclass
class WebhooksSection:
    """Webhooks: each record of chosen topics POSTed to HTTP(S) endpoints, each
    endpoint a consumer cluster (``lockmq.mqtt.webhooks``; docs/mqtt.md).

    Attributes:
        enabled: run the webhook sink.
        endpoints: ``URL`` or ``NAME=URL`` per endpoint (the name goes into its
            clusters' names: ``<cluster>.<name>.<topic>``; default a hash of the URL).
        topics: lockmq topics whose records are POSTed.
        cluster: first part of the endpoints' cluster names.
        secret: HMAC-SHA256 key of the ``X-Lockmq-Signature`` header ("" = unsigned).
        concurrency: POSTs in flight at once per endpoint (all its topics together).
        timeout_s: a POST not answered within this is a failure (retried).
        ordered: per-lock order (a lock's next record waits for the previous one's 2xx).
        ca_file: CA bundle for https endpoints ("" = the system's).
    """

    enabled: bool = False
    endpoints: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    cluster: str = "webhooks"
    secret: str = ""
    concurrency: int = 4
    timeout_s: float = 10.0
    ordered: bool = False
    ca_file: str = ""

    def validate(self) -> None:
        """Raise ``ValueError`` naming a bad ``webhooks.*`` setting."""
        if not self.enabled:
            return
        if not self.endpoints or not self.topics:
            raise ValueError("webhooks.endpoints and webhooks.topics must not be empty")
        for e in self.endpoints:
            url = e.partition("=")[2] if "=" in e and "://" not in e.partition("=")[0] else e
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"webhooks.endpoints: {e!r} is not an http(s) URL")
        if self.concurrency <= 0 or self.timeout_s <= 0:
            raise ValueError("webhooks.concurrency and webhooks.timeout_s must be positive")


@dataclass
class Config:
    """The whole broker configuration (one TOML file)."""

    broker: BrokerSection = field(default_factory=BrokerSection)
    devices: DevicesSection = field(default_factory=DevicesSection)
    consumers: ConsumersSection = field(default_factory=ConsumersSection)
    clusters: ClustersSection = field(default_factory=ClustersSection)
    commands: CommandsSection = field(default_factory=CommandsSection)
    scheduled: ScheduledSection = field(default_factory=ScheduledSection)
    registry: RegistrySection = field(default_factory=RegistrySection)
    transactions: TransactionsSection = field(default_factory=TransactionsSection)
    mqtt: MqttSection = field(default_factory=MqttSection)
    bridge: BridgeSection = field(default_factory=BridgeSection)
    webhooks: WebhooksSection = field(default_factory=WebhooksSection)
    #: Keys of the ``[store]`` table, passed to ``lockmq.store.StoreConfig``.
    store: dict[str, Any] = field(default_factory=dict)
    #: Keys of the ``[security]`` table, passed to ``lockmq.security``.
    security: dict[str, Any] = field(default_factory=dict)
    #: Keys of the ``[replication]`` table (``lockmq.replication.ReplicationSettings``).
    replication: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first setting that is out of range."""
        b, d, c, k = self.broker, self.devices, self.consumers, self.commands
        if not 0 <= b.port <= 65535:
            raise ValueError("broker.port must be in [0, 65535]")
        if not ANY_FREE_PORT <= b.status_port <= 65535:
            raise ValueError(f"broker.status_port = {b.status_port} is not a port: write a "
                             "port number, 0 (no status page) or -1 (any free port)")
        check_auth_mode(b.auth)
        self.transactions.validate()
        if b.log_format not in ("kv", "json"):
            raise ValueError("broker.log_format must be 'kv' or 'json'")
        if b.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("broker.log_level must be DEBUG, INFO, WARNING or ERROR")
        for name in ("backlog", "max_frame", "max_conn_buffer_bytes", "max_publish_batch",
                     "position_flush_ms", "retention_interval_s"):
            if getattr(b, name) <= 0:
                raise ValueError(f"broker.{name} must be positive")
        if b.status_request_timeout_s <= 0 or b.status_max_connections <= 0:
            raise ValueError("broker.status_request_timeout_s and "
                             "broker.status_max_connections must be positive")
        if b.max_frame < 64:
            raise ValueError("broker.max_frame must be at least 64")
        if b.max_connections < 0:
            raise ValueError("broker.max_connections must be >= 0")
        if d.heartbeat_s <= 0 or d.evict_after_s <= d.heartbeat_s or d.sweep_interval_s <= 0:
            raise ValueError("devices: heartbeat_s > 0, evict_after_s > heartbeat_s, "
                             "sweep_interval_s > 0")
        if d.heartbeat_record_gap_s < 0:
            raise ValueError("devices.heartbeat_record_gap_s must be >= 0 (0 = heartbeat_s)")
        if not d.events_topic.startswith("$"):
            raise ValueError("devices.events_topic must be a system topic (start with '$')")
        if d.heartbeats_topic and not d.heartbeats_topic.startswith("$"):
            raise ValueError("devices.heartbeats_topic must be a system topic or empty")
        for name in ("visibility_timeout_ms", "max_inflight_per_member",
                     "max_inflight_per_cluster", "max_pull", "max_retry_held", "max_window",
                     "lease_sweep_ms", "max_subscriptions_per_connection",
                     "max_clusters_per_owner"):
            if getattr(c, name) <= 0:
                raise ValueError(f"consumers.{name} must be positive")
        if c.max_retries < 0:
            raise ValueError("consumers.max_retries must be >= 0")
        if not c.retry_levels_s or any(x < 0 for x in c.retry_levels_s):
            raise ValueError("consumers.retry_levels_s must be a non-empty list of delays >= 0")
        if c.time_scale <= 0:
            raise ValueError("consumers.time_scale must be positive")
        if c.start not in ("earliest", "latest"):
            raise ValueError("consumers.start must be 'earliest' or 'latest'")
        if self.clusters.offsets_retention_ms <= 0 and self.clusters.offsets_retention_ms != -1:
            raise ValueError("clusters.offsets_retention_ms must be positive, or -1 to keep "
                             "clusters forever")
        if k.default_expiry_s <= 0 or k.max_expiry_s < k.default_expiry_s:
            raise ValueError("commands: 0 < default_expiry_s <= max_expiry_s")
        for name in ("max_pending_per_lock", "max_pending_total", "max_pending_bytes_per_lock",
                     "max_pending_per_sender", "max_pending_bytes_per_sender",
                     "max_pending_bytes_total", "max_delivery_attempts"):
            if getattr(k, name) <= 0:
                raise ValueError(f"commands.{name} must be positive")
        if not 0 <= k.admin_reserve_pct < 100:
            raise ValueError("commands.admin_reserve_pct must be in [0, 100)")
        if k.lock_max_frame_default < 64:
            raise ValueError("commands.lock_max_frame_default must be at least 64")
        # one principal must never be able to fill what every service shares
        if k.max_pending_per_sender >= k.max_pending_total * (100 - k.admin_reserve_pct) // 100 \
                or k.max_pending_bytes_per_sender >= \
                k.max_pending_bytes_total * (100 - k.admin_reserve_pct) // 100:
            raise ValueError("commands.max_pending_per_sender / max_pending_bytes_per_sender "
                             "must stay below the services' share of max_pending_total / "
                             "max_pending_bytes_total")
        if k.result_timeout_s <= 0:
            raise ValueError("commands.result_timeout_s must be positive")
        self.registry.validate()
        self.mqtt.validate()
        self.bridge.validate()
        self.webhooks.validate()

    def store_config(self) -> Any:
        """The ``lockmq.store.StoreConfig`` of this broker (``data_dir`` from ``[broker]``)."""
        from lockmq.store.config import StoreConfig

        known = {f.name for f in dataclasses.fields(StoreConfig)}
        for key in self.store:
            if key not in known:
                raise ValueError(f"unknown setting store.{key}")
        kwargs = dict(self.store)
        kwargs["data_dir"] = self.broker.data_dir
        cfg = StoreConfig(**kwargs)
        try:
            cfg.validate()
        except ValueError as exc:   # StoreConfig says "retention_ms ...": name the table
            first = str(exc).split(" ", 1)[0]
            if first in known:
                raise ConfigError(f"store.{exc}", table="store", key=first) from None
            raise
        return cfg

    def security_config(self) -> Any:
        """The ``lockmq.security.SecurityConfig`` of this broker (``[broker]`` +
        ``[security]``); raises ``ValueError`` naming a bad ``[security]`` key."""
        from lockmq.security.config import SecurityConfig

        return SecurityConfig.from_broker_config(self)

    def to_dict(self) -> dict[str, Any]:
        """All settings as plain data (for the ``config`` admin op and the logs)."""
        return dataclasses.asdict(self)


_SECTIONS = {
    "broker": BrokerSection,
    "devices": DevicesSection,
    "consumers": ConsumersSection,
    "clusters": ClustersSection,
    "commands": CommandsSection,
    "scheduled": ScheduledSection,
    "registry": RegistrySection,
    "transactions": TransactionsSection,
    "mqtt": MqttSection,
    "bridge": BridgeSection,
    "webhooks": WebhooksSection,
}


def config_from_dict(data: dict[str, Any], *, check_files: bool = False) -> Config:
    """Build and validate a :class:`Config` from parsed TOML tables (with
    ``check_files``, also the files its settings name: see :func:`validate_config`)."""
    cfg = Config()
    for name, table in data.items():
        if not isinstance(table, dict):
            raise ValueError(f"top-level key {name!r} must be a table ([{name}])")
        if name in _SECTIONS:
            _apply(getattr(cfg, name), table, name)
        elif name == "security":
            for key in table:
                if key in _REMOVED_SECURITY_KEYS:
                    raise ConfigError(f"[security] {key} is not a setting: "
                                      f"{_REMOVED_SECURITY_KEYS[key]} (security.{key})",
                                      table="security", key=key)
            cfg.security.update(table)
        elif name == "store":
            cfg.store.update(table)
        elif name == "replication":   # checked by its own class (lockmq.replication)
            from lockmq.replication.settings import ReplicationSettings
            ReplicationSettings.from_table(table)
            cfg.replication.update(table)
        else:
            raise ValueError(f"unknown table [{name}]")
    validate_config(cfg, files=check_files)
    return cfg


#: ``table.key`` in a validation message: what a ConfigError names.
_SETTING = re.compile(r"\b(broker|devices|consumers|clusters|commands|scheduled|transactions|replication|registry|store|security|mqtt|bridge|webhooks)"
                      r"\.([a-z0-9_]+)")

#: ``[security]`` settings that only the security Guard uses: with ``auth = "off"``
#: the broker would serve plain TCP and never read them.
_TLS_KEYS = ("tls_cert", "tls_key", "tls_client_ca")


def validate_config(cfg: Config, *, files: bool = True) -> None:
    """The one configuration validator: raise :class:`ConfigError` naming the first
    setting the broker would refuse at start.

    ``lockmq broker --check-config`` and ``lockmq broker`` both call it, so a file
    that passes the check is a file the broker starts with. It checks every table's
    values, ``[store]`` and ``[security]`` through their own classes, settings that
    contradict each other (TLS with ``auth = "off"``) and, with ``files``, that the
    files the settings name exist and load (TLS certificate and key, client CA, an
    existing master key) and that the broker's paths work for whoever runs it (the
    data directory can be created and written, the log file opened, an existing
    master key and registry read: lockmq.preflight). Two listeners on one port are
    refused either way.
    """
    try:
        cfg.validate()
        cfg.store_config()
        security = cfg.security_config()
        if cfg.broker.auth == "off":
            for key in _TLS_KEYS:
                if cfg.security.get(key):
                    raise ConfigError(
                        f'security.{key} is set but broker.auth = "off" serves plain TCP '
                        f"only and ignores it: remove it, or set auth = \"required\" to "
                        f"serve TLS", table="security", key=key)
        from lockmq.preflight import check_paths, check_ports

        check_ports(cfg)
        if files:
            security.check_files()
            check_paths(cfg)
    except ConfigError:
        raise
    except ValueError as exc:
        raise named_error(exc) from None


def named_error(exc: ValueError) -> ConfigError:
    """``exc`` as a :class:`ConfigError` whose ``table``/``key`` are the setting its
    message names (``store.retention_ms ...``, ``unknown table [x]``)."""
    if isinstance(exc, ConfigError):
        return exc
    message = str(exc)
    found = _SETTING.search(message)
    if found:
        return ConfigError(message, table=found.group(1), key=found.group(2))
    table = re.search(r"\[(\w+)\]", message)
    return ConfigError(message, table=table.group(1) if table else "")


def load_config(path: str | os.PathLike[str] | None = None,
                overrides: dict[str, dict[str, Any]] | None = None, *,
                check_files: bool = False) -> Config:
    """Read a TOML file (or the defaults when ``path`` is None) and apply overrides.

    ``overrides`` has the same shape as the file: ``{"broker": {"port": 7000}}``.
    Raises :class:`ConfigError` (its message starts with the file) for anything
    :func:`validate_config` refuses; ``check_files`` also checks the files the
    settings name, as the broker does at start.
    """
    data: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as fh:
            try:
                data = tomllib.load(fh)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"not valid TOML: {exc}", file=str(path)) from None
    for name, table in (overrides or {}).items():
        data.setdefault(name, {}).update(table)
    try:
        return config_from_dict(data, check_files=check_files)
    except ValueError as exc:   # the message names table.key; add the file
        error = named_error(exc)
        raise error.in_file(str(path)) if path is not None else error from None


def _attribute_docs(cls: type) -> dict[str, str]:
    """``{attribute: one-line description}`` from a class docstring's Attributes."""
    out: dict[str, str] = {}
    doc = cls.__doc__ or ""
    if "Attributes:" not in doc:
        return out
    current = ""
    for line in doc.split("Attributes:", 1)[1].splitlines():
        text = line.strip()
        if not text:
            continue
        head, sep, rest = text.partition(":")
        if sep and head.isidentifier() and line.startswith(" " * 8) \
                and not line.startswith(" " * 12):
            current = head
            out[current] = rest.strip()
        elif current:
            out[current] += " " + text
    return out


def default_toml() -> str:
    """The defaults as a commented TOML file (``lockmq broker --print-config``)."""
    import textwrap

    cfg = Config()
    lines = ["# lockmq broker configuration (all values are the defaults)"]
    for name, cls in _SECTIONS.items():
        lines.append(f"\n[{name}]")
        docs = _attribute_docs(cls)
        for f in dataclasses.fields(getattr(cfg, name)):
            if f.name in docs:
                lines.extend("# " + x for x in textwrap.wrap(docs[f.name], 86))
            lines.append(f"{f.name} = {_toml_value(getattr(getattr(cfg, name), f.name))}")
    from lockmq.replication.settings import ReplicationSettings
    from lockmq.security.config import SecurityConfig
    from lockmq.store.config import FOREVER, StoreConfig

    # [store] and [security] take data_dir (and the security limits below) from
    # [broker]: written there, they would override it, so they are named, not set.
    from_broker = {"data_dir": "broker.data_dir", "max_connections": "broker.max_connections",
                   "max_frame_bytes": "broker.max_frame",
                   "auth_timeout_s": "broker.handshake_timeout_s",
                   "max_buffered_bytes": "broker.max_conn_buffer_bytes"}
    for name, cls in (("store", StoreConfig), ("security", SecurityConfig),
                      ("replication", ReplicationSettings)):
        lines.append(f"\n[{name}]")
        docs = _attribute_docs(cls)
        obj = cls()
        for f in dataclasses.fields(cls):
            if f.name in docs:
                lines.extend("# " + x for x in textwrap.wrap(docs[f.name], 86))
            if name != "replication" and f.name in from_broker:
                lines.append(f"# {f.name}: from {from_broker[f.name]}")
                continue
            value = getattr(obj, f.name)
            if value is None:   # no limit: TOML has no null, the store spells it -1
                lines.append(f"# {f.name} = {FOREVER}  (the default: no limit)")
            else:
                lines.append(f"{f.name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
