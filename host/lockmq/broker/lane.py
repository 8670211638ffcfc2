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

Who reads the lane: the loop, when the store is idle -- its callback polls and hands
the records to the store at once. From then on, the store's writer thread reads it,
each time it is about to take the next group commit (``read_before_commit``): what
arrived during a commit goes into the next one in one poll, and the loop is not woken
by the reads at all (it still sends the acks, while the writer fsyncs). When a poll
there finds nothing, the loop watches the lane again. A poll on the writer thread
does not hand sockets back itself: a socket it gives up stays in the lane, unread,
until the loop takes it (``take_bails``, or ``release`` when Python needs it first),
so a connection is never between the two. What the store refuses to queue from the
writer thread (busy, closing, a topic with no index yet) goes to the loop's publish
path, which answers it, and the loop reads the lane again. A writer that has not read
for ``WRITER_STALL_S`` (a stalled disk, held writes) gives the lane back to the loop
too, so heartbeats are still answered and a full queue still answers BUSY.

One lock, the turn, keeps a lock's records in the order of its byte stream. The writer
holds it from its poll to its append (the check of who reads included); the loop holds
it whenever it takes a socket out of the lane (``answer`` when the socket does not take
its acks whole, ``release``, ``take_bails``). Without it, the loop could take back a
socket whose earlier records the writer has read and not yet queued, and the Python
path would queue the later ones first: their acks would overtake.

A lock's message rate: on joining, the connection takes a credit of records from
the lock's budget (``Guard.publish_quota``); the lane spends it, bails when it is
used up, and what is left goes back to the budget on leaving. Without the compiled
extension there is no lane and every read takes the Python path.
"""

from __future__ import annotations

import asyncio
import threading
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
#: a store writer that has not read the lane for this long gives it back to the loop
WRITER_STALL_S = 0.2


class Lane:
    """The broker's compiled lane (see the module docstring); one per broker."""

    def __init__(self, publisher: PublishPath, connections: "Connections", stats: Stats,
                 max_frame: int) -> None:
        self.publisher = publisher
        self.connections = connections
        self.stats = stats
        self._lane = LANE_TYPE(NewRecord, max_frame)
        self._loop: asyncio.AbstractEventLoop | None = None
        # records read, by the thread that reads them, and answered (each counter is
        # written by one thread only)
        self._read_on_loop = 0
        self._read_on_writer = 0
        self._answered = 0
        #: the loop watches the lane's fd
        self._watching = False
        #: the store's writer reads the lane before each commit (the loop does not)
        self._writer_reads = False
        #: the store runs _read_before_commit on its writer thread
        self._writer_source = False
        #: held by the thread whose turn it is to read or take a socket back (see the
        #: module docstring; re-entrant: a refused submit answers on the spot)
        self._turn = threading.RLock()
        #: when the writer last read (monotonic), and the loop's check of it
        self._writer_read_at = 0.0
        self._stall_check: asyncio.TimerHandle | None = None

    @staticmethod
    def available() -> bool:
        """Is the compiled lane built (and not switched off by LOCKMQ_PURE_PYTHON)?"""
        return LANE_TYPE is not None

    @property
    def in_flight(self) -> int:
        """Records read by the lane and not answered yet (the broker's shutdown waits)."""
        return self._read_on_loop + self._read_on_writer - self._answered

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the lane's epoll fd on ``loop``; the store's writer reads it too."""
        self._loop = loop
        self._writer_source = self.publisher.sink.read_before_commit(self._read_before_commit)
        self._watch()

    def stop(self) -> None:
        """Give every socket back to its connection and stop watching."""
        self.leave_all()
        if self._writer_source:
            self.publisher.sink.read_before_commit(None)
            self._writer_source = False
        with self._turn:   # (after a read the writer may be making now)
            self._writer_reads = False
        if self._stall_check is not None:
            self._stall_check.cancel()
            self._stall_check = None
        if self._watching and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._lane.fileno())
        self._watching = False
        self._loop = None

    def _watch(self) -> None:
        """The loop reads the lane (from the writer thread: the lane went quiet)."""
        if self._loop is not None and not self._watching and not self._writer_reads:
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
        with self._turn:
            back = self._lane.release(fd)
        return None if back is None else (back[1], back[2], (back[3], back[4]))

    def leave_all(self) -> None:
        """Every connection leaves (the broker is closing)."""
        for conn in list(self.connections.by_id.values()):
            if conn._lane_fd >= 0:
                conn._lane_leave()

    def _ready(self) -> None:
        """The loop's callback: every ready socket read, its records stored; the
        store's writer reads the lane from then on."""
        with self._turn:
            if self._writer_reads:   # (a callback already queued when the writer took over)
                return
            records, plan, bails, nbytes, frames = self._lane.poll(POLL_RECORDS)
            if records:
                self._count_read(nbytes, frames)
                self._read_on_loop += len(records)
                self.publisher.submit_now(records, partial(self._answer, plan))
                if self._writer_source:   # (False only once the lane has stopped)
                    self._to_writer()
        self._give_back(bails)

    def _to_writer(self) -> None:
        """The store's writer reads the lane from now on (the loop holds the turn)."""
        loop = self._loop
        assert loop is not None
        self._writer_reads = True
        self._writer_read_at = time.monotonic()
        loop.remove_reader(self._lane.fileno())
        self._watching = False
        if self._stall_check is None:
            self._stall_check = loop.call_later(WRITER_STALL_S, self._check_writer)
        # (if the store took nothing, the writer waits for work: it reads now)
        self.publisher.sink.source_ready()

    def _check_writer(self) -> None:
        """While the writer reads the lane: give it back to the loop if it stalled."""
        self._stall_check = None
        loop = self._loop
        if loop is None or not self._writer_reads:
            return
        if time.monotonic() - self._writer_read_at < WRITER_STALL_S:
            self._stall_check = loop.call_later(WRITER_STALL_S, self._check_writer)
            return
        with self._turn:
            if not self._writer_reads:
                return
            self._writer_reads = False
        self.stats.c["lane_writer_stalls"] += 1
        self._watch()

    def _count_read(self, nbytes: int, frames: int) -> None:
        c = self.stats.c
        c["bytes_in"] += nbytes
        c["frames_in"] += frames
        c["publish_received"] += frames

    def _read_before_commit(self) -> None:
        """On the store's writer thread, before it takes its next group commit: every
        ready socket read, its records appended (see the module docstring)."""
        if not self._writer_reads:
            return
        loop = self._loop
        assert loop is not None
        with self._turn:
            if not self._writer_reads:
                return
            self._writer_read_at = time.monotonic()
            records, plan, _, nbytes, frames = self._lane.poll(POLL_RECORDS, True)
            bailed = self._lane.bailed() > 0
            if not records:   # quiet: the loop watches again
                self._writer_reads = False
                loop.call_soon_threadsafe(self._watch)
            else:
                self._read_on_writer += len(records)
                try:
                    self.publisher.sink.append_known_then(
                        records, partial(self._answer_read, plan, nbytes, frames,
                                         self._writer_read_at))
                except Exception:  # noqa: BLE001 -- busy, closing, a new topic: the loop's
                    self._read_on_writer -= len(records)
                    self._writer_reads = False
                    loop.call_soon_threadsafe(self._hand_back, records, plan, nbytes, frames)
            # (after what it read is queued, or handed back: a socket given up is read
            # by its Python path from then on, so its next records come after these)
            if bailed:
                loop.call_soon_threadsafe(self._take_bails)

    def _take_bails(self) -> None:
        """The sockets a poll on the writer thread gave up, back to their connections."""
        with self._turn:
            bails = self._lane.take_bails()
        self._give_back(bails)

    def _give_back(self, bails: list) -> None:
        """Each socket the lane gave up, to its connection's Python path with the
        bytes it must read first and the rate credit left."""
        c = self.stats.c
        for conn, data, credit, rx, tx in bails:
            c["lane_bails"] += 1
            conn._lane_left(data, credit, counters=(rx, tx))

    def _hand_back(self, records: list, plan: Any, nbytes: int, frames: int) -> None:
        """What the writer read and the store would not queue there: the publish
        path answers it (refusals included), and the loop reads the lane again."""
        self._count_read(nbytes, frames)
        self._read_on_loop += len(records)
        self.publisher.submit_now(records, partial(self._answer, plan))
        self._watch()

    def _answer_read(self, plan: Any, nbytes: int, frames: int, t0: float,
                     results: list | None, exc: BaseException | None) -> None:
        """The store's answer to a poll of the writer thread at ``t0`` (on the loop)."""
        self.stats.c["lane_writer_reads"] += 1
        if results is not None:
            self.stats.latency.publish_ack.observe(time.monotonic() - t0, len(results))
        self._count_read(nbytes, frames)
        self._answer(plan, results if results is not None
                     else self.publisher.refusals(exc, len(plan)))

    def _answer(self, plan: Any, results: list) -> None:
        """The store's results for one poll: acks sent, the rest to the connections."""
        self._answered += len(results)
        with self._turn:   # (it may give a socket back: see the module docstring)
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
