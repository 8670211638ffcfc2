"""Settings of lockmq.security: the broker config's ``[security]`` table.

Every limit is a setting with a default sane for a building's gateway. Limits the
broker already owns in ``[broker]`` (``max_connections``, ``max_frame``,
``handshake_timeout_s``, ``max_conn_buffer_bytes``) are read from there by
:meth:`SecurityConfig.from_broker_config` so that each setting exists once.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from lockmq.config_base import ANY_FREE_PORT


@dataclass
class SecurityConfig:
    """Identity, transport and limit settings.

    Attributes:
        data_dir: the broker's data directory; the registry is ``security.db`` in it.
        db_path: override of the registry file (default ``<data_dir>/security.db``).
        master_key_file: 32-byte key that wraps every device key in the registry
            (default ``<data_dir>/master.key``, created 0600 on first use). Keep it
            on another disk or in a secrets store: the registry alone then reveals
            no device key.
        lock_topics: topic patterns a lock may publish to; ``{sn}`` is its own SN.
        allow_plain_tokens_from: addresses that may send a bearer token over plain
            TCP (default loopback only); everyone else must use TLS for tokens.
        max_connections: connections held at once (0 = no limit here).
        max_connections_per_address: connections from one source (one IP
            address, or one network of ``ipv4_prefix`` / ``ipv6_prefix``).
        connect_rate: new connections per second from one source (token bucket).
        connect_burst: bucket size of ``connect_rate``.
        limit_exempt_addresses: addresses (or ``a.b.c.d/n`` networks) exempt from
            the per-source limits (the gateway's own services; loopback by default).
        ipv4_prefix: an IPv4 source is its ``/ipv4_prefix`` network (32 = one
            address); the same policy for the connection caps, the connect rate and
            the failed-authentication counters.
        ipv6_prefix: likewise for IPv6 (64: one host usually owns a whole /64, so
            counting single addresses would give it 2^64 budgets). IPv4-mapped IPv6
            addresses count as IPv4.
        auth_timeout_s: time a new connection has to authenticate.
        max_frame_bytes: largest frame accepted.
        preauth_max_frame_bytes: largest frame accepted before the peer has
            authenticated (CONNECT and AUTH are a few hundred bytes). Without it, every
            unauthenticated socket could make the broker buffer ``max_frame_bytes``.
        max_buffered_bytes: bytes buffered for one connection (in and out).
        lock_message_rate: messages per second one lock may publish (0 = no limit).
        lock_message_burst: bucket size of ``lock_message_rate``.
        auth_fail_per_address: failed authentications per source (whatever SN
            they claim) per window; past it, that source's further *failed* attempts
            are answered RATE_LIMITED. A correct answer is never refused.
        auth_fail_per_sn: failed authentications per (source, claimed SN) per
            window; past it, that source's failed attempts for that SN are answered
            RATE_LIMITED. Other sources, and the right key from anywhere, are not
            affected.
        auth_fail_window_s: the failure-counting window.
        nonce_ttl_s: a challenge nonce older than this is refused.
        max_tracked_keys: entries each per-address / per-SN table keeps (LRU).
        command_ttl_s: validity of a signed downlink command.
        tls_cert: PEM server certificate (chain) for TLS; empty = no TLS.
        tls_key: PEM private key of ``tls_cert``.
        tls_port: port of the TLS listener (0 = TLS on the main port instead of
            plain TCP, when a certificate is set; -1 = its own listener on any free
            port, logged as ``tls_port=`` in ``broker_started``).
        tls_client_ca: PEM CA to require client certificates (empty = not required).
        plain_port_enabled: keep a plain-TCP listener for locks without TLS.
        status_token_required: the status page's views that name locks, clusters or
            topics (``/``, ``/summary``, ``/stats``, ``/devices``, ``/clusters``,
            ``/topics``, ``/commands``, ``/history``) answer only a request with
            ``Authorization: Bearer <admin token>`` (401 otherwise). ``/health`` is
            always open.
        metrics_token_required: ``/metrics`` needs a token too (any valid one).
        max_producer_ids_per_principal: producer ids (PUBLISH SNs) one token name
            owns at most; claiming one more forgets its least recently used one
            (see lockmq.security.identity).
        lock_frame_mac: frame MACs for locks on plain TCP (SPEC "Frame MACs"):
            ``"optional"`` (default) applies only to locks registered without a MAC
            policy (``lockmq devices add --no-mac``, or rows older than the policy),
            each such session logged ``lock_without_mac`` (a line a second at most); a lock provisioned for MACs
            (the default) is refused without them whatever this says. ``"required"``:
            every lock on plain TCP must use them. Over TLS they are never required.
        broker_id: this broker's name, sent in CHALLENGE and covered by every lock's
            proof (SPEC 2 "The session transcript"); a lock configured with a
            ``broker_id`` refuses any other broker before it sends a proof. Empty:
            not sent.
    """

    data_dir: str = "./data"
    db_path: str = ""
    master_key_file: str = ""
    lock_topics: list[str] = field(default_factory=lambda: ["lock.*", "locks.{sn}.*"])
    allow_plain_tokens_from: list[str] = field(default_factory=lambda: ["127.0.0.1", "::1"])
    max_connections: int = 0
    max_connections_per_address: int = 64
    connect_rate: float = 20.0
    connect_burst: int = 64
    limit_exempt_addresses: list[str] = field(default_factory=lambda: ["127.0.0.1", "::1"])
    ipv4_prefix: int = 32
    ipv6_prefix: int = 64
    auth_timeout_s: float = 10.0
    max_frame_bytes: int = 1024 * 1024
    preauth_max_frame_bytes: int = 4096
    max_buffered_bytes: int = 4 * 1024 * 1024
    lock_message_rate: float = 200.0
    lock_message_burst: int = 1000
    auth_fail_per_address: int = 20
    auth_fail_per_sn: int = 10
    auth_fail_window_s: float = 60.0
    nonce_ttl_s: float = 30.0
    max_tracked_keys: int = 65536
    command_ttl_s: float = 60.0
    tls_cert: str = ""
    tls_key: str = ""
    tls_port: int = 6843
    tls_client_ca: str = ""
    plain_port_enabled: bool = True
    status_token_required: bool = True
    metrics_token_required: bool = False
    max_producer_ids_per_principal: int = 1024
    lock_frame_mac: str = "optional"
    broker_id: str = ""

    @property
    def registry_path(self) -> str:
        """Path of the SQLite registry (devices, tokens, command counters)."""
        return self.db_path or os.path.join(self.data_dir, "security.db")

    @property
    def master_key_path(self) -> str:
        """Path of the master key file."""
        return self.master_key_file or os.path.join(self.data_dir, "master.key")

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first setting out of range."""
        if self.lock_frame_mac not in ("optional", "required"):
            raise ValueError('security.lock_frame_mac must be "optional" or "required"')
        if self.broker_id:
            from lockmq.protocol import identity_problem
            problem = identity_problem(self.broker_id)
            if problem:
                raise ValueError(f"security.broker_id: {problem}")
        for name in ("max_connections", "lock_message_rate"):
            if getattr(self, name) < 0:
                raise ValueError(f"security.{name} must be >= 0")
        for name in ("max_connections_per_address", "connect_rate", "connect_burst",
                     "auth_timeout_s", "max_frame_bytes", "preauth_max_frame_bytes",
                     "max_buffered_bytes",
                     "lock_message_burst", "auth_fail_per_address", "auth_fail_per_sn",
                     "auth_fail_window_s", "nonce_ttl_s", "max_tracked_keys",
                     "command_ttl_s", "max_producer_ids_per_principal"):
            if getattr(self, name) <= 0:
                raise ValueError(f"security.{name} must be positive")
        if not 512 <= self.preauth_max_frame_bytes <= 65536:
            raise ValueError("security.preauth_max_frame_bytes must be in [512, 65536]")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("security.tls_cert and security.tls_key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("security.tls_client_ca needs security.tls_cert and "
                             "security.tls_key: client certificates are asked for over TLS")
        for name in ("limit_exempt_addresses", "allow_plain_tokens_from"):
            for entry in getattr(self, name):
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(f"security.{name}: {entry!r} is not an "
                                     "IP address or network") from None
        if not 8 <= self.ipv4_prefix <= 32:
            raise ValueError("security.ipv4_prefix must be in [8, 32]")
        if not 32 <= self.ipv6_prefix <= 128:
            raise ValueError("security.ipv6_prefix must be in [32, 128]")
        if not ANY_FREE_PORT <= self.tls_port <= 65535:
            raise ValueError(f"security.tls_port = {self.tls_port} is not a port: write a "
                             "port number, 0 (TLS on the main port) or -1 (any free port)")

    def check_files(self) -> None:
        """Raise ``ValueError`` naming the setting whose file the broker could not use:
        a TLS certificate, key or client CA that is missing, unreadable or does not
        load, or an existing master key readable by others or of the wrong size."""
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            if path and not os.access(path, os.R_OK):
                why = "does not exist" if not os.path.exists(path) else "is not readable"
                raise ValueError(f"security.{name}: {path} {why}")
        if self.tls_cert:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
            except ssl.SSLError as exc:
                raise ValueError(f"security.tls_cert / security.tls_key: {self.tls_cert} and "
                                 f"{self.tls_key} are not a PEM certificate and its private "
                                 f"key ({exc})") from None
            if self.tls_client_ca:
                try:
                    ctx.load_verify_locations(cafile=self.tls_client_ca)
                except ssl.SSLError as exc:
                    raise ValueError(f"security.tls_client_ca: {self.tls_client_ca} is not "
                                     f"a PEM CA certificate ({exc})") from None
        path = self.master_key_path
        if os.path.exists(path):
            st = os.stat(path)
            setting = "security.master_key_file" if self.master_key_file else \
                "broker.data_dir (its master.key)"
            if st.st_mode & 0o077:
                raise ValueError(f"{setting}: {path} is readable by group/others "
                                 f"(mode {st.st_mode & 0o777:o}); chmod 600 it")
            from .keys import KEY_BYTES

            if st.st_size != KEY_BYTES:
                raise ValueError(f"{setting}: {path} must be {KEY_BYTES} bytes, "
                                 f"not {st.st_size}")

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any], **base: Any) -> "SecurityConfig":
        """Build from a ``[security]`` table; unknown keys are an error naming them.

        ``base`` gives values (e.g. from ``[broker]``) that the table may override.
        """
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = dict(base)
        for key, value in table.items():
            if key not in known:
                raise ValueError(f"unknown setting security.{key}")
            kwargs[key] = value
        cfg = cls(**kwargs)
        for f in dataclasses.fields(cls):
            default = getattr(cls(), f.name)
            value = getattr(cfg, f.name)
            if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                setattr(cfg, f.name, float(value))
            elif type(default) is not type(value):
                raise ValueError(f"security.{f.name} must be of type "
                                 f"{type(default).__name__}, not {type(value).__name__}")
            elif isinstance(value, list) and not all(isinstance(x, str) for x in value):
                raise ValueError(f"security.{f.name} must be a list of strings")
        cfg.validate()
        return cfg

    @classmethod
    def from_broker_config(cls, cfg: Any) -> "SecurityConfig":
        """Build from a whole ``lockmq.config.Config`` (``[broker]`` + ``[security]``)."""
        b = cfg.broker
        base = {
            "data_dir": str(b.data_dir),
            "max_connections": int(b.max_connections),
            "max_frame_bytes": int(b.max_frame),
            "auth_timeout_s": float(b.handshake_timeout_s),
            "max_buffered_bytes": int(b.max_conn_buffer_bytes),
        }
        return cls.from_mapping(dict(cfg.security or {}), **base)
