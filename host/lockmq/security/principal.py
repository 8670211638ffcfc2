"""Who is on a connection, and what it may do.

A :class:`Principal` is returned by ``Guard.authenticate`` and kept by the broker
for the life of the connection. Every check is a plain method call on it.

Patterns are shell-style globs (``fnmatch``, case-sensitive): ``lock.*`` matches
``lock.events``; ``*`` alone matches everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from .errors import IdentityMismatch, PermissionDenied

LOCK = "lock"
SERVICE = "service"
ADMIN = "admin"


@dataclass(frozen=True)
class Permissions:
    """What a token allows.

    Attributes:
        publish: topic patterns the holder may publish to.
        consume: ``TOPIC:CLUSTER`` patterns the holder may consume as (a bare
            pattern without ``:`` means any cluster on those topics).
        command: SN patterns of locks the holder may send commands to.
        admin: everything, including the admin operations.
    """

    publish: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    admin: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (stored in the registry)."""
        return {"publish": list(self.publish), "consume": list(self.consume),
                "command": list(self.command), "admin": self.admin}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Permissions":
        """Inverse of :meth:`to_dict`."""
        return cls(publish=tuple(d.get("publish", ())), consume=tuple(d.get("consume", ())),
                   command=tuple(d.get("command", ())), admin=bool(d.get("admin", False)))

    def describe(self) -> str:
        """One-line summary for ``lockmq tokens list``."""
        if self.admin:
            return "admin"
        parts = []
        for label, pats in (("publish", self.publish), ("consume", self.consume),
                            ("command", self.command)):
            if pats:
                parts.append(f"{label}={','.join(pats)}")
        return " ".join(parts) or "(none)"


def _any(patterns: tuple[str, ...], value: str) -> bool:
    return any(fnmatchcase(value, p) for p in patterns)


@dataclass
class Principal:
    """An authenticated identity.

    Attributes:
        name: the lock's SN, or the token's name.
        kind: ``"lock"``, ``"service"`` or ``"admin"``.
        permissions: what a token allows (empty for locks).
        lock_topics: topic patterns a lock may publish to, ``{sn}`` already filled.
        token_id: id of the token used (services and admins).
        session_nonce: broker nonce of the session (locks); binds downlink commands
            to this session.
        client_nonce: the lock's nonce of the session.
        session_key: the lock's frame-MAC key for this session (SPEC "Frame MACs"),
            derived from its device key and both nonces; empty for tokens.
        peer_ip: address it authenticated from.
        tls: whether the connection is TLS.
    """

    name: str
    kind: str
    permissions: Permissions = field(default_factory=Permissions)
    lock_topics: tuple[str, ...] = ()
    token_id: str = ""
    session_nonce: bytes = b""
    client_nonce: bytes = b""
    session_key: bytes = field(default=b"", repr=False)
    peer_ip: str = ""
    tls: bool = False

    @property
    def is_admin(self) -> bool:
        """Admin tokens may do everything."""
        return self.kind == ADMIN or self.permissions.admin

    @property
    def is_lock(self) -> bool:
        """Whether this is a lock (device key) rather than a token holder."""
        return self.kind == LOCK

    def may_publish(self, topic: str) -> bool:
        """A lock: only to its own topics (system topics never); a token: its patterns."""
        if self.is_admin:
            return True
        if self.is_lock:
            return not topic.startswith("$") and _any(self.lock_topics, topic)
        return _any(self.permissions.publish, topic)

    def may_consume(self, topic: str, cluster: str) -> bool:
        """Whether this principal may join ``cluster`` on ``topic``. Never a lock."""
        if self.is_admin:
            return True
        if self.is_lock:
            return False
        for pat in self.permissions.consume:
            tpat, sep, cpat = pat.partition(":")
            if fnmatchcase(topic, tpat) and (not sep or fnmatchcase(cluster, cpat)):
                return True
        return False

    def may_command(self, sn: str) -> bool:
        """Whether this principal may send a downlink command to lock ``sn``."""
        if self.is_admin:
            return True
        if self.is_lock:
            return False
        return _any(self.permissions.command, sn)

    def may_receive_command(self, sn: str) -> bool:
        """A lock receives only its own commands."""
        return self.is_lock and sn == self.name

    def check_frame_sn(self, sn: str | bytes | None) -> None:
        """Frames after connect are bound to the authenticated identity.

        A lock's frames must carry its own SN (or none); a service's frames carry its
        token name (or none). Raises :class:`IdentityMismatch` otherwise.
        """
        if sn is None or sn == "" or sn == b"":
            return
        if isinstance(sn, (bytes, bytearray)):
            try:
                sn = bytes(sn).decode("ascii")
            except UnicodeDecodeError:
                raise IdentityMismatch(f"{self.kind} {self.name} sent a non-ASCII SN",
                                       reason="sn_mismatch") from None
        if sn != self.name and not self.is_admin:
            raise IdentityMismatch(f"{self.kind} {self.name} sent a frame claiming SN {sn!r}",
                                   reason="sn_mismatch")

    def require_publish(self, topic: str) -> None:
        """:meth:`may_publish` or :class:`PermissionDenied`."""
        if not self.may_publish(topic):
            raise PermissionDenied(f"{self.kind} {self.name} may not publish to {topic!r}",
                                   reason="publish_denied")

    def require_consume(self, topic: str, cluster: str) -> None:
        """:meth:`may_consume` or :class:`PermissionDenied`."""
        if not self.may_consume(topic, cluster):
            raise PermissionDenied(f"{self.kind} {self.name} may not consume {topic!r} "
                                   f"as {cluster!r}", reason="consume_denied")

    def require_command(self, sn: str) -> None:
        """:meth:`may_command` or :class:`PermissionDenied`."""
        if not self.may_command(sn):
            raise PermissionDenied(f"{self.kind} {self.name} may not command lock {sn!r}",
                                   reason="command_denied")

    def require_admin(self) -> None:
        """:attr:`is_admin` or :class:`PermissionDenied`."""
        if not self.is_admin:
            raise PermissionDenied(f"{self.kind} {self.name} is not an admin",
                                   reason="admin_denied")


def anonymous_admin(name: str = "anonymous") -> Principal:
    """The principal of every connection when ``auth = "off"`` (tests only)."""
    return Principal(name=name, kind=ADMIN, permissions=Permissions(admin=True))
