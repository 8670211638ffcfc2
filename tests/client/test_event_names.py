"""Consumers get lock events and command kinds by name (lockmq.client.events): enums
built from protocol/table.py, whose text form is the one name the lock logs."""

from __future__ import annotations

import json

import pytest

from lockmq.client import CommandKind, CommandStatus, EventType, Method, Result, decode_event
from lockmq.protocol import BadBody, LockEvent
from lockmq.protocol import CommandKind as WireKind
from lockmq.protocol import EventType as WireType
from lockmq.protocol import table


def test_each_enum_is_the_tables_rows_and_the_wires_numbers() -> None:
    assert [(m.name, int(m)) for m in EventType] == [(r[0], r[1]) for r in table.EVENT_TYPES]
    assert EventType.DOOR_LEFT_OPEN == WireType.DOOR_LEFT_OPEN == 3
    assert CommandKind.FW_UPDATE == WireKind.FW_UPDATE
    assert [str(k) for k in CommandKind] == [r[2] for r in table.COMMAND_KINDS]


def test_the_text_form_is_the_one_name() -> None:
    assert str(EventType.DOOR_LEFT_OPEN) == "door_left_open"
    assert f"{EventType.LOW_BATTERY}" == "low_battery"
    assert (str(CommandKind.CARDS_SET), str(CommandKind.FW_UPDATE)) == ("cards", "fw-update")
    assert str(CommandStatus.REFUSED) == "refused" and str(Method.CARD) == "card"
    assert CommandKind.from_name("fw-update") is CommandKind.FW_UPDATE
    with pytest.raises(ValueError, match="unknown EventType 'door_open'"):
        EventType.from_name("door_open")


def test_a_decoded_event_carries_enums_and_says_names_as_json() -> None:
    ev = decode_event(LockEvent(3, 1_000, 0, 0, 60, b"\x0a\x1b").encode())
    assert ev.event_type is EventType.DOOR_LEFT_OPEN and ev.result is Result.OK
    assert json.loads(json.dumps(ev.to_dict())) == {
        "event_type": "door_left_open", "method": "none", "result": "ok", "value": 60,
        "ts_ms": 1000, "credential": "0a1b"}


def test_a_code_from_a_newer_lock_is_named_not_refused() -> None:
    ev = decode_event(LockEvent(42, 5).encode())
    assert ev.event_type == 42 and str(ev.event_type) == "code:42"
    with pytest.raises(BadBody):
        decode_event(b"\x01\x02")


def test_a_consumers_message_decodes_to_named_codes() -> None:
    from lockmq.client import Message

    msg = Message("lock.events", "LOCK-1", 7, LockEvent(2, 9, 1, 1, 0, b"\x01").encode())
    ev = msg.event()
    assert (ev.event_type, ev.method, ev.result) == (EventType.FAILED_ATTEMPT, Method.CARD,
                                                     Result.DENIED_UNKNOWN)
    assert ev.to_dict()["event_type"] == "failed_attempt"
