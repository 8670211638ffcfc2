"""What a delivered record looks like over MQTT, and a command's result.

``raw``: the PUBLISH payload is the record's payload; MQTT 5 adds the record's id
as user properties (``sn``, ``seq``, ``msg_id``, ``lock_ts_ms``, ``delivery``) --
what an idempotent consumer keys on. ``json`` (for MQTT 3.1.1 clients, which have
no properties): one JSON object with those fields and ``payload_b64``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from lockmq.protocol import CommandStatus
from lockmq.store import StoredRecord

#: CommandStatus value -> name (OK, FAILED, REFUSED, EXPIRED, OFFLINE, UNSUPPORTED)
STATUS_NAMES = {v: k for k, v in vars(CommandStatus).items()
                if k.isupper() and isinstance(v, int)}


def record_fields(rec: StoredRecord, delivery: int) -> dict[str, Any]:
    """The id fields of a record as delivered."""
    return {"topic": rec.topic, "sn": rec.sn, "seq": rec.seq, "msg_id": f"{rec.sn}:{rec.seq}",
            "lock_ts_ms": rec.lock_ts_ms, "broker_ts_us": rec.broker_ts_us,
            "delivery": delivery}


def user_properties(rec: StoredRecord, delivery: int) -> list[tuple[str, str]]:
    """MQTT 5 user properties of a delivered record."""
    return [("sn", rec.sn), ("seq", str(rec.seq)), ("msg_id", f"{rec.sn}:{rec.seq}"),
            ("lock_ts_ms", str(rec.lock_ts_ms)), ("delivery", str(delivery))]


def json_envelope(rec: StoredRecord, delivery: int) -> bytes:
    """The ``json`` envelope of a delivered record."""
    out = record_fields(rec, delivery)
    out["payload_b64"] = base64.b64encode(rec.payload).decode("ascii")
    return json.dumps(out, separators=(",", ":")).encode()


def command_result(sn: str, kind: str, status: int, detail: str,
                   error: str = "") -> bytes:
    """The JSON a command's result (or refusal) is published as."""
    out: dict[str, Any] = {"sn": sn, "kind": kind, "status": STATUS_NAMES.get(status, status),
                           "detail": detail}
    if error:
        out["error"] = error
    return json.dumps(out, separators=(",", ":")).encode()
