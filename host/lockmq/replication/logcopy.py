"""The standby's copy of the primary's commit log, written byte for byte.

The standby writes the primary's segment files as they are (same bases, same
offsets, same bytes, the same queue-start sidecars) and fdatasyncs before it
acknowledges. It keeps no indexes or dedup table while it follows: when it is
promoted, the store's own crash recovery (FORMAT.md) rebuilds them from the log,
so the promoted broker's dedup state is exactly the one the records imply.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

from lockmq.store import Store
from lockmq.store.files import create_file, fsync_dir
from lockmq.store.names import LOCK, SEGMENT_DIR
from lockmq.store.positions import PositionsFile
from lockmq.store.segment import Segment


class LogMismatch(Exception):
    """The primary's answer does not continue this copy (a different log)."""


class LogCopy:
    """Append-only raw copy of a commit log in ``data_dir`` (holds the data dir's lock)."""

    def __init__(self, store_config: Any) -> None:
        # the store's recovery once: cuts a torn tail a crash of the standby left
        store = Store.open(store_config)
        self.end = store.log_end
        self.base = store.segment_at(self.end)[0].base   # the active segment
        store.close_sync()
        self.data_dir = store.data_dir
        self.seg_dir = os.path.join(self.data_dir, SEGMENT_DIR)
        self._lock_fd = create_file(os.path.join(self.data_dir, LOCK), os.O_RDWR)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._active = Segment(self.seg_dir, self.base)
        self._active.open_writer()
        # a store's preallocated zeros (this directory was a primary's): segments
        # this copy closes must end where their last record ends
        self._active.truncate(self.end - self.base, durable=True)
        self._clusters: dict[str, Any] = {}

    def append(self, base: int, data: bytes, qstart: dict[str, int] | None) -> None:
        """Write ``data`` (whole records of segment ``base``) at the end, durably."""
        if base != self.base:
            if base != self.end or base < self.base:
                raise LogMismatch(f"segment {base} does not start at this copy's end "
                                  f"{self.end}")
            seg = Segment.create(self.seg_dir, base)
            seg.write_qstart(qstart or {})
            fsync_dir(self.seg_dir)
            self._active.close()
            self._active, self.base = seg, base
        self._active.write_at(data, self.end - base)
        self._active.sync()
        self.end += len(data)

    def save_clusters(self, clusters: dict[str, Any]) -> int:
        """Save the consumer clusters' state the primary sent (only what changed);
        returns how many files were written."""
        n = 0
        for name, st in clusters.items():
            state = (st.get("positions") or {}, st.get("meta") or {}, st.get("counters") or {})
            if self._clusters.get(name) == state:
                continue
            pf = PositionsFile(self.data_dir, name)
            try:
                pf.save(*state)
            finally:
                pf.close()
            self._clusters[name] = state
            n += 1
        return n

    def close(self) -> None:
        """Close the files and release the data directory."""
        self._active.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
