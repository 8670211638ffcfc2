"""Vectorised decoding of ``LockEvent`` payloads (protocol/SPEC.md) into Arrow columns.

A record carries a lock event when its topic is not a system topic (``$...``) and
its payload has the ``LockEvent`` layout; other records get nulls in these columns.
The layout constants below mirror the protocol's codec; tests check them against
``lockmq.protocol`` on the same bytes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

UTC_US = pa.timestamp("us", tz="UTC")

# Names of the protocol's EventType / Method / Result codes (protocol/_constants.py).
EVENT_TYPES = {
    1: "unlock",
    2: "failed_attempt",
    3: "door_left_open",
    4: "tamper",
    5: "low_battery",
    6: "door_opened",
    7: "door_closed",
    8: "locked",
}
METHODS = {0: "none", 1: "card", 2: "pin", 3: "remote", 4: "key", 5: "fingerprint"}
RESULTS = {0: "ok", 1: "denied_unknown", 2: "denied_expired", 3: "denied_schedule", 4: "error"}
#: Event types that count as alarms in the daily report.
ALARM_TYPES = ("door_left_open", "tamper", "low_battery")

ARROW_FIELDS = [
    ("event_type", pa.string()),
    ("method", pa.string()),
    ("result", pa.string()),
    ("event_ts", UTC_US),
    ("credential_id", pa.string()),
]
SPARK_DDL = "event_type STRING, method STRING, result STRING, event_ts TIMESTAMP, credential_id STRING"


def _lookup(codes: np.ndarray, names: dict[int, str], valid: np.ndarray) -> pa.Array:
    """Map small integer codes to names as a string array (unknown codes -> "code:N")."""
    table = np.array([names.get(i, f"code:{i}") for i in range(256)], dtype=object)
    return pa.DictionaryArray.from_arrays(
        pa.array(codes.astype(np.int32), mask=~valid), pa.array(table, type=pa.string())
    ).cast(pa.string())


def decode(arr: np.ndarray, topic: pa.Array, pay_start: np.ndarray, pay_len: np.ndarray) -> dict[str, pa.Array]:
    """Decode the LockEvent fields of every record whose payload is a LockEvent."""
    from . import lockevent_layout as L

    n = len(pay_start)
    is_event = L.candidates(arr, pay_start, pay_len)
    if n and is_event.any():
        system = np.asarray(topic.to_numpy(zero_copy_only=False).astype("U1") == "$")
        is_event &= ~system
    if not n or not is_event.any():
        return {name: pa.nulls(n, typ) for name, typ in ARROW_FIELDS}
    fields = L.extract(arr, pay_start, pay_len, is_event)
    ts = fields["ts_ms"]
    ts_ok = is_event & (ts > 0) & (ts <= (np.iinfo(np.int64).max // 1000))
    cred = fields["credential"]
    return {
        "event_type": _lookup(fields["event_type"], EVENT_TYPES, is_event),
        "method": _lookup(fields["method"], METHODS, is_event),
        "result": _lookup(fields["result"], RESULTS, is_event),
        "event_ts": pa.array(np.where(ts_ok, ts, 0).astype(np.int64) * 1000, type=UTC_US, mask=~ts_ok),
        "credential_id": pa.array(cred, type=pa.string(), mask=~is_event | (cred == None)),  # noqa: E711
    }
