"""The ``[replication]`` table: a primary and its standby (docs/operators.md,
"Standby gateway")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lockmq.config import _apply


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
            promote`` does, because a primary that is merely cut off from its standby
            would otherwise go on acking beside a second primary (split brain).
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
        if self.sync_timeout_s <= 0 or self.promote_after_s < 0:
            raise ValueError("replication.sync_timeout_s must be positive and "
                             "replication.promote_after_s >= 0")
        if not 4096 <= self.fetch_max_bytes <= 16 << 20 or not 0 <= self.fetch_wait_ms <= 30_000:
            raise ValueError("replication.fetch_max_bytes must be in [4096, 16 MiB] and "
                             "replication.fetch_wait_ms in [0, 30000]")
