"""Security events: one log line and one counter each.

Log lines go to the ``lockmq.security`` logger as ``event key=value ...`` with the
same fields in ``extra={"event": ..., "fields": {...}}`` for structured handlers.
Counters are ``security_<event>_total{reason=...}``; :meth:`Metrics.snapshot` gives
them to the broker's metrics endpoint.

A flood of hostile connections must not become a flood of log lines (a full disk is
a denial of service too): each event type may log ``LOG_RATE`` lines per second
(burst ``LOG_BURST``); the lines it drops are counted and the next line it writes
says ``suppressed=N``. Counters always count everything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Callable

log = logging.getLogger("lockmq.security")

#: Log lines per second per event type, and the burst allowed.
LOG_RATE = 20.0
LOG_BURST = 200

#: Events logged at WARNING (refusals); everything else is INFO.
_WARN = {"auth_failed", "auth_rate_limited", "permission_denied", "sn_mismatch",
         "connection_refused", "rate_limited", "limit_exceeded", "auth_timeout",
         "plain_token_refused", "command_network_change", "bad_command"}


def _fmt(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' ="\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def _safe(value: Any, limit: int = 80) -> Any:
    """Peer-chosen strings are cut and made printable before they reach a log."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[:limit]).decode("ascii", "backslashreplace")
    if isinstance(value, str):
        value = value[:limit].encode("ascii", "backslashreplace").decode("ascii")
    return value


class Metrics:
    """Thread-safe counters of security events by ``(event, reason)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        #: Optional extra log sink ``sink(event, level=..., **fields)`` (the broker's log).
        self.sink: Callable[..., None] | None = None
        self._log_budget: dict[str, list[float]] = {}   # event -> [tokens, stamp, dropped]

    def may_log(self, event: str, now: float | None = None) -> int:
        """-1 if a line for ``event`` is over the log rate, else the lines dropped before."""
        now = time.monotonic() if now is None else now
        with self._lock:
            b = self._log_budget.get(event)
            if b is None:
                b = self._log_budget[event] = [float(LOG_BURST), now, 0.0]
            b[0] = min(float(LOG_BURST), b[0] + (now - b[1]) * LOG_RATE)
            b[1] = now
            if b[0] < 1.0:
                b[2] += 1
                return -1
            b[0] -= 1.0
            dropped, b[2] = int(b[2]), 0.0
            return dropped

    def inc(self, event: str, reason: str = "", n: int = 1) -> None:
        """Add ``n`` to ``(event, reason)``."""
        with self._lock:
            self._counts[(event, reason)] += n

    def get(self, event: str, reason: str | None = None) -> int:
        """The count of ``event`` (all reasons when ``reason`` is None)."""
        with self._lock:
            if reason is not None:
                return self._counts[(event, reason)]
            return sum(v for (e, _), v in self._counts.items() if e == event)

    def snapshot(self) -> dict[str, int]:
        """``{"security_<event>_total{reason=\"...\"}": n}`` (Prometheus-style names)."""
        with self._lock:
            out = {}
            for (event, reason), n in sorted(self._counts.items()):
                label = f'{{reason="{reason}"}}' if reason else ""
                out[f"security_{event}_total{label}"] = n
            return out


def record(metrics: Metrics, event: str, reason: str = "", **fields: Any) -> None:
    """Count ``event`` and log it with its fields (peer-chosen values sanitised)."""
    metrics.inc(event, reason)
    dropped = metrics.may_log(event)
    if dropped < 0:
        return
    clean = {k: _safe(v) for k, v in fields.items() if v is not None}
    if reason:
        clean = {"reason": reason, **clean}
    if dropped:
        clean["suppressed"] = dropped
    text = " ".join([event] + [f"{k}={_fmt(v)}" for k, v in clean.items()])
    level = logging.WARNING if event in _WARN else logging.INFO
    if metrics.sink is None or log.hasHandlers():   # no double lines via lastResort
        log.log(level, text, extra={"event": event, "fields": clean})
    if metrics.sink is not None:
        try:
            metrics.sink("security_" + event, level="warning" if level == logging.WARNING
                         else "info", **clean)
        except Exception:  # a broken sink must not break authentication
            log.exception("security log sink failed")
