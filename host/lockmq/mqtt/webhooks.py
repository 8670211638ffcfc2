"""Webhooks: every record of chosen topics POSTed to HTTP(S) endpoints, each endpoint
a member of its own consumer cluster.

For each endpoint and topic the sink joins the cluster ``<cluster>.<endpoint>.<topic>``
(its position on disk: a restart goes on where it stopped) and leases at most
``concurrency`` records at once -- the endpoint's concurrency limit. Each lease is
one POST:

* body: the record as JSON (``topic``, ``sn``, ``seq``, ``msg_id``, ``lock_ts_ms``,
  ``broker_ts_us``, ``delivery``, ``payload_b64``);
* ``Idempotency-Key: <sn>:<seq>`` -- the same on every retry, so the receiver drops a
  record it has already taken;
* ``X-Lockmq-Timestamp`` and ``X-Lockmq-Signature: sha256=<hex>``, the HMAC-SHA256
  of ``<timestamp>.<body>`` under the configured secret;
* a 2xx answer acks the lease; anything else -- another status, a timeout, a reset --
  nacks it: the cluster's retry levels are the backoff (``Retry-After`` of a 429 or
  503 is honoured), and after ``[consumers] max_retries`` the record goes to the
  cluster's dead-letter topic (``lockmq dlq``), where an operator can replay it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ssl
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from lockmq.config import WebhooksSection

from . import topics as t
from .delivery import json_envelope

#: the longest answer read from an endpoint (status line and headers; the body is ignored)
_MAX_HEAD = 16 * 1024


class Endpoint:
    """One webhook URL: its name, where it connects and its members."""

    def __init__(self, spec: str) -> None:
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = "", spec
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"webhooks.endpoints: {spec!r} is not an http(s) URL")
        self.url = url
        self.name = name or hashlib.sha1(url.encode()).hexdigest()[:8]
        self.tls = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.tls else 80)
        self.path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self.busy = 0          # POSTs in flight now
        self.max_busy = 0      # the most ever in flight at once


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The ``X-Lockmq-Signature`` value of a POST (what a receiver recomputes)."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body,
                                hashlib.sha256).hexdigest()


class WebhookSink:
    """POSTs records to endpoints (see the module docstring)."""

    def __init__(self, settings: WebhooksSection, core: Any, log: Any, stats: Any,
                 new_member: Callable[..., Any], cluster_error: type[Exception]) -> None:
        self.s = settings
        self.core = core
        self.log = log
        self.stats = stats
        self.new_member = new_member
        self.cluster_error = cluster_error
        self.secret = settings.secret.encode()
        self.endpoints = [Endpoint(e) for e in settings.endpoints]
        self.joined: list[tuple[Endpoint, Any, Any]] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self._ctx = ssl.create_default_context(cafile=settings.ca_file or None) \
            if any(e.tls for e in self.endpoints) else None
        self._stopping = False

    def start(self) -> None:
        """Join a cluster per endpoint and topic."""
        lease_ms = int(self.s.timeout_s * 2000) + 1000   # a lease outlives its POST
        for ep in self.endpoints:
            for topic in self.s.topics:
                name = t._short(f"{self.s.cluster}.{ep.name}.{topic}", 100)
                cl = self.core.cluster(name, topic, self.s.ordered)
                m = self.new_member(len(self.joined) + 1, f"webhook:{ep.name}", ep.url[:120],
                                    lambda _m: None, self.s.concurrency, lease_ms)
                m.notify = lambda _m, ep=ep, cl=cl, m=m: self._pump(ep, cl, m)
                self.joined.append((ep, cl, m))
                cl.join(m)
        self.log("webhooks_started", endpoints=",".join(e.name for e in self.endpoints),
                 topics=",".join(self.s.topics))

    async def stop(self) -> None:
        """Leave the clusters (what is in flight is released, POSTed again later)."""
        self._stopping = True
        for ep, cl, m in self.joined:
            cl.leave(m, reason="webhooks stopping")
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def _pump(self, ep: Endpoint, cl: Any, m: Any) -> None:
        if self._stopping:
            return
        room = self.s.concurrency - ep.busy
        if room <= 0:
            return   # a finished POST pumps again
        for lease in cl.pull(m, room):
            ep.busy += 1
            ep.max_busy = max(ep.max_busy, ep.busy)
            task = asyncio.ensure_future(self._deliver(ep, cl, m, lease))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _deliver(self, ep: Endpoint, cl: Any, m: Any, lease: Any) -> None:
        rec = lease.rec
        body = json_envelope(rec, lease.deliveries)
        ts = str(int(time.time()))
        headers = {"Content-Type": "application/json", "Idempotency-Key": rec.msg_id,
                   "X-Lockmq-Timestamp": ts, "X-Lockmq-Delivery": str(lease.deliveries),
                   "X-Lockmq-Topic": rec.topic}
        if self.secret:
            headers["X-Lockmq-Signature"] = sign(self.secret, ts, body)
        delay_ms: int | None = None
        try:
            status, retry_after = await asyncio.wait_for(
                self._post(ep, body, headers), self.s.timeout_s)
            ok = 200 <= status < 300
            why = f"HTTP {status}"
            if status in (429, 503) and retry_after is not None:
                delay_ms = int(retry_after * 1000)
        except asyncio.TimeoutError:
            ok, why = False, f"no answer within {self.s.timeout_s:g} s"
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            ok, why = False, f"{type(exc).__name__}: {exc}"
        finally:
            ep.busy -= 1
        try:
            if ok:
                cl.ack(m, lease.wire, lease.deliveries)
                self.stats.inc("webhooks_delivered")
            else:
                self.stats.inc("webhooks_failed")
                self.log.limited("webhook_failed", f"webhook_failed:{ep.name}",
                                 endpoint=ep.name, msg=rec.msg_id, reason=why,
                                 delivery=lease.deliveries, level="warning")
                cl.nack(m, lease.wire, lease.deliveries, delay_ms, f"webhook {ep.name}: {why}")
        except self.cluster_error:
            self.stats.inc("webhooks_late")   # the lease expired meanwhile: sent again
        cl.settled(m)
        self._pump(ep, cl, m)

    async def _post(self, ep: Endpoint, body: bytes, headers: dict[str, str]
                    ) -> tuple[int, float | None]:
        """One HTTP/1.1 POST; (status, Retry-After seconds or None)."""
        reader, writer = await asyncio.open_connection(
            ep.host, ep.port, ssl=self._ctx if ep.tls else None,
            server_hostname=ep.host if ep.tls else None)
        try:
            head = (f"POST {ep.path} HTTP/1.1\r\nHost: {ep.host}:{ep.port}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n"
                    "User-Agent: lockmq-webhooks\r\n"
                    + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
            raw = await reader.readuntil(b"\r\n\r\n")
            if len(raw) > _MAX_HEAD:
                raise ValueError("answer headers too long")
            lines = raw.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
            retry_after = None
            for line in lines[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "retry-after" and v.strip().isdigit():
                    retry_after = float(v.strip())
            return int(parts[1]), retry_after
        finally:
            writer.close()
