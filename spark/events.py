"""Vectorised decoding of ``LockEvent`` payloads (protocol/_event.py) into Arrow columns.

The protocol's lock-event record, big-endian::

    event_type u8 | method u8 | result u8 | value u16 | ts_ms u64 | cred_len u8 | credential

A record carries a lock event when its topic is not a system topic (``$...``) and
its payload has exactly this layout (``len == 14 + cred_len``); other records get
nulls in these columns. Tests check this decoder against ``lockmq.protocol.LockEvent``.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

from lockmq.protocol import table as protocol_table
from lockmq.protocol import EVENT_FORMAT as _EVT, EVENT_HEADER_SIZE

from .arrays import at_every_byte, struct_dtype

UTC_US = pa.timestamp("us", tz="UTC")


# The one names of the event type / method / result codes (protocol/table.py, the
# names the lock logs and the client's enums say): "unlock", "card", "ok" ...
EVENT_TYPES = protocol_table.names(protocol_table.EVENT_TYPES)
METHODS = protocol_table.names(protocol_table.METHODS)
RESULTS = protocol_table.names(protocol_table.RESULTS)
#: Event types that count as alarms in the daily report.
ALARM_TYPES = ("door_left_open", "tamper", "low_battery")

ARROW_FIELDS = [
    ("event_type", pa.string()),
    ("method", pa.string()),
    ("result", pa.string()),
    ("value", pa.int32()),
    ("event_ts", UTC_US),
    ("credential_id", pa.string()),
]
SPARK_DDL = ("event_type STRING, method STRING, result STRING, value INT, event_ts TIMESTAMP, "
             "credential_id STRING")

_HEX = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), dtype=np.uint8).reshape(256, 2)
_MAX_MS = np.iinfo(np.int64).max // 1000


def _names(table: dict[int, str]) -> pa.Array:
    return pa.array([table.get(i, f"code:{i}") for i in range(256)], type=pa.string())


_TYPE_NAMES, _METHOD_NAMES, _RESULT_NAMES = _names(EVENT_TYPES), _names(METHODS), _names(RESULTS)


def _lookup(codes: np.ndarray, names: pa.Array, valid: np.ndarray) -> pa.Array:
    """Small integer codes -> their names (null where not ``valid``)."""
    idx = pa.array(codes.astype(np.int32), mask=~valid)
    return pa.DictionaryArray.from_arrays(idx, names).cast(pa.string())


#: The fixed part of a LockEvent and its credential length byte, as the protocol's
#: codec packs it (``lockmq.protocol._event._EVT``, then the ``pack8`` length).
EVENT_DTYPE = struct_dtype(struct.Struct(_EVT + "B"), ("event_type", "method", "result", "value", "ts_ms",
                                                        "cred_len"))
assert EVENT_DTYPE.itemsize == EVENT_HEADER_SIZE + 1


def decode(arr: np.ndarray, topic_start: np.ndarray, pay_start: np.ndarray, pay_len: np.ndarray) -> dict[str, pa.Array]:
    """The LockEvent columns for records whose payload starts at ``pay_start`` in ``arr``.

    ``topic_start`` locates each record's topic (a ``$`` topic is a system topic).
    """
    n = len(pay_start)
    is_event = (pay_len >= EVENT_HEADER_SIZE + 1) & (arr[topic_start] != ord("$"))
    if not is_event.any():
        return {name: pa.nulls(n, typ) for name, typ in ARROW_FIELDS}
    starts = np.where(is_event, pay_start, 0)
    head = at_every_byte(arr, EVENT_DTYPE)[starts]
    cred_len = head["cred_len"].astype(np.int64)
    is_event &= pay_len == EVENT_HEADER_SIZE + 1 + cred_len
    if not is_event.any():
        return {name: pa.nulls(n, typ) for name, typ in ARROW_FIELDS}
    value = head["value"].astype(np.int32)
    ts = head["ts_ms"]
    ts_ok = is_event & (ts > 0) & (ts <= _MAX_MS)
    # credential bytes -> lowercase hex, gathered without a per-row loop
    clen = np.where(is_event, cred_len, 0)
    has_cred = clen > 0
    offs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(clen, out=offs[1:])
    total = int(offs[-1])
    idx = np.repeat(starts + EVENT_HEADER_SIZE + 1 - offs[:-1], clen) + np.arange(total, dtype=np.int64)
    hexdata = _HEX[arr[idx]].reshape(-1)
    cred = pa.Array.from_buffers(
        pa.string(), n,
        [pa.py_buffer(np.packbits(has_cred, bitorder="little")),
         pa.py_buffer((offs * 2).astype(np.int32)), pa.py_buffer(hexdata)],
        null_count=int(n - has_cred.sum()),
    )
    return {
        "event_type": _lookup(head["event_type"], _TYPE_NAMES, is_event),
        "method": _lookup(head["method"], _METHOD_NAMES, is_event),
        "result": _lookup(head["result"], _RESULT_NAMES, is_event),
        "value": pa.array(value, mask=~is_event),
        "event_ts": pa.array(np.where(ts_ok, ts, 0).astype(np.int64) * 1000, type=UTC_US, mask=~ts_ok),
        "credential_id": cred,
    }
