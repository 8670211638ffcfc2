"""A consumer cluster across gateways: every gateway the registry knows for a topic.

:class:`AsyncCampusConsumer` asks the registry (``lockmq registry``) which gateways
serve ``topic``, runs one :class:`~lockmq.client.AsyncConsumer` per gateway in the
same cluster, and looks up again every ``lookup_every_s``: a new gateway is joined
at once; a gateway the registry evicted is left after its consumer drained (its
in-flight messages are acked or released to the gateway). A gateway that cannot
be reached is retried on the next lookup.

Message ids are global (producer id + sequence), so the idempotency helper gives
exactly-once effects across gateways as on one: pass ``idempotency.wrap(fn)`` as the
handler (see docs/consumers.md).

Who is who (docs/security.md, "The campus registry"): with ``gateway_tls_ca`` every
gateway is reached over TLS at its registered ``tls_port`` and must present a
certificate for its *registered name* from that CA, so an entry pointing a name at
another broker -- or a made-up name -- fails before the consumer's token is sent or a
record is read. Without it, a consumer that has a token joins no gateway (its token
would go to whatever the registry says) unless ``insecure_gateways=True``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .consumer import AsyncConsumer, Handler
from .errors import LockmqError
from .registry import lookup
from .session import Endpoint
from .sync import Consumer

log = logging.getLogger("lockmq.client.campus")


class AsyncCampusConsumer:
    """One consumer-cluster member on every gateway serving ``topic`` (asyncio).

    Args:
        registry: ``"host:port"`` of the registry (a comma-separated list or a list
            for several: the first that answers is used).
        topic, cluster, handler: as for :class:`AsyncConsumer`.
        token: the gateways' token (as for :class:`AsyncConsumer`).
        registry_token: the registry's token (default: ``token``).
        building: only gateways of this building.
        lookup_every_s: how often the registry is asked again.
        registry_insecure: allow the registry token in clear to a remote registry.
        gateway_tls_ca: the campus CA (PEM or DER): each gateway is verified as the
            one registered under its name (TLS, certificate for that name).
        registry_tls_ca: reach the registry over TLS, verified against this CA.
        insecure_gateways: send ``token`` to gateways that cannot be verified.
        **consumer_kwargs: passed to every :class:`AsyncConsumer` (workers, batch ...).
    """

    def __init__(self, registry: str | list[str], *, topic: str, cluster: str,
                 handler: Handler, token: str | None = None,
                 registry_token: str | None = None, building: str | None = None,
                 lookup_every_s: float = 10.0, registry_insecure: bool = False,
                 gateway_tls_ca: str | None = None, insecure_gateways: bool = False,
                 registry_tls_ca: str | None = None, **consumer_kwargs: Any) -> None:
        self.registry = registry
        self.topic = topic
        self.cluster = cluster
        self.handler = handler
        self.token = token
        self.registry_token = registry_token if registry_token is not None else token
        self.building = building
        self.lookup_every_s = lookup_every_s
        self.registry_insecure = registry_insecure
        self.gateway_tls_ca = gateway_tls_ca
        self.registry_tls_ca = registry_tls_ca
        self.insecure_gateways = insecure_gateways
        self.consumer_kwargs = consumer_kwargs
        #: gateways listed but not joined because they could not be verified
        self.unverified = 0
        #: the running consumers, by gateway name
        self.consumers: dict[str, AsyncConsumer] = {}
        self._addresses: dict[str, str] = {}
        self._refresher: asyncio.Task | None = None
        self._leaving: set[asyncio.Task] = set()
        self.lookups = 0
        self.lookup_errors = 0

    @property
    def gateways(self) -> list[str]:
        """Names of the gateways consumed from now."""
        return sorted(self.consumers)

    @property
    def workers(self) -> int:
        """Workers over every gateway's consumer right now."""
        return sum(c.workers for c in self.consumers.values())

    @property
    def stats(self) -> dict[str, int]:
        """The consumers' counters, summed (and ``gateways``, ``lookups``)."""
        total: dict[str, int] = {"gateways": len(self.consumers), "lookups": self.lookups,
                                 "unverified": self.unverified}
        for c in self.consumers.values():
            for k, v in c.stats.items():
                total[k] = total.get(k, 0) + v
        return total

    async def start(self) -> None:
        """Look up the gateways and join each (raises when the registry cannot be
        reached at all); then keep looking up in the background."""
        await self.refresh(raise_errors=True)
        self._refresher = asyncio.ensure_future(self._refresh_loop())

    async def run(self, stop: asyncio.Event | None = None, duration_s: float | None = None) -> None:
        """Start, then consume until ``stop`` is set or ``duration_s`` passes."""
        await self.start()
        try:
            await asyncio.wait_for((stop or asyncio.Event()).wait(), duration_s)
        except asyncio.TimeoutError:
            pass
        finally:
            await self.stop()

    async def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Stop looking up; every consumer finishes its messages and leaves."""
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        consumers, self.consumers = list(self.consumers.values()), {}
        await asyncio.gather(*(c.stop(drain_timeout_s) for c in consumers),
                             *self._leaving, return_exceptions=True)

    async def refresh(self, raise_errors: bool = False) -> None:
        """One lookup: join new gateways, leave the ones no longer listed."""
        try:
            found = await lookup(self.registry, topic=self.topic, building=self.building,
                                 token=self.registry_token,
                                 insecure=self.registry_insecure,
                                 tls_ca=self.registry_tls_ca)
        except (LockmqError, OSError, asyncio.TimeoutError) as exc:
            self.lookup_errors += 1
            if raise_errors:
                raise
            log.warning("registry lookup failed (%s); keeping %d gateway(s)", exc,
                        len(self.consumers))
            return
        self.lookups += 1
        # a standby follows its primary's log: consuming it too would deliver twice
        rows = {g["name"]: g for g in found
                if g.get("addresses") and g.get("role") != "standby"}
        listed = {name: ",".join(g["addresses"]) + f"|tls={g.get('tls_port') or 0}"
                  for name, g in rows.items()}
        for name in [n for n in self.consumers if listed.get(n) != self._addresses.get(n)]:
            self._leave(name)   # evicted, or moved to another address
        for name, key in listed.items():
            if name not in self.consumers:
                await self._join(name, rows[name], key)

    def _endpoints(self, name: str, row: dict[str, Any]) -> str | list[Endpoint] | None:
        """Where to reach gateway ``name`` so that it is the one registered (None:
        it cannot be verified, and this consumer would send it its token)."""
        addresses = row["addresses"]
        if self.gateway_tls_ca:
            port = row.get("tls_port") or 0
            if not port:
                return None
            from lockmq.security.tls import client_context
            ctx = client_context(self.gateway_tls_ca)
            return [Endpoint(Endpoint.parse(a).host, port, ssl=ctx, server_hostname=name)
                    for a in addresses]
        if self.token and not self.insecure_gateways:
            return None
        return ",".join(addresses)

    async def _join(self, name: str, row: dict[str, Any], key: str) -> None:
        address = self._endpoints(name, row)
        if address is None:
            self.unverified += 1
            log.warning("gateway %s (%s) not joined: it cannot be verified as the gateway "
                        "registered under that name (give gateway_tls_ca; without it a "
                        "token is sent to unverified gateways only with insecure_gateways)",
                        name, ",".join(row["addresses"]))
            return
        consumer = AsyncConsumer(address, topic=self.topic, cluster=self.cluster,
                                 handler=self.handler, token=self.token, **self.consumer_kwargs)
        consumer.endpoint.connect_retry_s = 0.0   # an unreachable gateway: next lookup
        try:
            await consumer.start()
        except (LockmqError, OSError, asyncio.TimeoutError) as exc:
            log.warning("gateway %s (%s) not joined: %s; retrying on the next lookup",
                        name, address, exc)
            await consumer.stop(0)
            return
        self.consumers[name] = consumer
        self._addresses[name] = key
        log.info("joined gateway %s (%s) for %s/%s", name, key, self.topic, self.cluster)

    def _leave(self, name: str) -> None:
        consumer = self.consumers.pop(name)
        self._addresses.pop(name, None)
        log.info("leaving gateway %s (no longer in the registry)", name)
        task = asyncio.ensure_future(consumer.stop())
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lookup_every_s)
            await self.refresh()

    async def __aenter__(self) -> "AsyncCampusConsumer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class CampusConsumer(Consumer):
    """Blocking :class:`AsyncCampusConsumer`: ``CampusConsumer(registry="host:port",
    topic=..., cluster=..., handler=...)``; ``handler(msg)`` runs in worker threads.
    ``start`` / ``run`` / ``stop`` / ``with`` as for :class:`~lockmq.client.Consumer`."""

    def __init__(self, registry: str | list[str], *, handler: Handler, **kwargs: Any) -> None:
        self._setup("lockmq-campus",
                    lambda: AsyncCampusConsumer(registry, handler=handler, **kwargs))

    @property
    def gateways(self) -> list[str]:
        """Names of the gateways consumed from now."""
        return self._lt.call(lambda: self._c.gateways)  # type: ignore[attr-defined]
