"""The registry's table of gateways: register, heartbeat, lookup, evict (no I/O).

RocketMQ's NameServer keeps the same soft state: every broker re-sends its route
every 30 s and a broker silent for 120 s is dropped. Nothing here must survive a
restart for correctness -- a gateway that the registry forgot re-registers on its
next heartbeat -- but :meth:`GatewayTable.snapshot` / :meth:`restore` let a restarted
registry answer lookups at once instead of after one heartbeat period.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from lockmq.clock import SYSTEM_CLOCK, Clock

#: gateway names, buildings and topics: short, printable, no spaces
_NAME = re.compile(r"^[A-Za-z0-9_.:$\-/]{1,128}$")
ROLES = ("primary", "standby")


class RegistryError(ValueError):
    """A request the registry refuses; ``code`` is what the client sees as ``error``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Gateway:
    """One registered gateway (one building's broker)."""

    name: str
    building: str
    addresses: list[str]
    tls_port: int = 0
    topics: list[str] = field(default_factory=list)
    role: str = "primary"
    registered_ms: float = 0.0
    last_seen_ms: float = 0.0

    def row(self) -> dict[str, Any]:
        """The fields as plain data (``asdict`` deep-copies: 10x slower on lookups)."""
        return {"name": self.name, "building": self.building, "addresses": list(self.addresses),
                "tls_port": self.tls_port, "topics": list(self.topics), "role": self.role,
                "registered_ms": self.registered_ms, "last_seen_ms": self.last_seen_ms}

    def view(self, now_ms: float) -> dict[str, Any]:
        """What lookups and ``registry.list`` return."""
        out = self.row()
        out["silent_s"] = round(max(0.0, now_ms - self.last_seen_ms) / 1000, 3)
        return out


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise RegistryError("INVALID_ARGUMENT",
                            f"{what} must be 1-128 characters of [A-Za-z0-9_.:$-/], "
                            f"not {value!r}")
    return value


class GatewayTable:
    """Gateways by name, bounded by ``max_gateways`` and ``max_topics`` per gateway."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, evict_after_s: float = 120.0,
                 max_gateways: int = 1000, max_topics: int = 1000,
                 max_addresses: int = 8) -> None:
        self.clock = clock
        self.evict_after_s = evict_after_s
        self.max_gateways = max_gateways
        self.max_topics = max_topics
        self.max_addresses = max_addresses
        self.gateways: dict[str, Gateway] = {}
        #: gateway name -> the credential (fingerprint) that owns it: the first that
        #: registered it, or the one an admin provisioned. Kept after an eviction (a
        #: name never falls free for whoever registers next) and in the state file.
        self.owners: dict[str, str] = {}

    def check_owner(self, name: str, cred: str | None) -> None:
        """``cred`` may speak for gateway ``name`` (None: an unauthenticated registry
        in development mode: no owners); else RegistryError FORBIDDEN."""
        if cred is None:
            return
        owner = self.owners.get(name)
        if owner is not None and owner != cred:
            raise RegistryError("FORBIDDEN", f"gateway name {name!r} belongs to another "
                                "credential (the first that registered it, or the one an "
                                "admin provisioned for it)")

    def _topics(self, value: Any) -> list[str]:
        if not isinstance(value, list):
            raise RegistryError("INVALID_ARGUMENT", "topics must be a list of topic names")
        if len(value) > self.max_topics:
            raise RegistryError("LIMIT_EXCEEDED", f"{len(value)} topics: at most "
                                f"{self.max_topics} per gateway (registry --max-topics)")
        return sorted({_name(t, "a topic") for t in value})

    def register(self, args: dict[str, Any], cred: str | None = None) -> Gateway:
        """Add or replace a gateway from ``registry.register`` arguments, for the
        credential ``cred`` (its owner: see :meth:`check_owner`)."""
        name = _name(args.get("name"), "name")
        self.check_owner(name, cred)
        addresses = args.get("addresses") or ([args["address"]] if args.get("address") else [])
        if not isinstance(addresses, list) or not addresses \
                or len(addresses) > self.max_addresses:
            raise RegistryError("INVALID_ARGUMENT", f"addresses must be a list of 1 to "
                                f"{self.max_addresses} host:port strings")
        addresses = [_name(a, "an address") for a in addresses]
        role = args.get("role", "primary")
        if role not in ROLES:
            raise RegistryError("INVALID_ARGUMENT", f"role must be one of {ROLES}, not {role!r}")
        tls_port = args.get("tls_port") or 0
        if not isinstance(tls_port, int) or not 0 <= tls_port <= 65535:
            raise RegistryError("INVALID_ARGUMENT", "tls_port must be a port number")
        topics = self._topics(args.get("topics", []))
        building = _name(args.get("building") or name, "building")
        if name not in self.gateways and len(self.gateways) >= self.max_gateways:
            raise RegistryError("LIMIT_EXCEEDED", f"the registry holds {self.max_gateways} "
                                "gateways already (registry --max-gateways)")
        now = self.clock.wall_ms()
        old = self.gateways.get(name)
        gw = Gateway(name, building, addresses, tls_port, topics, role,
                     old.registered_ms if old else now, now)
        self.gateways[name] = gw
        if cred is not None:
            self.owners.setdefault(name, cred)
        return gw

    def heartbeat(self, args: dict[str, Any], cred: str | None = None) -> Gateway:
        """Mark a gateway alive (and update its topics when given)."""
        name = _name(args.get("name"), "name")
        self.check_owner(name, cred)
        gw = self.gateways.get(name)
        if gw is None:   # evicted, or the registry restarted: the gateway registers again
            raise RegistryError("UNKNOWN_GATEWAY", f"gateway {name!r} is not registered")
        if "topics" in args:
            gw.topics = self._topics(args["topics"])
        gw.last_seen_ms = self.clock.wall_ms()
        return gw

    def deregister(self, args: dict[str, Any]) -> bool:
        """Remove a gateway that stops cleanly; False when it was not registered."""
        return self.gateways.pop(_name(args.get("name"), "name"), None) is not None

    def lookup(self, topic: str | None = None, building: str | None = None) -> list[dict[str, Any]]:
        """Gateways serving ``topic`` and/or in ``building`` (both None: all)."""
        now = self.clock.wall_ms()
        return [gw.view(now) for gw in sorted(self.gateways.values(), key=lambda g: g.name)
                if (topic is None or topic in gw.topics)
                and (building is None or gw.building == building)]

    def sweep(self) -> list[str]:
        """Drop gateways silent for ``evict_after_s``; return their names."""
        cutoff = self.clock.wall_ms() - self.evict_after_s * 1000
        gone = [n for n, gw in self.gateways.items() if gw.last_seen_ms < cutoff]
        for name in gone:
            del self.gateways[name]
        return gone

    def snapshot(self) -> dict[str, Any]:
        """The table as JSON-able data (for the state file): the gateways' rows and
        the names' owners."""
        return {"gateways": [gw.row() for gw in self.gateways.values()],
                "owners": dict(self.owners)}

    def restore(self, data: Any) -> None:
        """Load what :meth:`snapshot` saved (or the bare row list of older registries);
        each gateway gets a fresh eviction window (the registry was down, not it)."""
        rows = data
        if isinstance(data, dict):
            rows = data.get("gateways") or []
            owners = data.get("owners") or {}
            if isinstance(owners, dict):
                for name, cred in owners.items():
                    if isinstance(name, str) and isinstance(cred, str):
                        self.owners.setdefault(name, cred)
        now = self.clock.wall_ms()
        for row in rows[: self.max_gateways]:
            try:
                gw = Gateway(**row)
            except TypeError:
                continue   # a row from another version: the gateway re-registers
            gw.last_seen_ms = now
            self.gateways[gw.name] = gw
