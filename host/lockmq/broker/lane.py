"""The lane: a lock's steady publish reads and their acks, below Python (issue #14).

At one record per read, a read entering Python (uvloop's callback, the read's bytes,
the GIL, the connection's and the publish path's calls) cost the broker about as
much as the kernel's work for it. So a connection in its steady state is handed to
the compiled lane (``lockmq._speedups.Lane``): its transport stops reading and its
socket joins the lane's epoll set, which the loop watches as one fd. When that fd is
readable, one :meth:`Lane._ready` reads every ready socket in C, stores the records
of all of them with one :meth:`PublishPath.submit`, and one ``answer`` call sends
every ack of the group commit. Python runs per loop iteration, not per read.

Who joins (:meth:`Connection._lane_join` decides, after its Python path answered a
publish read and holds nothing): a plain-TCP connection past its handshake, without
frame MACs, publishing under its own producer id to topics its Python path allowed,
with nothing unsent or unanswered. It leaves (:meth:`Lane.leave`) before Python
writes to its socket or closes it, and the lane gives it back by itself ("bails")
at the first bytes it does not take -- another opcode, a bad, MAC'd or ONEWAY frame,
a topic not allowed yet, the lock's rate credit used up, EOF -- handing over the
unread bytes, which the Python path then reads as it always did (errors included).

A lock's message rate: on joining, the connection takes a credit of records from
the lock's budget (``Guard.publish_quota``); the lane spends it, bails when it is
used up, and what is left goes back to the budget on leaving. Without the compiled
extension there is no lane and every read takes the Python path.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import TYPE_CHECKING, Any

from lockmq import accel
from lockmq.store import NewRecord

from .logs import Stats
from .publish import PublishPath

if TYPE_CHECKING:   # (connection.py imports this module)
    from .connection import Connection, Connections

#: the compiled lane, or None (pure Python, or a _speedups built before it)
LANE_TYPE: Any = getattr(accel.speedups, "Lane", None)
#: records the lane reads in one poll at most (the rest stay ready for the next)
POLL_RECORDS = 4096


class Lane:
    """The broker's compiled lane (see the module docstring); one per broker."""

    def __init__(self, publisher: PublishPath, connections: "Connections", stats: Stats,
                 max_frame: int) -> None:
        self.publisher = publisher
        self.connections = connections
        self.stats = stats
        self._lane = LANE_TYPE(NewRecord, max_frame)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: records read by the lane and not answered yet (the broker's shutdown waits)
        self.in_flight = 0

    @staticmethod
    def available() -> bool:
        """Is the compiled lane built (and not switched off by LOCKMQ_PURE_PYTHON)?"""
        return LANE_TYPE is not None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the lane's epoll fd on ``loop``."""
        self._loop = loop
        loop.add_reader(self._lane.fileno(), self._ready)

    def stop(self) -> None:
        """Give every socket back to its connection and stop watching."""
        self.leave_all()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._lane.fileno())
        self._loop = None

    @property
    def adopted(self) -> int:
        """How many connections are in the lane now."""
        return self._lane.adopted()

    def join(self, conn: "Connection", fd: int, sn: str, topics: set[str], credit: int,
             limit: int) -> bool:
        """Read ``conn``'s socket ``fd`` in the lane from now on; False if it cannot."""
        if self._loop is None:
            return False
        try:
            self._lane.adopt(fd, conn, sn, topics, credit, limit)
        except (OSError, ValueError):   # (a socket closed under it; an SN too long)
            return False
        self.stats.c["lane_joins"] += 1
        return True

    def leave(self, fd: int) -> tuple[bytes, int] | None:
        """Take ``fd`` out of the lane: (its held partial frame, its credit left), or
        None if it was not in the lane."""
        back = self._lane.release(fd)
        return None if back is None else (back[1], back[2])

    def leave_all(self) -> None:
        """Every connection leaves (the broker is closing)."""
        for conn in list(self.connections.by_id.values()):
            if conn._lane_fd >= 0:
                conn._lane_leave()

    def _ready(self) -> None:
        """The loop's callback: every ready socket read, its records stored."""
        records, plan, bails, nbytes, frames = self._lane.poll(POLL_RECORDS)
        c = self.stats.c
        if records:
            c["bytes_in"] += nbytes
            c["frames_in"] += frames
            c["publish_received"] += frames
            self.in_flight += len(records)
            self.publisher.submit(records, partial(self._answer, plan))
        for conn, data, credit in bails:
            c["lane_bails"] += 1
            conn._lane_left(data, credit)

    def _answer(self, plan: Any, results: list) -> None:
        """The store's results for one poll: acks sent, the rest to the connections."""
        self.in_flight -= len(results)
        stored, dup, frames, nbytes, leftovers = self._lane.answer(plan, results)
        c = self.stats.c
        c["publish_stored"] += stored
        c["publish_duplicates"] += dup
        c["frames_out"] += frames
        c["bytes_out"] += nbytes
        for left in leftovers:
            conn = left[1]
            if left[0] == 1:     # a refusal in the group: Python answers it all
                conn._lane_refused(left[2], left[3])
            elif left[0] == 2:   # the socket left the lane: Python writes the acks
                conn._send_acks(left[2], 0)
            else:                # the socket did not take them whole: it is Python's
                c["lane_bails"] += 1
                conn._lane_left(left[3], left[4], unsent=left[2])
