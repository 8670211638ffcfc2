"""Settings of the storage engine: every limit is a field with a sane default."""

from __future__ import annotations

import os
from dataclasses import dataclass

MiB = 1024 * 1024
GiB = 1024 * MiB
#: a limit of -1 means "no limit" (Kafka's ``retention.ms = -1``): TOML has no None
FOREVER = -1
#: the limits that may be -1 (or None in Python)
OPTIONAL_LIMITS = ("retention_ms", "retention_bytes", "segment_ms")
#: the writer thread's scheduling policies (``writer_sched``)
WRITER_SCHED = ("batch", "normal")


@dataclass
class StoreConfig:
    """Configuration of one :class:`~lockmq.store.Store`.

    Attributes:
        data_dir: directory holding ``message.log/``, the indexes, the consume
            positions, the dedup snapshot and the checkpoint. Created if missing.
        segment_bytes: size at which a commit-log segment is closed and a new one
            started (128 MiB). Also the upper bound of one record.
        segment_ms: age at which the active segment is closed even if it is small
            (Kafka's ``segment.ms``; 1 day), so that a quiet gateway's records reach
            retention and ``lockmq export`` (closed segments only). The age counts
            from the segment's first record; the broker's retention timer also closes
            an old segment when no new write comes. ``-1`` (or None): size only.
        flush: ``"sync"`` (default) resolves :meth:`Store.append` only after the
            fdatasync that covers the record; ``"async"`` resolves after ``write()``
            and fdatasyncs every ``flush_interval_ms``. See docs/storage.md for what
            ``async`` can lose.
        flush_interval_ms: fdatasync period in ``async`` mode.
        checkpoint_interval_ms: how often the indexes, the dedup table and the
            checkpoint are made durable. Crash recovery re-reads at most the log
            written since the last checkpoint, so this bounds start-up time.
        checkpoint_bytes: also checkpoint after this many log bytes.
        retention_ms: closed segments whose newest write is older than this are
            deleted by :meth:`Store.enforce_retention`, also when a consumer cluster
            has not read them yet (the cluster skips forward; counted and logged):
            retention can never fill the disk. ``-1`` (Kafka's spelling; None in
            Python) keeps them forever; 0 is refused.
        retention_bytes: total commit-log size above which the oldest closed
            segments are deleted, read or not. ``-1`` (or None) means no size limit.
        min_free_bytes: disk reserve; a batch that would leave less free space on
            the file system is refused with :class:`StoreFull`.
        dedup_window: how many sequence numbers below a lock's highest stored
            sequence are remembered exactly (at most 65535); older ones count as
            duplicates.
        dedup_max_sns: how many locks (SNs) the dedup table remembers; the least
            recently written are forgotten first.
        preallocate_bytes: how far ahead of its last record the active segment's
            file is already written with zeros (4 MiB; 0: no preallocation). A group
            commit that only overwrites zeros leaves the file size alone, so its
            fdatasync flushes data without a file-system journal commit. The zeros
            are written, and made durable, by the commit that comes within half of
            this of their end; a closed segment is cut to its last record.
        max_record_bytes: largest encoded record accepted (capped at segment_bytes).
        max_batch_bytes: most bytes written by one group commit.
        max_pending_bytes: bytes waiting for the writer above which
            :meth:`Store.append` raises :class:`StoreBusy`.
        writer_sched: the writer thread's scheduling policy on Linux. ``"batch"``
            (default, ``SCHED_BATCH``): the same CPU share as any thread, but waking up
            (a batch queued, an fdatasync done) does not preempt the running event
            loop -- on one core each such preemption cost two context switches and
            often a wait for the GIL. ``"normal"``: the operating system's default.
    """

    data_dir: str | os.PathLike[str] = "./data"
    segment_bytes: int = 128 * MiB
    segment_ms: int | None = 24 * 3600 * 1000
    flush: str = "sync"
    flush_interval_ms: int = 200
    checkpoint_interval_ms: int = 2000
    checkpoint_bytes: int = 16 * MiB
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    retention_bytes: int | None = None
    min_free_bytes: int = 256 * MiB
    dedup_window: int = 1024
    dedup_max_sns: int = 200_000
    preallocate_bytes: int = 4 * MiB
    max_record_bytes: int = 1 * MiB
    max_batch_bytes: int = 4 * MiB
    max_pending_bytes: int = 64 * MiB
    writer_sched: str = "batch"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first setting that is out of range."""
        for name in ("segment_bytes", "flush_interval_ms", "checkpoint_interval_ms",
                     "checkpoint_bytes", "min_free_bytes", "dedup_window", "dedup_max_sns",
                     "max_record_bytes", "max_batch_bytes", "max_pending_bytes",
                     "retention_ms", "retention_bytes", "segment_ms", "preallocate_bytes"):
            value = getattr(self, name)
            if value is None and name in OPTIONAL_LIMITS:
                continue
            if type(value) is not int:
                raise ValueError(f"{name} must be an integer, not {value!r}")
        if self.flush not in ("sync", "async"):
            raise ValueError(f"flush must be 'sync' or 'async', not {self.flush!r}")
        if self.writer_sched not in WRITER_SCHED:
            names = " or ".join(repr(policy) for policy in WRITER_SCHED)
            raise ValueError(f"writer_sched must be {names}, not {self.writer_sched!r}")
        if self.segment_bytes < 1024:
            raise ValueError("segment_bytes must be at least 1024")
        if self.max_record_bytes < 64:
            raise ValueError("max_record_bytes must be at least 64")
        for name in ("flush_interval_ms", "checkpoint_interval_ms", "checkpoint_bytes",
                     "dedup_window", "dedup_max_sns", "max_batch_bytes",
                     "max_pending_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.dedup_window > 65535:
            raise ValueError("dedup_window must be at most 65535")
        for name in ("min_free_bytes", "preallocate_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in OPTIONAL_LIMITS:
            value = getattr(self, name)
            if value is not None and value <= 0 and value != FOREVER:
                raise ValueError(f"{name} must be positive, or -1 for no limit (forever), "
                                 f"not {value}")
        if self.max_batch_bytes < self.record_limit:
            raise ValueError("max_batch_bytes must be >= max_record_bytes")

    def limit(self, name: str) -> int | None:
        """The limit ``name`` (``retention_ms``, ``retention_bytes``, ``segment_ms``),
        None when there is none (-1 or None)."""
        value = getattr(self, name)
        return None if value is None or value == FOREVER else value

    @property
    def record_limit(self) -> int:
        """The effective largest record: ``min(max_record_bytes, segment_bytes)``."""
        return min(self.max_record_bytes, self.segment_bytes)
