"""The ``[replication]`` table: a primary and its standby (docs/operators.md,
"Standby gateway")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lockmq.config_base import _apply


#: a self-promoting standby waits at least this much longer than the primary's fence
FENCE_MARGIN_S = 2.0


@dataclass
class ReplicationSettings:
    """Attributes:
        role: ``"primary"`` (default: serves clients, answers a standby's fetches) or
            ``"standby"`` (follows ``primary``; serves no clients until promoted).
        primary: ``host:port`` of the primary (standby only).
        token: the admin token the standby presents to the primary.
        sync: primary only: a PUBLISH_ACK waits until the standby has the record
            durably (RocketMQ's SYNC_MASTER).
        sync_timeout_s: how long a sync primary waits for a silent standby before it
            degrades to async (and says so in its log and metrics).
        promote_after_s: a standby promotes itself after the primary has been
            unreachable this long; 0 (default) = never: only ``lockmq standby
            promote`` does. Safe only against a fenced primary (``fence_after_s``):
            the standby then promotes itself only if the primary it followed is
            fenced, it was in sync, and ``promote_after_s`` is at least the
            primary's ``fence_after_s`` + 2 s; without a fence a primary merely cut
            off from its standby would go on acking beside a second primary (split
            brain), and the standby says so in its log.
        fence_after_s: primary only, needs ``sync = true``: the primary acks writes
            only while its standby follows in sync; before the standby has caught up
            and once it has been silent this long, publishes are answered
            SHUTTING_DOWN ("fenced") instead of acked, and never degrade to async.
            A standby that promotes itself (``promote_after_s``) therefore never
            serves beside a primary that still acks. 0 (default) = no fence.
        fetch_max_bytes: most log bytes one fetch answer carries.
        fetch_wait_ms: how long the primary holds a fetch that finds nothing new.
        registry_every_s: standby only: how often it asks for the primary's security
            registry (``security.db``; copied only when it changed).
    """

    role: str = "primary"
    primary: str = ""
    token: str = ""
    sync: bool = False
    sync_timeout_s: float = 5.0
    promote_after_s: float = 0.0
    fence_after_s: float = 0.0
    fetch_max_bytes: int = 1 << 20
    fetch_wait_ms: int = 500
    registry_every_s: float = 1.0

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> "ReplicationSettings":
        """Build from the ``[replication]`` table; raises ``ValueError`` naming a bad key."""
        s = cls()
        _apply(s, table, "replication")   # the checks every config section gets
        s.validate()
        return s

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first setting out of range."""
        if self.role not in ("primary", "standby"):
            raise ValueError("replication.role must be 'primary' or 'standby'")
        if self.role == "standby" and ":" not in self.primary:
            raise ValueError("replication.primary (host:port) is required for a standby")
        if self.registry_every_s <= 0:
            raise ValueError("replication.registry_every_s must be positive")
        if self.fence_after_s < 0:
            raise ValueError("replication.fence_after_s must be >= 0 (0 = no fence)")
        if self.fence_after_s and not self.sync:
            raise ValueError("replication.fence_after_s needs replication.sync = true (a "
                             "fence guards acks that wait for the standby)")
        if self.sync_timeout_s <= 0 or self.promote_after_s < 0:
            raise ValueError("replication.sync_timeout_s must be positive and "
                             "replication.promote_after_s >= 0")
        if not 4096 <= self.fetch_max_bytes <= 16 << 20 or not 0 <= self.fetch_wait_ms <= 30_000:
            raise ValueError("replication.fetch_max_bytes must be in [4096, 16 MiB] and "
                             "replication.fetch_wait_ms in [0, 30000]")
