"""Structured logs (one line per event) and the broker's counters.

A log line is ``ts=... level=info event=publish_busy conn=12 peer=1.2.3.4:5 ...``
(``log_format = "kv"``) or one JSON object per line (``"json"``). Events are short
snake_case names; every field is a key. Counters are plain integers in
:class:`Stats`, exposed by the ``stats`` admin op and the status page.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40}


def _kv(value: Any) -> str:
    s = str(value)
    if not s or any(c in s for c in ' "=\n\t'):
        return json.dumps(s)
    return s


class EventLog:
    """Writes one line per event to a stream (stderr by default)."""

    def __init__(self, level: str = "INFO", fmt: str = "kv", stream: TextIO | None = None) -> None:
        self.level = _LEVELS.get(level.upper(), 20)
        self.fmt = fmt
        self.stream = stream or sys.stderr

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        """Log ``event`` with ``fields`` at ``level`` (debug/info/warning/error)."""
        if _LEVELS.get(level.upper(), 20) < self.level:
            return
        ts = time.time()
        if self.fmt == "json":
            rec = {"ts": round(ts, 6), "level": level, "event": event}
            rec.update(fields)
            line = json.dumps(rec, default=str)
        else:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"
            line = " ".join([f"ts={stamp}", f"level={level}", f"event={event}"]
                            + [f"{k}={_kv(v)}" for k, v in fields.items() if v is not None])
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass


class EventLogHandler(logging.Handler):
    """Routes a library's Python ``logging`` records (the store's recovery and
    retention messages) into the broker's one-line event log."""

    def __init__(self, log: EventLog, event: str) -> None:
        super().__init__(logging.INFO)
        self.log = log
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = "warning" if record.levelno >= logging.WARNING else "info"
            if record.levelno >= logging.ERROR:
                level = "error"
            self.log(self.event, level=level, message=record.getMessage())
        except Exception:  # noqa: BLE001 -- logging must never break the broker
            pass


class Stats:
    """The broker's counters (monotonic) and gauges (set by the broker)."""

    COUNTERS = (
        "connections_accepted", "connections_closed", "connections_refused",
        "handshakes_ok", "handshakes_failed", "frames_in", "frames_out", "bytes_in",
        "bytes_out", "bad_frames", "publish_received", "publish_stored",
        "publish_duplicates", "publish_busy", "publish_refused", "publish_oneway",
        "publish_oneway_refused",
        "store_batches", "acks", "nacks", "unknown_leases", "pulls", "messages_delivered",
        "notifies", "devices_online_events", "devices_offline_events", "devices_evicted",
        "commands_received", "commands_forwarded", "commands_results", "commands_expired",
        "commands_refused", "admin_requests", "reads_paused", "errors_sent",
        "system_records",
    )

    def __init__(self) -> None:
        self.c: dict[str, int] = dict.fromkeys(self.COUNTERS, 0)
        self.started = time.time()

    def inc(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name``."""
        self.c[name] = self.c.get(name, 0) + n

    def snapshot(self) -> dict[str, Any]:
        """The counters plus uptime."""
        out: dict[str, Any] = dict(self.c)
        out["uptime_s"] = round(time.time() - self.started, 3)
        return out
