"""A small HTTP status page on a second port (default 6801), plain asyncio.

``GET /`` the dashboard (HTML, ``dashboard.py``; ``Accept: text/plain`` gets the
text summary); ``GET /summary`` the text summary for people and scripts;
``GET /stats`` the ``stats`` admin op as JSON; ``GET /clusters``, ``/topics``,
``/devices``, ``/commands`` likewise; ``GET /history`` the dashboard's samples;
``GET /metrics`` Prometheus exposition (``metrics.py``); ``GET /health`` ``ok``.
Read-only; no framework.

Access (issue 33): every view that names locks, clusters or topics asks the guard
(``authorize_status``): with auth required it needs ``Authorization: Bearer <admin
token>`` (``[security] status_token_required``), ``/metrics`` a valid token when
``metrics_token_required``; otherwise ``401``. ``/health`` is always open.

Bounded (issue 10 item 14): a request must be read, answered and written within
``[broker] status_request_timeout_s`` in all -- a header trickled every few seconds
used to keep a connection open for ever -- else it gets ``408`` and is closed; at
most ``status_max_connections`` are open at once, more get ``503`` at once; a
request line or header over 8 KiB, or more than 64 header lines, is ``400``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, Callable

from . import dashboard
from .metrics import MetricsEndpoint, disk_free_bytes
from .periodic import start_periodic, stop_task

if TYPE_CHECKING:
    from lockmq.config import BrokerSection

    from .admin import Admin
    from .devices import Devices
    from .logs import EventLog, Stats

MAX_REQUEST = 8192
MAX_HEADER_LINES = 64


def _queued(stats: dict[str, Any]) -> str:
    """The summary's note of connections waiting in the kernel's accept queue (none:
    nothing to say)."""
    q = stats.get("accept_queue") or {}
    if q.get("waiting", 0) <= 0:
        return ""
    return f"   accept queue {q['waiting']}/{q['size']} (the loop is behind on handshakes)"


class _BadRequest(Exception):
    """The request cannot be parsed (or is too big): answer 400."""


class StatusPage:
    """The HTTP listener; see the module docstring."""

    def __init__(self, settings: "BrokerSection", stats: "Stats", log: "EventLog",
                 admin: "Admin", devices: "Devices",
                 authorize: "Callable[[str, str], str] | None" = None) -> None:
        self.settings = settings
        #: the guard's ``authorize_status`` (None: every view is open)
        self.authorize = authorize
        self.stats = stats
        self.log = log
        self.admin = admin
        self.devices = devices
        #: the dashboard's title; the broker adds its port once it listens
        self.title = "lockmq broker"
        self.server: asyncio.base_events.Server | None = None
        #: status connections open now (capped by ``status_max_connections``)
        self.active = 0
        #: more ``/metrics`` gauges, ``() -> {name: (help, value)}`` (replication, the
        #: MQTT bridge)
        self.extra_gauges: list[Callable[[], dict[str, tuple[str, float]]]] = []
        #: the fleet's firmware for ``/metrics`` (FirmwareBundles.gauges), if any
        self.firmware: Callable[[], dict[str, Any]] | None = None
        self._refused_logged = 0.0
        self._refused_since_log = 0
        self.metrics = MetricsEndpoint(self._metric_views, stats.latency)
        self.history = dashboard.History()
        self._sampler: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port."""
        self.server = await asyncio.start_server(self._serve, host, port, limit=MAX_REQUEST)
        self.sample()
        self._sampler = start_periodic("lockmq-dashboard", self.history.every_s, self.sample)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop sampling and listening."""
        await stop_task(self._sampler)
        self._sampler = None
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    @staticmethod
    def _response(status: str, ctype: str, body: bytes, extra: str = "") -> bytes:
        return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
                .encode() + body)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        b = self
        cfg = self.settings
        peer = writer.get_extra_info("peername")
        peer_s = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if self.active >= cfg.status_max_connections:
            # over the cap: a short answer and close, no reading, no waiting
            b.stats.c["status_refused"] += 1
            self._log_refused(peer_s)
            writer.write(self._response("503 Service Unavailable", "text/plain",
                                        b"too many status connections\n", "Retry-After: 1\r\n"))
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()
            else:
                writer.close()
            return
        self.active += 1
        state = {"answered": False}
        try:
            await asyncio.wait_for(self._exchange(reader, writer, state),
                                   cfg.status_request_timeout_s)
        except asyncio.TimeoutError:
            b.stats.c["status_timeouts"] += 1
            b.log("status_timeout", peer=peer_s, timeout_s=cfg.status_request_timeout_s,
                  answered=state["answered"], level="warning")
            if not state["answered"]:
                writer.write(self._response("408 Request Timeout", "text/plain",
                                            b"request timeout\n"))
            if state["answered"] or writer.transport.get_write_buffer_size():
                writer.transport.abort()   # the peer does not read: do not wait for it
        except (ConnectionError, OSError):
            writer.transport.abort()
        finally:
            self.active -= 1
            if not writer.transport.is_closing():
                writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        state: dict[str, bool]) -> None:
        """Read one request and write its answer (under the caller's deadline)."""
        b = self
        try:
            line = await reader.readline()
            accept = authorization = ""
            for _ in range(MAX_HEADER_LINES + 1):   # only Accept and Authorization matter
                h = await reader.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                if h[:7].lower() == b"accept:":
                    accept = h[7:].decode("latin-1").strip().lower()
                elif h[:14].lower() == b"authorization:":
                    authorization = h[14:].decode("latin-1").strip()
            else:
                raise _BadRequest("too many header lines")
            parts = line.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else "/"
            b.stats.c["status_requests"] += 1
            why = self._refusal(path.split("?")[0], authorization)
            if why:
                b.stats.c["status_unauthorized"] += 1
                b.log.limited("status_unauthorized", "status_unauthorized", path=path[:100],
                              why=why, level="warning")
                state["answered"] = True
                writer.write(self._response("401 Unauthorized", "text/plain",
                                            why.encode() + b"\n",
                                            'WWW-Authenticate: Bearer realm="lockmq"\r\n'))
                await writer.drain()
                return
            status, ctype, body = self.render(path.split("?")[0], accept)
        except (_BadRequest, ValueError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            b.stats.c["status_bad_requests"] += 1
            status, ctype, body = "400 Bad Request", "text/plain", b"bad request\n"
        state["answered"] = True
        writer.write(self._response(status, ctype, body))
        await writer.drain()

    def _log_refused(self, peer: str) -> None:
        """One log line a second at most for refused connections (a flood of them
        must not become a flood of lines); the line says how many."""
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._refused_logged >= 1.0:
            self.log("status_refused", peer=peer, refused=self._refused_since_log,
                     max_connections=self.settings.status_max_connections, level="warning")
            self._refused_logged = now
            self._refused_since_log = 0

    def _refusal(self, path: str, authorization: str) -> str:
        """Why this request may not read ``path`` ("" if it may)."""
        if path == "/health" or self.authorize is None:
            return ""
        return self.authorize("metrics" if path == "/metrics" else "views", authorization)

    def render(self, path: str, accept: str = "") -> tuple[str, str, bytes]:
        """(status, content type, body) of ``path``; ``accept`` is the request's
        Accept header (``text/plain`` without ``text/html`` asks ``/`` for text)."""
        admin = self.admin
        views: dict[str, Any] = {"/stats": admin.stats, "/clusters": admin.clusters,
                                 "/topics": admin.topics, "/devices": admin.devices,
                                 "/commands": admin.commands}
        if path in views:
            return "200 OK", "application/json", json.dumps(views[path]({}), indent=1).encode()
        if path == "/health":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/metrics":
            ctype, body = self.metrics.render(accept)
            return "200 OK", ctype, body
        if path == "/history":
            return "200 OK", "application/json", json.dumps(self.history.to_json()).encode()
        if path == "/summary" or (path == "/" and "text/plain" in accept
                                  and "text/html" not in accept):
            return "200 OK", "text/plain; charset=utf-8", self.summary().encode()
        if path == "/":
            return "200 OK", "text/html; charset=utf-8", self.dashboard().encode()
        return "404 Not Found", "text/plain", b"not found\n"

    # -- what the pages read: the broker's admin views, in one place -------------------

    def _views(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The ``stats`` and ``clusters`` admin views (every cluster, live or on disk)."""
        admin = self.admin
        return admin.stats({}), admin.clusters({})["clusters"]

    def _disk_free(self) -> float:
        return disk_free_bytes(self.settings.data_dir)

    def _metric_views(self) -> tuple[dict[str, Any], list[dict[str, Any]],
                                     dict[str, tuple[str, float]]]:
        stats, clusters = self._views()
        extra = {"status_connections": ("Status-page connections open now", self.active),
                 "store_disk_free_bytes": ("Free bytes on the file system of data_dir",
                                           self._disk_free())}
        for more in self.extra_gauges:
            extra.update(more())
        if self.firmware is not None:
            stats = dict(stats, firmware=self.firmware())
        return stats, clusters, extra

    def _online(self) -> set[str]:
        # the SNs only: not the ``devices`` view (sorted, one dict per lock) per sample
        return set(self.devices.online_by_sn)

    def sample(self) -> None:
        """Add one sample to the dashboard's history (the periodic helper calls this)."""
        try:
            stats, clusters = self._views()
            self.history.add(dashboard.take_sample(stats, clusters, self._disk_free()),
                             self._online())
        except Exception as exc:  # noqa: BLE001 -- a failed sample must not stop sampling
            self.log("dashboard_sample_failed", error=repr(exc), level="error")

    def dashboard(self) -> str:
        """The HTML dashboard."""
        stats, clusters = self._views()
        return dashboard.render(self.title, stats, clusters,
                                self._online(), self.history)

    def summary(self) -> str:
        """A page a person reads: connections, devices, clusters, counters."""
        stats, clusters = self._views()
        s = stats["broker"]
        out = [f"{self.title}  uptime {s['uptime_s']:.0f} s",
               f"connections {stats['connections']} (max {stats['max_connections']})   "
               f"locks online {stats['devices_online']}{_queued(stats)}",
               f"published {s['publish_stored']} stored, {s['publish_duplicates']} duplicates, "
               f"{s['publish_busy']} busy   delivered {s['messages_delivered']}   "
               f"acks {s['acks']}   nacks {s['nacks']}", "",
               f"{'cluster':24} {'topic':20} {'members':>7} {'inflight':>8} {'backlog':>9} "
               f"{'dlq':>6}"]
        for c in clusters:
            flag = "  CAPPED" if c.get("cluster_capped") else ""
            if not c.get("live", True):
                flag = "  offline"
            out.append(f"{c['name']:24} {c['topic']:20} {len(c['members']):>7} "
                       f"{c['inflight']:>8} {c['backlog']:>9} {c['dlq_size']:>6}{flag}")
        out.append("")
        out.append("Dashboard: /   JSON: /stats /clusters /topics /devices /commands /history   "
                   "Prometheus: /metrics")
        return "\n".join(out) + "\n"
