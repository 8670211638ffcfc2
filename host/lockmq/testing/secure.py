"""A broker with auth required: its data folder, device registry, tokens and TLS."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from lockmq.config import ANY_FREE_PORT
from lockmq.security import DeviceRegistry, Permissions, SecurityConfig, TokenStore

from .process import BrokerProcess, pin_bound_ports
from .tables import Tables, merge_tables


class SecureBroker:
    """A ``data`` folder under ``root`` with a device registry and a token store, and
    the :class:`BrokerProcess` (auth required) that serves it.

    ``locks`` are registered (their keys in :attr:`keys`) and ``tokens`` created (name
    to :class:`Permissions`; the token strings in :attr:`tok`) at once; register more
    with :meth:`add_locks` and :meth:`token`, also while the broker runs (it reads
    them from the same database). :meth:`start` starts it. With ``tls=True`` a CA and a
    server certificate for ``gw.local``/127.0.0.1 are made under ``root/certs`` and the
    broker gets a TLS port beside its plain one (:attr:`certs`; :attr:`tls_port`
    once started: the broker binds a free one itself and logs it).
    """

    def __init__(self, root: str | os.PathLike[str], tables: Tables | None = None,
                 tls: bool = False, locks: Sequence[str] = (),
                 tokens: Mapping[str, Permissions] | None = None) -> None:
        self.root = Path(root)
        self.data = self.root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        cfg = SecurityConfig(data_dir=str(self.data))
        self.registry = DeviceRegistry.open(cfg)
        self.tokens = TokenStore(cfg.registry_path)
        self.certs: Any = None
        if tls:
            # imported here: certificates need the `cryptography` package
            from lockmq.security.certs import init_ca_and_server
            self.certs = init_ca_and_server(str(self.root / "certs"), ["gw.local"],
                                            ["127.0.0.1"])
            tables = merge_tables({"security": {
                "tls_cert": self.certs.server_pem, "tls_key": self.certs.server_key,
                "tls_port": ANY_FREE_PORT}}, tables or {})
        self.tables: Tables = tables or {}
        self.broker: BrokerProcess | None = None
        self.keys = self.add_locks(*locks)
        self.tok = {name: self.token(name, perms) for name, perms in (tokens or {}).items()}

    @property
    def tls_port(self) -> int | None:
        """The broker's TLS port (None before :meth:`start`, or without TLS)."""
        return self.broker.tls_port if self.broker is not None else None

    def add_locks(self, *sns: str, mac: bool = False, tls: bool = False) -> dict[str, bytes]:
        """Register locks; their keys by SN. Registered without a frame-MAC policy
        unless ``mac`` (most tests speak as a lock by hand, without MACs: SPEC 2
        "Per-device policy"); ``lockmq devices add`` requires MACs by default."""
        return self.registry.add_many(list(sns), mac=mac, tls=tls)

    def token(self, name: str, permissions: Permissions | None = None,
              ttl_s: float | None = None, now: float | None = None) -> str:
        """A new token string for ``name`` (no rights unless ``permissions`` says)."""
        return self.tokens.create(name, permissions or Permissions(), ttl_s=ttl_s, now=now)[0]

    def start(self) -> BrokerProcess:
        """Start the broker on :attr:`tables`; returns it (also :attr:`broker`). Started
        again (after ``broker.stop()``), it keeps the main and TLS ports it bound first:
        the locks and tokens' holders know them."""
        self.broker = BrokerProcess(str(self.data), self.tables)
        pin_bound_ports(self.tables, self.broker.port, self.broker.tls_port)
        return self.broker

    def close(self) -> None:
        """Stop the broker and close the registry and the token store."""
        if self.broker is not None:
            self.broker.stop()
        self.registry.close()
        self.tokens.close()
