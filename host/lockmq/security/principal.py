"""Who is on a connection, and what it may do.

A :class:`Principal` is returned by ``Guard.authenticate`` and kept by the broker
for the life of the connection. Every check is a plain method call on it.

Patterns are shell-style globs (``fnmatch``, case-sensitive): ``lock.*`` matches
``lock.events``; ``*`` alone matches everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any

from lockmq.protocol import table as _protocol_table

from .errors import IdentityMismatch, PermissionDenied
from .identity import RESERVED_PREFIX, is_internal_topic, system_topic_refusal

LOCK = "lock"
SERVICE = "service"
ADMIN = "admin"

# -- command rights per kind ----------------------------------------------------------
#: Command kinds a token may be granted (``--command KINDS:SN_GLOB``), by name -> the
#: protocol's ``CommandKind`` value: the rows of the protocol table (the right a kind
#: needs is its one name).
KIND_NAMES = _protocol_table.names(_protocol_table.COMMAND_KINDS)
COMMAND_KINDS = {name: code for code, name in KIND_NAMES.items()}
#: The right to change where a lock connects to (a CONFIG of its broker list or TLS
#: settings). Implies ``config``; never implied by ``*``: it must be named.
NETWORK_RIGHT = "config.network"
#: What a command right from before per-kind rights (a bare SN glob) still allows:
#: the two kinds such tokens were made for (remote unlock, card-list sync). Config,
#: reboot and firmware updates need a reissued token naming them.
LEGACY_COMMAND_KINDS = frozenset({"unlock", "cards"})


@lru_cache(maxsize=1024)
def parse_command_right(entry: str) -> tuple[frozenset[str], str, bool]:
    """``"unlock,cards:LOCK-*"`` -> ``({"unlock", "cards"}, "LOCK-*", False)``.

    ``*`` as a kind means every kind except ``config.network``. A bare ``SN_GLOB``
    (a token made before per-kind rights) gives :data:`LEGACY_COMMAND_KINDS` and
    ``legacy=True``. SNs never contain ``:``, so the split is unambiguous. Raises
    ``ValueError`` for an unknown kind or an empty part.
    """
    kinds_text, sep, glob = entry.rpartition(":")
    if not sep:
        if not entry:
            raise ValueError("empty command right")
        return LEGACY_COMMAND_KINDS, entry, True
    kinds: set[str] = set()
    for name in kinds_text.split(","):
        name = name.strip()
        if name == "*":
            kinds.update(COMMAND_KINDS)
        elif name in COMMAND_KINDS or name == NETWORK_RIGHT:
            kinds.add(name)
        else:
            raise ValueError(f"unknown command kind {name!r} in {entry!r} (kinds: "
                             f"{', '.join(COMMAND_KINDS)}, {NETWORK_RIGHT}, *)")
    if NETWORK_RIGHT in kinds:
        kinds.add("config")
    if not glob:
        raise ValueError(f"command right {entry!r} has no SN pattern")
    return frozenset(kinds), glob, False


def _command_rights(entries: tuple[str, ...]) -> list[tuple[frozenset[str], str, bool]]:
    out = []
    for e in entries:
        try:
            out.append(parse_command_right(e))
        except ValueError:   # a malformed stored right grants nothing (fail closed)
            continue
    return out


@dataclass(frozen=True)
class Permissions:
    """What a token allows.

    Attributes:
        publish: topic patterns the holder may publish to.
        consume: ``TOPIC:CLUSTER`` patterns the holder may consume as (a bare
            pattern without ``:`` means any cluster on those topics).
        command: command rights, each ``KINDS:SN_GLOB`` (kinds ``unlock``,
            ``cards``, ``config``, ``config.network``, ``reboot``, ``fw-update`` or
            ``*``, comma-separated; see :func:`parse_command_right`). A bare
            ``SN_GLOB`` is a right from before kinds existed: unlock and cards only.
        admin: everything, including the admin operations -- except writing system
            topics, which needs ``system`` too.
        system: patterns of ``$`` system topics the holder may publish to. The only
            right that reaches ``$`` topics: ``publish`` patterns (even ``*`` or
            ``$*``) and ``admin`` never do. Broker-internal topics (``$retry.*``,
            ``$dlq.*``, ``$devices``, ``$heartbeats`` ...) stay refused even with it.
    """

    publish: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    admin: bool = False
    system: tuple[str, ...] = ()
    #: the standby's right: the ``replica.*`` admin ops (read the whole log) and no
    #: other (lockmq.replication)
    replicate: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (stored in the registry)."""
        d: dict[str, Any] = {"publish": list(self.publish), "consume": list(self.consume),
                             "command": list(self.command), "admin": self.admin}
        if self.system:
            d["system"] = list(self.system)
        if self.replicate:
            d["replicate"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Permissions":
        """Inverse of :meth:`to_dict`."""
        return cls(publish=tuple(d.get("publish", ())), consume=tuple(d.get("consume", ())),
                   command=tuple(d.get("command", ())), admin=bool(d.get("admin", False)),
                   system=tuple(d.get("system", ())),
                   replicate=bool(d.get("replicate", False)))

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first malformed command right."""
        for entry in self.command:
            parse_command_right(entry)

    def describe(self) -> str:
        """One-line summary for ``lockmq tokens list``."""
        if self.admin:
            return "admin" + (f" system={','.join(self.system)}" if self.system else "")
        parts = []
        for label, pats in (("publish", self.publish), ("consume", self.consume),
                            ("command", self.command), ("system", self.system)):
            if pats and label == "command":   # show what legacy rights mean now
                pats = tuple(f"{p}(unlock,cards only)" if ":" not in p else p for p in pats)
            if pats:
                parts.append(f"{label}={','.join(pats)}")
        if self.replicate:
            parts.append("replicate")
        return " ".join(parts) or "(none)"


def _any(patterns: tuple[str, ...], value: str) -> bool:
    return any(fnmatchcase(value, p) for p in patterns)


#: topics whose publish right a principal remembers (then it starts again)
MAY_PUBLISH_CACHE = 256

#: no rights at all (a lock's token permissions): frozen, so one object serves all
NO_PERMISSIONS = Permissions()


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
        token_name: name of the token used (services and admins): the owner key of
            the producer ids and clusters it creates (``identity.owner_of``).
    """

    name: str
    kind: str
    permissions: Permissions = NO_PERMISSIONS
    lock_topics: tuple[str, ...] = ()
    token_id: str = ""
    session_nonce: bytes = b""
    client_nonce: bytes = b""
    session_key: bytes = field(default=b"", repr=False)
    #: provisioned for frame MACs (registry ``need_mac``): on plain TCP the session
    #: is refused without them (SPEC 2 "Per-device policy")
    need_mac: bool = False
    #: the lock's key version when it authenticated: a re-key ends the session
    key_version: int = 0
    peer_ip: str = ""
    tls: bool = False
    token_name: str = ""
    #: topic -> :meth:`may_publish`'s answer: the rights of a principal do not change,
    #: and a lock's every publish asks (glob matching, ~1.5 µs a record otherwise)
    _may_publish: dict[str, bool] = field(default_factory=dict, init=False, repr=False,
                                          compare=False)

    @property
    def is_admin(self) -> bool:
        """Admin tokens may do everything."""
        return self.kind == ADMIN or self.permissions.admin

    @property
    def is_lock(self) -> bool:
        """Whether this is a lock (device key) rather than a token holder."""
        return self.kind == LOCK

    def may_publish(self, topic: str) -> bool:
        """A lock: only to its own topics (system topics never); a token: its patterns
        (each topic's answer remembered: see :meth:`_publish_rule`)."""
        known = self._may_publish.get(topic)
        if known is None:
            known = self._publish_rule(topic)
            if len(self._may_publish) >= MAY_PUBLISH_CACHE:
                self._may_publish.clear()
            self._may_publish[topic] = known
        return known

    def _publish_rule(self, topic: str) -> bool:
        """A lock: only to its own topics (system topics never); a token: its patterns.

        ``$`` system topics: only with the explicit ``system`` right (admins too), and
        broker-internal ones (``$retry.*``, ``$dlq.*``, ``$devices`` ...) never."""
        if topic.startswith(RESERVED_PREFIX):
            if self.is_lock or is_internal_topic(topic):
                return False
            return _any(self.permissions.system, topic)
        if self.is_admin:
            return True
        if self.is_lock:
            return _any(self.lock_topics, topic)
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

    def may_command(self, sn: str, kind: int | None = None, network: bool = False) -> bool:
        """Whether this principal may send a downlink command to lock ``sn``.

        ``kind`` None asks only whether ``sn`` is in the scope of any command right;
        otherwise the right must grant that kind (a ``CommandKind`` value), and
        ``network=True`` (a CONFIG changing the lock's brokers/TLS) needs
        ``config.network``.
        """
        if self.is_admin:
            return True
        if self.is_lock:
            return False
        name = None if kind is None else KIND_NAMES.get(int(kind), "")
        for kinds, glob, _legacy in _command_rights(self.permissions.command):
            if not fnmatchcase(sn, glob):
                continue
            if name is None:
                return True
            if (NETWORK_RIGHT in kinds) if network else (name in kinds):
                return True
        return False

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
            if topic.startswith(RESERVED_PREFIX) and not self.is_lock:
                raise system_topic_refusal(self, topic, is_internal_topic(topic))
            exc = PermissionDenied(f"{self.kind} {self.name} may not publish to {topic!r}",
                                   reason="publish_denied")
            exc.public_message = (  # name the missing right: it says what to ask for
                f"not permitted: lock {self.name} may publish only to its own topics "
                f"(security.lock_topics), not {topic[:130]!r}" if self.is_lock else
                f"not permitted: publishing to {topic[:130]!r} needs the publish right for "
                f"it (lockmq tokens create --publish TOPIC_GLOB)")
            raise exc

    def require_consume(self, topic: str, cluster: str) -> None:
        """:meth:`may_consume` or :class:`PermissionDenied`."""
        if not self.may_consume(topic, cluster):
            exc = PermissionDenied(f"{self.kind} {self.name} may not consume {topic!r} "
                                   f"as {cluster!r}", reason="consume_denied")
            exc.public_message = (
                f"not permitted: consuming {topic[:130]!r} as cluster {cluster[:64]!r} needs "
                f"the consume right for them (lockmq tokens create --consume "
                f"TOPIC_GLOB:CLUSTER_GLOB)")
            raise exc

    def require_command(self, sn: str, kind: int | None = None, network: bool = False) -> None:
        """:meth:`may_command` or :class:`PermissionDenied` (reason ``command_denied``
        -- no right for this SN --, ``command_kind_denied`` or ``command_network_denied``).

        The out-of-scope answer's public message is :data:`COMMAND_DENIED_MESSAGE`,
        the same as the Guard's for an unregistered lock: a token holder cannot tell
        the two apart.
        """
        who = f"{self.kind} {self.name}"
        if not self.may_command(sn):
            exc = PermissionDenied(f"{who} may not command lock {sn!r}", reason="command_denied")
            exc.public_message = COMMAND_DENIED_MESSAGE
            raise exc
        if kind is None or self.may_command(sn, kind, network):
            return
        name = KIND_NAMES.get(int(kind), f"kind {int(kind)}")
        if network:
            exc = PermissionDenied(f"{who} may not change the network settings of {sn!r}",
                                   reason="command_network_denied")
            exc.public_message = (f"not permitted: changing the broker list or TLS settings of "
                                  f"lock {sn!r} needs the command right {NETWORK_RIGHT}")
            name = NETWORK_RIGHT
        else:
            exc = PermissionDenied(f"{who} may not send {name} commands to {sn!r}",
                                   reason="command_kind_denied")
            exc.public_message = (f"not permitted: this token may not send {name} commands to "
                                  f"lock {sn!r}")
        if any(lg and fnmatchcase(sn, g) for _k, g, lg in _command_rights(self.permissions.command)):
            exc.public_message += (" (its command right predates per-kind rights and allows "
                                   "unlock and cards only: reissue it naming the kinds, e.g. "
                                   f"--command '{name}:{sn}')")
        raise exc

    def require_admin_op(self, op: str) -> None:
        """May this principal run admin op ``op``? The ``replicate`` right allows the
        ``replica.*`` ops alone; everything else needs :meth:`require_admin`, and
        ``replica.security`` (token hashes, wrapped keys) the ``replicate`` right."""
        if op.startswith("replica.") and self.permissions.replicate:
            return
        if op == "replica.security":   # token hashes, wrapped keys: the standby alone
            exc = PermissionDenied(f"{self.kind} {self.name} has no replicate right",
                                   reason="admin_denied")
            exc.public_message = ("not permitted: replica.security needs the replicate "
                                  "right (lockmq tokens create --replicate)")
            raise exc
        self.require_admin()

    def require_admin(self) -> None:
        """:attr:`is_admin` or :class:`PermissionDenied`."""
        if not self.is_admin:
            exc = PermissionDenied(f"{self.kind} {self.name} is not an admin",
                                   reason="admin_denied")
            exc.public_message = ("not permitted: this operation needs the admin right "
                                  "(lockmq tokens create --admin)")
            raise exc


#: The one public answer for a command to a lock outside the token's scope *and* for
#: one to an unregistered or disabled lock: byte for byte the same (no SN enumeration).
COMMAND_DENIED_MESSAGE = "not permitted: no right to command this lock, or no such lock"


def anonymous_admin(name: str = "anonymous") -> Principal:
    """The principal of every connection when ``auth = "off"`` (tests only)."""
    return Principal(name=name, kind=ADMIN, permissions=Permissions(admin=True))
