"""Lock events and command kinds by name, for consumers.

The protocol carries codes (``event_type`` 3); a consumer gets enums whose names come
from the one protocol table (protocol/table.py), the same the lock logs, the CLI
prints and Spark writes::

    from lockmq.client import EventType, decode_event

    def handle(msg):
        ev = decode_event(msg.payload)
        if ev.event_type is EventType.DOOR_LEFT_OPEN:     # an IntEnum: == 3 too
            alert(ev.to_dict())   # {"event_type": "door_left_open", "method": "none", ...}

``str(EventType.DOOR_LEFT_OPEN)`` is ``"door_left_open"``; a code the table does not
know (a newer lock) decodes to a member named ``code:9`` instead of failing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from lockmq.protocol import LockEvent
from lockmq.protocol import table as _table


class _Named(enum.IntEnum):
    """An IntEnum whose text form is the table's one name of the code."""

    def __str__(self) -> str:
        return _WORDS[type(self)].get(int(self), self.name)

    def __format__(self, spec: str) -> str:   # f"{ev.event_type}" says the name too
        return format(str(self), spec)

    @classmethod
    def _missing_(cls, value: object) -> "_Named | None":
        if not isinstance(value, int):
            return None
        member = int.__new__(cls, value)       # a code from a newer lock: named, not refused
        member._name_ = f"code:{value}"
        member._value_ = value
        return member

    @classmethod
    def from_name(cls, word: str) -> "_Named":
        """The member whose one name (``door_left_open``, ``fw-update``) is ``word``;
        ``ValueError`` naming the known ones otherwise."""
        for code, text in _WORDS[cls].items():
            if text == word:
                return cls(code)
        raise ValueError(f"unknown {cls.__name__} {word!r} (known: {', '.join(_WORDS[cls].values())})")


_WORDS: dict[type, dict[int, str]] = {}


def _enum(name: str, rows: tuple, doc: str) -> Any:
    cls = _Named(name, [(row[0], row[1]) for row in rows], module=__name__)
    cls.__doc__ = doc
    _WORDS[cls] = _table.names(rows)
    return cls


EventType = _enum("EventType", _table.EVENT_TYPES, "What happened at a lock (``event_type``).")
Method = _enum("Method", _table.METHODS, "How the lock was operated (``method``).")
Result = _enum("Result", _table.RESULTS, "The outcome (``result``).")
CommandKind = _enum("CommandKind", _table.COMMAND_KINDS,
                    "A downlink command's kind; its text form is what the CLI takes.")
CommandStatus = _enum("CommandStatus", _table.COMMAND_STATUS, "A command's outcome at the lock.")


@dataclass(frozen=True)
class Event:
    """A decoded lock event, its codes as enums."""

    event_type: EventType
    method: Method
    result: Result
    value: int
    ts_ms: int
    credential: bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly: the codes by their one names, the credential in hex."""
        return {"event_type": str(self.event_type), "method": str(self.method),
                "result": str(self.result), "value": self.value, "ts_ms": self.ts_ms,
                "credential": self.credential.hex()}


def decode_event(payload: bytes) -> Event:
    """A ``lock.events`` payload as an :class:`Event` (``BadBody`` if it is not one)."""
    ev = LockEvent.decode(payload)
    return Event(EventType(ev.event_type), Method(ev.method), Result(ev.result), ev.value,
                 ev.ts_ms, bytes(ev.credential))
