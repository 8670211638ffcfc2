"""Exceptions raised by the storage engine.

The broker maps :class:`StoreBusy` (and its subclass :class:`StoreFull`) to a
"busy, retry" answer; every other :class:`StoreError` is a server fault.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every storage-engine error."""


class InvalidRecord(StoreError, ValueError):
    """A record handed to :meth:`Store.append` breaks a limit or a naming rule.

    Nothing of the call was stored.
    """


class StoreBusy(StoreError):
    """The store cannot take the records now; the caller may retry later.

    Raised when the queue of not-yet-written records is over
    ``StoreConfig.max_pending_bytes``.
    """


class StoreFull(StoreBusy):
    """The disk reserve (``StoreConfig.min_free_bytes``) is reached or the file
    system reported ENOSPC/EDQUOT. Nothing of the failed batch was stored; the
    log was cut back to where it was before the batch."""


class StoreClosed(StoreError):
    """The store was closed (or never started) and takes no more calls."""


class StoreFailed(StoreError):
    """An I/O error the store cannot prove harmless (for example a failed
    fsync) happened. The store refuses all further writes; restart it so that
    crash recovery decides what is on disk."""


class CorruptRecord(StoreError):
    """A record read back from disk does not match its checksum or framing."""


class StoreLocked(StoreError):
    """Another process holds the data directory open."""
