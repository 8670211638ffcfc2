"""The standby's status page: ``/health``, ``/metrics`` and a text summary on the
``status_port`` while it follows (the broker's own page opens there once promoted).

A following standby serves no client, but it is what an operator must watch most:
how far behind it is, whether it reaches its primary, whether it would promote
itself. ``/metrics`` has the same ``lockmq_replication_*`` names as the primary's
(``lockmq_replication_primary`` is 0 here), ``lockmq_build_info`` and the process
collectors, so one dashboard and one rule file cover both machines.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Iterator

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from lockmq.build_info import build_info_family

if TYPE_CHECKING:
    from .standby import Follower

#: a request must arrive whole within this long (the page is loopback by default)
READ_TIMEOUT_S = 5.0


class _StandbyCollector(Collector):
    def __init__(self, follower: "Follower") -> None:
        self.follower = follower

    def collect(self) -> Iterator[Metric]:
        yield build_info_family()
        for name, (help_text, value) in gauges(self.follower).items():
            yield GaugeMetricFamily("lockmq_" + name, help_text, value=value)


def gauges(f: "Follower") -> dict[str, tuple[str, float]]:
    """The standby's replication state: name -> (help, value)."""
    now = time.monotonic()
    reachable = f._unreachable_since is None and f._last_ok is not None
    return {
        "replication_primary": ("1: this broker serves as the primary; 0: a standby "
                                "that follows", 0),
        "replication_standby_following": ("1 while this standby follows its primary", 1),
        "replication_primary_reachable": ("1 while the primary answers this standby's "
                                          "fetches", 1 if reachable else 0),
        "replication_primary_last_answer_seconds": (
            "Seconds since the primary last answered a fetch (-1: never since the start)",
            now - f._last_ok if f._last_ok is not None else -1.0),
        "replication_log_end_bytes": ("Commit-log offset copied here", f.copy.end),
        "replication_primary_log_end_bytes": ("The primary's commit-log end in its last "
                                              "answer", f.primary_log_end),
        "replication_lag_bytes": ("Commit-log bytes of the primary not copied here yet",
                                  max(0, f.primary_log_end - f.copy.end)),
        "replication_was_in_sync": ("1 once the primary reported this standby in sync "
                                    "since it started", 1 if f.was_in_sync else 0),
        "replication_primary_fence_seconds": ("The primary's fence_after_s (0: no fence)",
                                              f.primary_fence_s),
        "replication_promote_after_seconds": ("This standby promotes itself after the "
                                              "primary is unreachable this long (0: never)",
                                              f.settings.promote_after_s),
        "replication_auto_promote_safe": ("1 when promoting by promote_after_s cannot serve "
                                          "beside an acking primary (fenced, in sync, "
                                          "waits longer than the fence)",
                                          0 if f.auto_promote_safe() else 1),
    }


def summary(f: "Follower") -> str:
    """The page as text (``/`` and ``/summary``)."""
    g = {k: v for k, (_, v) in gauges(f).items()}
    unsafe = f.auto_promote_safe()
    lines = [
        f"lockmq standby of {f.settings.primary} (following, serving no client)",
        f"  copied {int(g['replication_log_end_bytes'])} bytes; primary at "
        f"{int(g['replication_primary_log_end_bytes'])}; lag "
        f"{int(g['replication_lag_bytes'])} bytes",
        "  primary reachable" if g["replication_primary_reachable"] else
        f"  primary UNREACHABLE (last answer "
        f"{g['replication_primary_last_answer_seconds']:.1f} s ago)",
        f"  in sync since start: {'yes' if f.was_in_sync else 'no'}; primary fence "
        f"{f.primary_fence_s:g} s",
        f"  promotes itself after {f.settings.promote_after_s:g} s" if
        f.settings.promote_after_s and not unsafe else
        ("  promotes itself only by hand (lockmq standby promote)"
         if not f.settings.promote_after_s else f"  automatic promotion not safe: {unsafe}"),
        "Prometheus: /metrics",
    ]
    return "\n".join(lines) + "\n"


class StandbyStatus:
    """The HTTP listener (GET only, one request per connection)."""

    def __init__(self, follower: "Follower") -> None:
        self.follower = follower
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StandbyCollector(follower))
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self.server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; the port bound."""
        self.server = await asyncio.start_server(self._serve, host, port, reuse_address=True)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close the listener (before the promoted broker opens its page there)."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None

    def render(self, path: str) -> tuple[str, str, bytes]:
        """(status, content type, body) of ``path``."""
        if path == "/health":
            return "200 OK", "text/plain", b"standby\n"
        if path == "/metrics":
            return "200 OK", "text/plain; version=0.0.4; charset=utf-8", \
                generate_latest(self.registry)
        if path in ("/", "/summary"):
            return "200 OK", "text/plain; charset=utf-8", summary(self.follower).encode()
        return "404 Not Found", "text/plain", b"not found (a standby serves /, /health, " \
            b"/metrics)\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, ctype, body = "400 Bad Request", "text/plain", b"GET only\n"
            else:
                status, ctype, body = self.render(parts[1].split("?", 1)[0])
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: "
                         f"{len(body)}\r\nConnection: close\r\n\r\n".encode()
                         + (body if parts[:1] != ["HEAD"] else b""))
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
