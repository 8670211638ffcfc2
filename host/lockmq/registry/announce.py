"""A gateway announcing itself: register, then heartbeat every ``heartbeat_s``.

Started by the broker (one hook in ``broker/server.py``) when ``[registry]
addresses`` is set. Like a RocketMQ broker, it talks to every registry in the list
(each has the whole picture). A registry that is down costs nothing but a warning:
the loop retries with backoff, logs ``registry_unreachable`` once per outage and
``registry_reachable`` when it answers again; a registry that forgot the gateway
(restart, eviction) answers ``UNKNOWN_GATEWAY`` and the gateway registers again.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Callable, Iterable

from lockmq.client.admin import AsyncAdmin
from lockmq.client.backoff import Backoff
from lockmq.client.errors import AdminError, AuthError, LockmqError

from lockmq.client.registry import registry_addresses, registry_endpoint

#: how long a stopping gateway gives each registry to take its deregistration
DEREGISTER_TIMEOUT_S = 2.0


def advertised_address(host: str, port: int, advertise: str = "") -> str:
    """``advertise`` or ``host:port`` (a wildcard host becomes this machine's name)."""
    if advertise:
        return advertise
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()
    return f"{host}:{port}"


class Announcer:
    """Registers one gateway with every registry of ``settings.addresses``.

    ``info()`` returns the ``registry.register`` arguments (called on every
    heartbeat, so new topics reach the registry within ``heartbeat_s``).
    """

    def __init__(self, settings: Any, info: Callable[[], dict[str, Any]], log: Any) -> None:
        self.settings = settings
        self.info = info
        self.log = log
        self.tasks: list[asyncio.Task] = []

    def start(self) -> None:
        """One task per registry address."""
        for address in registry_addresses(self.settings.addresses):
            self.tasks.append(asyncio.ensure_future(self._run(address)))

    async def stop(self) -> None:
        """Stop heartbeating and deregister from every registry (a clean stop: clients
        looking the topic up stop getting this gateway at once, not only after the
        registry's eviction timeout, which still covers a crash)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.tasks:
            name = self.info()["name"]
            await asyncio.gather(*(self._deregister(a, name) for a in
                                   registry_addresses(self.settings.addresses)))

    async def _deregister(self, address: str, name: str) -> None:
        admin = AsyncAdmin(registry_endpoint(address, self.settings.insecure),
                           token=self.settings.token or None, timeout_s=DEREGISTER_TIMEOUT_S,
                           client_id=_client_id(name))
        try:
            await asyncio.wait_for(admin.connect(), DEREGISTER_TIMEOUT_S)
            await admin.request("registry.deregister", name=name)
            self.log("registry_deregistered", registry=address, name=name)
        except (LockmqError, OSError, asyncio.TimeoutError) as exc:
            self.log("registry_deregister_failed", level="warning", registry=address,
                     error=str(exc) or type(exc).__name__,
                     hint="the registry evicts the gateway after its timeout")
        finally:
            await admin.close()

    async def _run(self, address: str) -> None:
        backoff = Backoff(0.5, max(1.0, self.settings.heartbeat_s))
        down = False
        while True:
            admin = AsyncAdmin(registry_endpoint(address, self.settings.insecure,
                                                 getattr(self.settings, "tls_ca", "") or None), token=self.settings.token or None,
                               timeout_s=10.0,
                               client_id=_client_id(self.info()["name"]))
            try:
                await admin.connect()
                registered = False
                while True:
                    info = self.info()
                    if not registered:
                        await admin.request("registry.register", **info)
                        registered = True
                        self.log("registry_registered",
                                 registry=address, name=info["name"], topics=len(info["topics"]))
                    else:
                        try:
                            await admin.request("registry.heartbeat", name=info["name"],
                                                topics=info["topics"])
                        except AdminError as exc:
                            if exc.error != "UNKNOWN_GATEWAY":
                                raise
                            registered = False   # the registry forgot us: register again
                            continue
                    if down:
                        self.log("registry_reachable", registry=address)
                        down = False
                    backoff.reset()
                    await asyncio.sleep(self.settings.heartbeat_s)
            except asyncio.CancelledError:
                raise
            except (LockmqError, OSError, asyncio.TimeoutError) as exc:
                if not down:   # once per outage, not once per retry
                    # refused (a cap, a bad token, a bad name) or not reachable at all
                    refused = isinstance(exc, (AdminError, AuthError))
                    self.log("registry_refused" if refused else "registry_unreachable",
                             level="warning", registry=address,
                             error=str(exc) or type(exc).__name__)
                    down = True
            finally:
                await admin.close()
            await asyncio.sleep(backoff.next_delay())


def _client_id(name: str) -> str:
    """The SN a gateway's registry session uses (identity charset, <= 32 bytes)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
    return ("gw-" + safe)[:32]


def broker_announcer(config: Any, topics: Callable[[], Iterable[str]],
                     ports: Callable[[], tuple[int, int]], log: Any) -> Announcer | None:
    """The announcer of a broker being built, declared there and started with it
    (None when ``[registry] addresses`` is empty): ``topics()`` are the broker's
    topics now, ``ports()`` its main and TLS ports once it listens."""
    settings = config.registry
    if not settings.addresses:
        return None
    cfg = config.broker

    def info() -> dict[str, Any]:
        port, tls_port = ports()
        address = advertised_address(cfg.host, port, settings.advertise)
        names = sorted(set(topics()) | set(settings.topics))
        return {"name": settings.name or address, "building": settings.building or "",
                "addresses": [address], "tls_port": tls_port or 0,
                "topics": [t for t in names if not t.startswith("$")][:settings.max_topics],
                # announced only while this broker serves: a standby starts announcing
                # once promoted, so the role is never "standby" (campus consumers skip those)
                "role": "primary"}

    return Announcer(settings, info, log)
