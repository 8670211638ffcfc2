"""Reload without a restart (SIGHUP, ``systemctl reload``): what can change live.

A reload reads the configuration again with the validator the start runs
(:func:`lockmq.config.load_config` with ``check_files``). A file it refuses is
logged (``config_reload_refused``) and changes nothing: the broker keeps running on
what it had. Otherwise every changed setting is either applied at once (the tables
below: limits, timeouts, logging, the TLS certificate and key) or named in the log
as ``needs_restart`` and left as it is -- never half-applied. The device and token
registries are reopened on every reload (a file restored or replaced on disk is
read from then on). Connections stay open: the next connection, handshake or
request sees the new values.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from lockmq.config import Config, ConsumersSection

if TYPE_CHECKING:   # the broker imports this module
    from .server import Broker

#: Settings applied to the running broker. Each is read where it is used (the
#: broker's components keep the section objects, never a copy of the value), or has
#: a line in :func:`apply_live`. Anything else needs a restart and is logged so.
LIVE: dict[str, frozenset[str]] = {
    "broker": frozenset({
        "status_request_timeout_s", "status_max_connections", "max_conn_buffer_bytes",
        "max_connections", "handshake_timeout_s", "shutdown_grace_s",
        "log_level", "log_format", "log_file"}),
    "devices": frozenset({"heartbeat_s", "evict_after_s", "heartbeats_topic",
                          "heartbeat_record_gap_s"}),
    # every [consumers] field but those marked RESTART: the clusters read the section
    "consumers": frozenset(f.name for f in dataclasses.fields(ConsumersSection)
                           if not f.metadata.get("restart")),
    "clusters": frozenset({"offsets_retention_ms"}),
    "commands": frozenset({
        "default_expiry_s", "max_expiry_s", "max_pending_per_lock",
        "max_pending_bytes_per_lock", "max_pending_per_sender",
        "max_pending_bytes_per_sender", "max_pending_total", "max_pending_bytes_total",
        "admin_reserve_pct", "lock_max_frame_default", "max_delivery_attempts",
        "result_timeout_s"}),
    "scheduled": frozenset({"max_per_principal", "max_total", "max_bytes_total",
                            "max_horizon_s", "max_sleep_ms", "batch", "refresh_after_s"}),
    "transactions": frozenset({"max_checks", "on_check_limit", "max_pending_per_principal",
                               "max_pending_total"}),
    "security": frozenset({"tls_cert", "tls_key"}),
}

@dataclasses.dataclass
class ReloadPlan:
    """What a new configuration changes: ``table.key`` names."""

    live: list[str]
    needs_restart: list[str]


def _tables(cfg: Config) -> dict[str, dict[str, Any]]:
    out = cfg.to_dict()
    for name in ("store", "security", "replication"):   # plain tables: as written
        out[name] = dict(getattr(cfg, name))
    return out


def plan(old: Config, new: Config) -> ReloadPlan:
    """Which changed settings apply live and which need a restart."""
    before, after = _tables(old), _tables(new)
    live, restart = [], []
    for table in sorted(set(before) | set(after)):
        a, b = before.get(table, {}), after.get(table, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                (live if key in LIVE.get(table, ()) else restart).append(f"{table}.{key}")
    return ReloadPlan(live, restart)


def apply_live(broker: "Broker", new: Config, changes: ReloadPlan) -> None:
    """Copy the live settings of ``new`` into the running broker's sections.

    Raises (before changing any setting) when the new TLS certificate or key, the
    registries or the new log file cannot be opened."""
    ctx = broker.tls_context
    sec = new.security
    if ctx is not None and sec.get("tls_cert"):
        # loads into the running context: new handshakes get the new certificate
        ctx.load_cert_chain(sec["tls_cert"], sec.get("tls_key") or None)
    broker.guard.reopen_registries()
    b = new.broker
    broker.log.reconfigure(b.log_level, b.log_format, b.log_file)
    cfg = broker.config
    for name in changes.live:
        table, key = name.split(".", 1)
        if table == "security":
            cfg.security[key] = new.security.get(key)
        else:
            setattr(getattr(cfg, table), key, getattr(getattr(new, table), key))
    d = cfg.devices
    broker.devices.record_gap_s = d.heartbeat_record_gap_s or d.heartbeat_s
    b = cfg.broker
    broker.connections.limit = min(b.max_connections, broker.fd_limit) if b.max_connections \
        else broker.fd_limit
