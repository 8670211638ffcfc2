"""Structured logs (one line per event), for every part of lockmq that logs: the
broker, the registry server, a standby.

A log line is ``ts=... level=info event=publish_busy conn=12 peer=1.2.3.4:5 ...``
(``log_format = "kv"``) or one JSON object per line (``"json"``). Events are short
snake_case names; every field is a key.

Lines go through stdlib :mod:`logging`: a logger of the broker's own (not in the
process-wide hierarchy, so two brokers in one process keep their own settings)
with one handler -- stderr by default (journald under systemd), or
``[broker] log_file``: a :class:`logging.handlers.WatchedFileHandler`, which
notices when logrotate has moved the file away and opens a new one at the next
line, so rotation needs neither ``copytruncate`` nor a signal. The file is created
owner-only (the lines name SNs and peers).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import logging.handlers
import os
import sys
import time
from typing import Any, TextIO


_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40}
#: seconds between two lines of one :meth:`EventLog.limited` key
LIMITED_EVERY_S = 1.0


def _kv(value: Any) -> str:
    s = str(value)
    if not s or any(c in s for c in ' "=\n\t'):
        return json.dumps(s)
    return s


def iso_stamp(ts: float) -> str:
    """``ts`` (Unix seconds) as ISO 8601 UTC with milliseconds: the one timestamp
    format of every log line, kv and JSON alike (``2026-12-01T20:30:46.249Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


class EventFormatter(logging.Formatter):
    """Formats a record made by :class:`EventLog` as one ``kv`` or ``json`` line."""

    def __init__(self, fmt: str = "kv") -> None:
        super().__init__()
        self.fmt = fmt

    def format(self, record: logging.LogRecord) -> str:
        ts = record.created
        level = getattr(record, "event_level", record.levelname.lower())
        fields: dict[str, Any] = getattr(record, "event_fields", {})
        event = record.getMessage()
        stamp = iso_stamp(ts)
        if self.fmt == "json":
            rec = {"ts": stamp, "level": level, "event": event}
            rec.update(fields)
            return json.dumps(rec, default=str)
        return " ".join([f"ts={stamp}", f"level={level}", f"event={event}"]
                        + [f"{k}={_kv(v)}" for k, v in fields.items() if v is not None])


class _QuietErrors:
    """A log write that fails (disk full, closed stream) must neither break the
    broker nor print a traceback per line: the line is dropped."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 -- logging's name
        pass


class StderrHandler(_QuietErrors, logging.StreamHandler):  # type: ignore[type-arg]
    """The default: one line per event on a stream (stderr)."""


class RotatableFileHandler(_QuietErrors, logging.handlers.WatchedFileHandler):
    """``log_file``: reopened when logrotate moves it; created with mode 0600."""

    def _open(self) -> TextIO:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return open(fd, self.mode, encoding=self.encoding, errors=self.errors)


def make_handler(log_file: str = "", stream: TextIO | None = None) -> logging.Handler:
    """The handler for ``[broker] log_file`` (empty: ``stream``, default stderr)."""
    if log_file:
        return RotatableFileHandler(log_file, encoding="utf-8")
    return StderrHandler(stream or sys.stderr)


class EventLog:
    """Logs one line per event: ``log(event, level="info", **fields)``."""

    def __init__(self, level: str = "INFO", fmt: str = "kv", stream: TextIO | None = None,
                 log_file: str = "") -> None:
        self.level = _LEVELS.get(level.upper(), 20)
        self.fmt = fmt
        self.logger = logging.Logger("lockmq.events", self.level)
        self.log_file = log_file
        self._stream = stream
        handler = make_handler(log_file, stream)
        handler.setFormatter(EventFormatter(fmt))
        self.logger.addHandler(handler)
        self._budget: dict[str, list[float]] = {}   # limited(): key -> [last line, left out]

    def reconfigure(self, level: str, fmt: str, log_file: str) -> None:
        """Apply new ``log_level`` / ``log_format`` / ``log_file`` (a reload): the
        handler is replaced only when the destination changed."""
        handler = make_handler(log_file, self._stream) if log_file != self.log_file else None
        self.level = _LEVELS.get(level.upper(), 20)
        self.logger.setLevel(self.level)
        self.fmt = fmt
        if handler is not None:   # opened first: a file that cannot be opened changes nothing
            for old in list(self.logger.handlers):
                self.logger.removeHandler(old)
                old.close()
            self.logger.addHandler(handler)
            self.log_file = log_file
        for h in self.logger.handlers:
            h.setFormatter(EventFormatter(fmt))

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        """Log ``event`` with ``fields`` at ``level`` (debug/info/warning/error)."""
        levelno = _LEVELS.get(level.upper(), 20)
        if levelno < self.level:
            return
        self.logger.log(levelno, event, extra={"event_level": level, "event_fields": fields})

    def limited(self, event: str, key: str = "", level: str = "info", **fields: Any) -> None:
        """Log ``event`` at most once a second per ``key`` (default: the event), for
        what a peer can repeat at will (refused requests); the next line says how many
        were left out (``suppressed``). Counters count them all."""
        now = time.monotonic()
        b = self._budget.setdefault(key or event, [0.0, 0])
        if now - b[0] < LIMITED_EVERY_S:
            b[1] += 1
            return
        if b[1]:
            fields["suppressed"] = int(b[1])
        b[0], b[1] = now, 0
        self(event, level=level, **fields)

    def close(self) -> None:
        """Close the handlers (the log file); later lines are dropped."""
        for h in list(self.logger.handlers):
            self.logger.removeHandler(h)
            h.close()
        self.logger.addHandler(logging.NullHandler())   # not logging's stderr fallback


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
            message, fields = _without_reprs(record)
            self.log(self.event, level=level, message=message, **fields)
        except Exception:  # noqa: BLE001 -- logging must never break the broker
            pass


def _without_reprs(record: logging.LogRecord) -> tuple[str, dict[str, Any]]:
    """The record's message with each dataclass argument (the store's
    ``RecoveryReport``) named by its class, and that argument's fields as fields of
    the line: a log line carries keys, never a Python repr."""
    args = record.args if isinstance(record.args, tuple) else ()
    if not any(dataclasses.is_dataclass(a) and not isinstance(a, type) for a in args):
        return record.getMessage(), {}
    fields: dict[str, Any] = {}
    shown = []
    for arg in args:
        if dataclasses.is_dataclass(arg) and not isinstance(arg, type):
            for f in dataclasses.fields(arg):
                value = getattr(arg, f.name)
                if isinstance(value, float):
                    value = round(value, 6)
                elif isinstance(value, (list, tuple)):
                    value = "; ".join(map(str, value)) or None
                # (never the line's own keys: EventLog's ``level`` and ``event``)
                fields[f.name if f.name not in ("level", "event", "message")
                       else "field_" + f.name] = value
            shown.append(type(arg).__name__)
        else:
            shown.append(arg)
    return str(record.msg) % tuple(shown), fields
