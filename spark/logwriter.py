"""A minimal commit-log writer that follows FORMAT.md, for tests and benchmarks.

Records are encoded by the engine's codec (``lockmq.store.records.encode_record``);
only the file handling is simpler here.

Not the broker's storage engine (``lockmq.store``): no index, no fsync policy, no
recovery. It exists to write edge cases the engine refuses to produce (torn and
corrupt records) and to generate large benchmark logs quickly.
"""

from __future__ import annotations

import os

from lockmq.store.names import SEGMENT_DIR, list_segments, segment_name
from lockmq.store.records import NewRecord, encode_record

from .layout import complete_end

#: no size limit for records written here (benchmarks write large ones)
_NO_LIMIT = 1 << 32


def encode(topic: str, sn: str, seq: int, lock_ts_ms: int, broker_ts_us: int,
           payload: bytes = b"", headers: dict | None = None) -> bytes:
    """One record's bytes, encoded by the storage engine's own codec."""
    return encode_record(NewRecord(topic, sn, seq, lock_ts_ms, payload, headers), broker_ts_us,
                         _NO_LIMIT)


class LogWriter:
    """Append records to ``<data_dir>/message.log/`` segments of ``segment_bytes`` each."""

    def __init__(self, data_dir: str, segment_bytes: int = 1 << 20) -> None:
        self.dir = os.path.join(data_dir, SEGMENT_DIR)
        os.makedirs(self.dir, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.base = 0
        self.pos = 0
        self._buf: list[bytes] = []
        existing = list_segments(self.dir)
        if existing:
            self.base = existing[-1]
            with open(os.path.join(self.dir, segment_name(self.base)), "r+b") as f:
                data = f.read()
                # go on after the last whole record (the file is appended to): cut a
                # store's preallocated zeros, or a torn record, as recovery would
                self.pos = complete_end(data, 0, len(data))
                f.truncate(self.pos)

    @property
    def offset(self) -> int:
        """Log offset of the next record."""
        return self.base + self.pos

    def append_raw(self, rec: bytes) -> int:
        """Append encoded bytes as one record; returns its offset."""
        if self.pos and self.pos + len(rec) > self.segment_bytes:
            self.flush()
            self.base += self.pos
            self.pos = 0
        off = self.base + self.pos
        self._buf.append(rec)
        self.pos += len(rec)
        return off

    def append(self, topic: str, sn: str, seq: int, lock_ts_ms: int, broker_ts_us: int,
               payload: bytes = b"", headers: dict | None = None) -> int:
        """Encode and append one record; returns its offset."""
        return self.append_raw(encode(topic, sn, seq, lock_ts_ms, broker_ts_us, payload, headers))

    def flush(self) -> None:
        """Write buffered records to the current segment file."""
        path = os.path.join(self.dir, segment_name(self.base))
        with open(path, "ab") as f:
            f.write(b"".join(self._buf))
        self._buf = []

    def close(self) -> None:
        """Flush (the current segment stays the log's newest)."""
        self.flush()
