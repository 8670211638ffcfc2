"""Talking to registries: one request, tried on each registry address in turn.

The client side of discovery (``lockmq.registry`` is the registry server and a
broker's announcer): lookups for :mod:`lockmq.client.campus` and the CLI."""

from __future__ import annotations

from typing import Any

from .admin import AsyncAdmin
from .errors import AdminError, LockmqError
from .session import Endpoint

#: a registry that does not answer is skipped quickly (there may be another)
CONNECT_TIMEOUT_S = 5.0


def registry_endpoint(address: str, insecure: bool = False,
                      tls_ca: str | None = None) -> Endpoint:
    """``host:port`` of a registry, tried once (no 30 s first-connect retry).

    ``tls_ca``: reach it over TLS, its certificate verified against this CA (PEM or
    DER) for the address's host. ``insecure``: allow the token in clear to a
    non-loopback registry without TLS."""
    ep = Endpoint.parse(address)
    if tls_ca:
        from lockmq.security.tls import client_context
        ep.ssl = client_context(tls_ca)
    ep.insecure = insecure
    ep.connect_retry_s = 0.0
    ep.connect_timeout_s = CONNECT_TIMEOUT_S
    return ep


def registry_addresses(registry: str | list[str]) -> list[str]:
    """``"h1:p1,h2:p2"`` or a list -> a list of addresses."""
    items = registry.split(",") if isinstance(registry, str) else list(registry)
    out = [a.strip() for a in items if a and a.strip()]
    if not out:
        raise ValueError("no registry address given")
    return out


async def registry_request(registry: str | list[str], op: str, *, token: str | None = None,
                           timeout_s: float = 10.0, insecure: bool = False,
                           tls_ca: str | None = None, **args: Any) -> dict[str, Any]:
    """Run ``op`` on the first registry that answers.

    An :class:`AdminError` (the registry refused the request) is raised at once; a
    registry that cannot be reached is skipped, and the last such error raised when
    none answers.
    """
    last: Exception | None = None
    for address in registry_addresses(registry):
        admin = AsyncAdmin(registry_endpoint(address, insecure, tls_ca), token=token,
                           timeout_s=timeout_s)
        try:
            await admin.connect()
            return await admin.request(op, **args)
        except AdminError:
            raise
        except (LockmqError, OSError, TimeoutError) as exc:
            last = exc
        finally:
            await admin.close()
    assert last is not None
    raise last


async def lookup(registry: str | list[str], *, topic: str | None = None,
                 building: str | None = None, token: str | None = None,
                 insecure: bool = False, tls_ca: str | None = None) -> list[dict[str, Any]]:
    """The gateways serving ``topic`` (and/or in ``building``)."""
    args = {k: v for k, v in (("topic", topic), ("building", building)) if v is not None}
    return (await registry_request(registry, "registry.lookup", token=token,
                                   insecure=insecure, tls_ca=tls_ca, **args))["gateways"]
