"""The lane: a lock's steady publish reads and their acks, below Python (issue #14).

At one record per read, a read entering Python (uvloop's callback, the read's bytes,
the GIL, the connection's and the publish path's calls) cost the broker about as
much as the kernel's work for it. So a connection in its steady state is handed to
the compiled lane (``lockmq._core.Lane``): its transport stops reading and its
socket joins the lane's epoll set, which the loop watches as one fd. When that fd is
readable, one :meth:`Lane._ready` reads every ready socket in compiled code, stores the records
of all of them with one :meth:`PublishPath.submit`, and one ``answer`` call sends
every ack of the group commit. Python runs per loop iteration, not per read.

Who joins (:meth:`Connection._lane_join` decides, after its Python path answered a
publish read and holds nothing): a plain-TCP connection past its handshake,
publishing under its own producer id to topics its Python path allowed, with nothing
unsent or unanswered. A session with frame MACs (the firmware's default on plain TCP)
hands over its key's pads and both tag counters: the lane checks each PUBLISH's tag
and seals each ack, and gives the counters back with the socket, so the session's
own path goes on from the next frame. Its acks for a socket that has left are
Python's to seal and write. It leaves (:meth:`Lane.leave`) before Python
writes to its socket or closes it, and the lane gives it back by itself ("bails")
at the first bytes it does not take -- another opcode, a bad or ONEWAY frame, a bad tag,
a topic not allowed yet, the lock's rate credit used up, EOF -- handing over the
unread bytes, which the Python path then reads as it always did (errors included).

Who reads the lane: the event loop alone, so a socket has one owner besides its
connection at a time, uvloop's transport or the lane, handed over by join, leave and
bail. The loop watches the lane's fd while the store has none of its records; a poll
that finds records hands them to the store at once and stops watching (what arrives
during the group commit stays in the kernel, and the loop is not woken by it). When the
commit's answer comes, the loop polls again before it sends that commit's acks: what
arrived during the fsync goes into the next commit in one poll, and the loop yields the
core (``os.sched_yield``, the GIL free) so that the writer starts that commit while the
loop writes the acks. The sockets that poll gave up go back to their connections
before those acks are sent (a sealed session's counters come back with its socket, and
the acks of a socket that left are its connection's to seal); a refusal the store makes
on the spot goes out after them. A poll that finds nothing, or a refusal (busy, closing),
has the loop watch the fd again; so does a commit that has not answered after
``COMMIT_WAIT_S`` (a stalled disk, held writes), so heartbeats are still answered and a
full queue still answers BUSY. One reader: a lock's records reach the store in the
order of its byte stream, and a socket taken out of the lane has nothing of it in
flight between readers.

A lock's message rate: on joining, the connection takes a credit of records from
the lock's budget (``Guard.publish_quota``); the lane spends it, bails when it is
used up, and what is left goes back to the budget on leaving. Without the compiled
extension there is no lane and every read takes the Python path.
"""

from __future__ import annotations

import asyncio
import os
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from lockmq import accel
from lockmq.store import NewRecord

from .logs import Stats
from .publish import PublishPath

if TYPE_CHECKING:   # (connection.py imports this module)
    from .intake import PublishIntake as Connection   # (the part of it the lane calls)
    from .peer import Connections

#: the compiled lane (lockmq._core.Lane), or None (pure Python)
LANE_TYPE: Any = accel.speedups.Lane if accel.COMPILED else None
#: records the lane reads in one poll at most (the rest stay ready for the next)
POLL_RECORDS = 4096
#: a commit of the lane's records not answered after this long: the loop watches again
COMMIT_WAIT_S = 0.2


class Lane:
    """The broker's compiled lane (see the module docstring); one per broker."""

    def __init__(self, publisher: PublishPath, connections: "Connections", stats: Stats,
                 max_frame: int) -> None:
        self.publisher = publisher
        self.connections = connections
        self.stats = stats
        self._lane = LANE_TYPE(NewRecord, max_frame)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: records read and answered
        self._read = 0
        self._answered = 0
        #: the loop watches the lane's fd
        self._watching = False
        #: a poll's records are in the store: the loop reads the lane when their answer
        #: comes (or after COMMIT_WAIT_S), not when its fd is readable
        self._held = False
        self._held_at = 0.0
        self._stall_check: asyncio.TimerHandle | None = None
        #: a submit runs now (an answer during it is a refusal made on the spot, kept
        #: here as (plan, results) until the poll's sockets are given back)
        self._submitting = False
        self._refused_now: tuple[Any, list] | None = None

    @staticmethod
    def available() -> bool:
        """Is the compiled lane built (and not switched off by LOCKMQ_PURE_PYTHON)?"""
        return LANE_TYPE is not None

    @property
    def in_flight(self) -> int:
        """Records read by the lane and not answered yet (the broker's shutdown waits)."""
        return self._read - self._answered

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the lane's epoll fd on ``loop``."""
        self._loop = loop
        self._watch()

    def stop(self) -> None:
        """Give every socket back to its connection and stop watching."""
        self.leave_all()
        self._held = False
        if self._stall_check is not None:
            self._stall_check.cancel()
            self._stall_check = None
        if self._watching and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._lane.fileno())
        self._watching = False
        self._loop = None

    def _watch(self) -> None:
        """The loop reads the lane when its fd is readable."""
        if self._loop is not None and not self._watching:
            self._loop.add_reader(self._lane.fileno(), self._ready)
            self._watching = True

    @property
    def adopted(self) -> int:
        """How many connections are in the lane now."""
        return self._lane.adopted()

    def join(self, conn: "Connection", fd: int, sn: str, topics: set[str], credit: int,
             limit: int, sealed: tuple[bytes, int, int] | None = None) -> bool:
        """Read ``conn``'s socket ``fd`` in the lane from now on; False if it cannot.
        ``sealed``: a session with frame MACs, its key's ``mac_pads`` and its rx and tx
        counters, which the lane keeps until it gives the socket back."""
        if self._loop is None:
            return False
        try:
            self._lane.adopt(fd, conn, sn, topics, credit, limit, *(sealed or ()))
        except (OSError, ValueError):   # (a socket closed under it; an SN too long)
            return False
        self.stats.c["lane_joins"] += 1
        return True

    def leave(self, fd: int) -> tuple[bytes, int, tuple[int, int]] | None:
        """Take ``fd`` out of the lane: (its held partial frame, its credit left, a
        sealed session's (rx, tx) counters now), or None if it was not in the lane."""
        back = self._lane.release(fd)
        return None if back is None else (back[1], back[2], (back[3], back[4]))

    def leave_all(self) -> None:
        """Every connection leaves (the broker is closing)."""
        for conn in list(self.connections.by_id.values()):
            if conn._lane_fd >= 0:
                conn._lane_leave()

    def _ready(self) -> None:
        """The loop's callback (the lane's fd is readable): every ready socket read."""
        refused = self._read_now()
        if refused is not None:
            self._send(*refused)

    def _read_now(self) -> tuple[Any, list] | None:
        """One poll: its records to the store, and the lane held until they are
        answered (or watched again). The sockets the poll gave up go back to their
        connections once its records are queued (their next records come after these)
        and before any answer is sealed for them (a sealed session's counters come back
        with the socket). Returns a refusal the store made on the spot, as (plan,
        results), for the caller to send after the answers it is sending itself."""
        records, plan, bails, nbytes, frames = self._lane.poll(POLL_RECORDS)
        if not records:
            self._held = False
            self._watch()
            self._give_back(bails)
            return None
        c = self.stats.c
        c["bytes_in"] += nbytes
        c["frames_in"] += frames
        c["publish_received"] += frames
        self._read += len(records)
        self._submitting, self._refused_now = True, None
        try:
            self.publisher.submit_now(records, partial(self._answer, plan))
        finally:
            self._submitting = False
        refused, self._refused_now = self._refused_now, None
        if refused is not None:   # the next readable fd reads again
            self._held = False
            self._watch()
        else:
            self._hold()
        self._give_back(bails)
        return refused

    def _hold(self) -> None:
        """Stop watching until the store answers this poll's records."""
        loop = self._loop
        assert loop is not None
        self._held = True
        self._held_at = time.monotonic()
        if self._watching:
            loop.remove_reader(self._lane.fileno())
            self._watching = False
        if self._stall_check is None:
            self._stall_check = loop.call_later(COMMIT_WAIT_S, self._check_stall)

    def _check_stall(self) -> None:
        """While the lane is held: watch it again if the commit has not answered."""
        self._stall_check = None
        loop = self._loop
        if loop is None or not self._held:
            return
        wait = COMMIT_WAIT_S - (time.monotonic() - self._held_at)
        if wait > 0:
            self._stall_check = loop.call_later(wait, self._check_stall)
            return
        self._held = False
        self.stats.c["lane_commit_stalls"] += 1
        self._watch()

    def _give_back(self, bails: list) -> None:
        """Each socket the lane gave up, to its connection's Python path with the
        bytes it must read first and the rate credit left."""
        c = self.stats.c
        for conn, data, credit, rx, tx in bails:
            c["lane_bails"] += 1
            conn._lane_left(data, credit, counters=(rx, tx))

    def _answer(self, plan: Any, results: list) -> None:
        """The store's results for one poll. The answer the held lane waits for reads
        it first (see the module docstring), then its acks go out."""
        if self._submitting:   # refused on the spot: _read_now's caller sends it
            self._refused_now = (plan, results)
            return
        refused = None
        if self._held:
            self._held = False
            self.stats.c["lane_commit_reads"] += 1
            refused = self._read_now()
            if self._held:
                # the writer has the next commit's records: on a shared core it would
                # wait for the loop to sleep (SCHED_BATCH), so its fdatasync would not
                # overlap the acks below; a yield, the GIL free, lets it start now
                os.sched_yield()
        self._send(plan, results)
        if refused is not None:   # (after this commit's acks: a lock's answers in order)
            self._send(*refused)

    def _send(self, plan: Any, results: list) -> None:
        """One poll's results: acks sent, the rest to the connections."""
        self._answered += len(results)
        stored, dup, frames, nbytes, leftovers = self._lane.answer(plan, results)
        c = self.stats.c
        c["publish_stored"] += stored
        c["publish_duplicates"] += dup
        c["frames_out"] += frames
        c["bytes_out"] += nbytes
        for left in leftovers:
            conn = left[1]
            if left[0] == 1:     # a refusal, or sealed acks of a socket that left: Python's
                conn._lane_refused(left[2], left[3])
            elif left[0] == 2:   # the socket left the lane: Python writes the acks
                conn._send_acks(left[2], 0)
            else:                # the socket did not take them whole: it is Python's
                c["lane_bails"] += 1
                conn._lane_left(left[3], left[4], unsent=left[2], counters=(left[5], left[6]))
