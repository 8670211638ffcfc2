"""A small HTTP status page on a second port (default 6801), plain asyncio.

``GET /`` a text summary for people; ``GET /stats`` the ``stats`` admin op as JSON;
``GET /clusters``, ``/topics``, ``/devices`` likewise; ``GET /metrics`` the counters
in Prometheus text format; ``GET /health`` ``ok``. Read-only; no framework.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import Broker

MAX_REQUEST = 8192


class StatusPage:
    """The HTTP listener; see the module docstring."""

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port."""
        self.server = await asyncio.start_server(self._serve, host, port, limit=MAX_REQUEST)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5.0)
            while True:  # skip the headers
                h = await asyncio.wait_for(reader.readline(), 5.0)
                if h in (b"\r\n", b"\n", b""):
                    break
            parts = line.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else "/"
            status, ctype, body = self.render(path.split("?")[0])
        except (asyncio.TimeoutError, ValueError, ConnectionError, asyncio.LimitOverrunError):
            status, ctype, body = "400 Bad Request", "text/plain", b"bad request\n"
        try:
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + body)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def render(self, path: str) -> tuple[str, str, bytes]:
        """(status, content type, body) of ``path``."""
        admin = self.broker.admin
        views: dict[str, Any] = {"/stats": admin.stats, "/clusters": admin.clusters,
                                 "/topics": admin.topics, "/devices": admin.devices,
                                 "/commands": admin.commands}
        if path in views:
            return "200 OK", "application/json", json.dumps(views[path]({}), indent=1).encode()
        if path == "/health":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/metrics":
            return "200 OK", "text/plain; version=0.0.4", self.metrics().encode()
        if path == "/":
            return "200 OK", "text/plain; charset=utf-8", self.summary().encode()
        return "404 Not Found", "text/plain", b"not found\n"

    def metrics(self) -> str:
        """Counters and gauges in Prometheus text format."""
        b = self.broker
        lines = []
        for k, v in b.stats.snapshot().items():
            lines.append(f"lockmq_{k} {v}")
        lines.append(f"lockmq_connections {len(b.conns)}")
        lines.append(f"lockmq_devices_online {len(b.devices.online_by_sn)}")
        if b.core.store is not None:
            for k, v in b.core.store.stats.items():
                lines.append(f"lockmq_store_{k} {v}")
        try:
            for k, v in b.guard.status().items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    lines.append(f"lockmq_{k} {v}")
        except Exception:  # noqa: BLE001
            pass
        for c in b.core.clusters.values():
            lab = f'{{cluster="{c.name}",topic="{c.topic}"}}'
            lines.append(f"lockmq_cluster_backlog{lab} {c.backlog()}")
            lines.append(f"lockmq_cluster_inflight{lab} {len(c.leases)}")
            lines.append(f"lockmq_cluster_members{lab} {len(c.members)}")
            for k, v in c.stats.items():
                lines.append(f"lockmq_cluster_{k}{lab} {v}")
        guard_status = getattr(b.guard, "status", None)   # lockmq.security counters
        for k, v in (guard_status() if guard_status else {}).items():
            lines.append(f"lockmq_{k} {v}")
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        """A page a person reads: connections, devices, clusters, counters."""
        b = self.broker
        s = b.stats.snapshot()
        out = [f"lockmq broker  port {b.port}  uptime {s['uptime_s']:.0f} s",
               f"connections {len(b.conns)} (max {b.max_connections})   "
               f"locks online {len(b.devices.online_by_sn)}",
               f"published {s['publish_stored']} stored, {s['publish_duplicates']} duplicates, "
               f"{s['publish_busy']} busy   delivered {s['messages_delivered']}   "
               f"acks {s['acks']}   nacks {s['nacks']}", "",
               f"{'cluster':24} {'topic':20} {'members':>7} {'inflight':>8} {'backlog':>9} "
               f"{'dlq':>6}"]
        for c in b.core.clusters.values():
            out.append(f"{c.name:24} {c.topic:20} {len(c.members):>7} {len(c.leases):>8} "
                       f"{c.backlog():>9} {b.core.queue_end(c.dlq_topic):>6}"
                       + ("  CAPPED" if c.capped else ""))
        out.append("")
        out.append("JSON: /stats /clusters /topics /devices /commands   Prometheus: /metrics")
        return "\n".join(out) + "\n"
