"""lockmq.store: the durable storage engine of the broker.

An append-only commit log in segments (``message.log/``), one index per topic
(``offset-<topic>.log``), consume positions per cluster (``consume-<cluster>.log``),
a dedup table of stored ``(sn, seq)`` ids and a checkpoint. Formats: FORMAT.md;
operator guide: docs/storage.md.

Typical use from the broker's event loop::

    store = Store.open(StoreConfig(data_dir="data"))
    store.on_durable(lambda topic, end: ...)          # wake consumers
    res = await store.append([NewRecord("locks", "SN1", 7, ts, payload)])
    recs = store.read("locks", 0, 100)
    await store.close()
"""

from .config import StoreConfig
from .engine import Store, open_store
from .errors import (CorruptRecord, InvalidRecord, StoreBusy, StoreClosed, StoreError,
                     StoreFailed, StoreFull, StoreLocked)
from .recovery import RecoveryReport
from .retention import RetentionReport
from .records import Appended, NewRecord, StoredRecord, validate_topic

__all__ = [
    "Store", "StoreConfig", "NewRecord", "Appended", "StoredRecord", "RecoveryReport",
    "RetentionReport", "open_store", "validate_topic",
    "StoreError", "StoreBusy", "StoreFull", "StoreClosed", "StoreFailed", "StoreLocked",
    "InvalidRecord", "CorruptRecord",
]
