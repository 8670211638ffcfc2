"""The publish path: every PUBLISH read in one loop iteration, from every connection,
goes to the store in one ``append`` (one group commit), and each producer gets its
answers in one socket write.

A connection hands over the publishes of one read with :meth:`PublishPath.submit`;
the first submit of a loop iteration schedules :meth:`PublishPath._flush` with
``call_soon``, so it runs after every connection readable in this iteration was
read. Errors are per batch (BUSY / STORAGE_FULL: nothing of it was stored) except an
invalid record, which the store refuses alone (the batch is then stored record by
record so the others still succeed).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from lockmq.protocol import ErrorCode, Flag, Op, PublishAck
from lockmq.store import InvalidRecord, NewRecord, StoreBusy, StoreClosed, StoreFull

if TYPE_CHECKING:
    from .connection import Connection
    from .server import Broker

#: (opaque, oneway, record) of one PUBLISH frame
Item = tuple[int, bool, NewRecord]


class PublishPath:
    """Gathers publishes across connections and stores them together."""

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self._groups: list[tuple["Connection", list[Item], int]] = []
        self._count = 0
        self._scheduled = False

    def submit(self, conn: "Connection", items: list[Item], size: int) -> None:
        """Queue ``items`` of ``conn`` (``size`` bytes counted against it) for storing."""
        self._groups.append((conn, items, size))
        self._count += len(items)
        if self._count >= self.broker.config.broker.max_publish_batch:
            self._flush()
        elif not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._groups:
            return
        groups = self._groups
        self._groups = []
        self._count = 0
        asyncio.ensure_future(self._store(groups))

    async def _store(self, groups: list[tuple["Connection", list[Item], int]]) -> None:
        b = self.broker
        store = b.core.store
        assert store is not None
        records = [r for _, items, _ in groups for _, _, r in items]
        b.stats.c["store_batches"] += 1
        try:
            try:
                res: list[Any] = await store.append(records)
            except InvalidRecord:
                # one bad record refuses the whole call: store them one by one
                res = []
                for r in records:
                    try:
                        res.extend(await store.append([r]))
                    except InvalidRecord as exc:
                        res.append(exc)
        except StoreBusy as exc:
            b.stats.c["publish_busy"] += len(records)
            full = isinstance(exc, StoreFull)
            b.log_busy(full, exc)
            self._refuse(groups, int(ErrorCode.STORAGE_FULL if full else ErrorCode.BUSY),
                         "storage full (disk reserve reached), retry later" if full
                         else "busy: the store is behind, retry later",
                         b.config_busy_retry_ms(full))
            return
        except StoreClosed:
            self._refuse(groups, int(ErrorCode.SHUTTING_DOWN), "the broker is shutting down",
                         1000)
            return
        except Exception as exc:  # noqa: BLE001 -- StoreFailed etc.: never ack
            b.log("publish_failed", error=repr(exc), records=len(records), level="error")
            self._refuse(groups, int(ErrorCode.INTERNAL), "storage error", 1000)
            return
        stored = dup = 0
        i = 0
        ack_op = Op.PUBLISH_ACK
        resp = Flag.RESPONSE
        for conn, items, size in groups:
            for opaque, oneway, _r in items:
                a = res[i]
                i += 1
                if isinstance(a, Exception):
                    conn._pub_error(oneway, int(ErrorCode.INVALID_ARGUMENT), str(a), opaque)
                    continue
                if a.duplicate:
                    dup += 1
                else:
                    stored += 1
                if not oneway:
                    conn.send_frame(ack_op, PublishAck(
                        PublishAck.DUPLICATE if a.duplicate else PublishAck.STORED,
                        a.offset if a.offset > 0 else 0).encode(), opaque, resp)
            conn._pub_done(size)
        b.stats.c["publish_stored"] += stored
        b.stats.c["publish_duplicates"] += dup

    def _refuse(self, groups: list[tuple["Connection", list[Item], int]], code: int,
                msg: str, retry_after_ms: int) -> None:
        for conn, items, size in groups:
            for opaque, oneway, _r in items:
                conn._pub_error(oneway, code, msg, opaque, retry_after_ms)
            conn._pub_done(size)
