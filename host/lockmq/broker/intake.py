"""The PUBLISH feature of a connection: its frames checked and queued for the store, the
store's answers acked in order, and the hand-over of a steady lock to the lane.

:class:`PublishIntake` is a part of :class:`~.connection.Connection` (a base class
with the state it owns in its own slots), not an object beside it: this is the hot
path, a read of a storm's locks runs through it, and an attribute reached through
one more object costs on every record. The connection keeps the transport, the
read loop and flow control; this module owns what a publish is -- the topic check,
the one rights decision (``admission.py``), the producer id, the batching, the acks
-- and the calls the lane makes (``_lane_left``, ``_lane_refused``, ``_send_acks``).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from lockmq import accel
from lockmq.protocol import ESTABLISHED, ErrorCode, Flag, Frame, Op
from lockmq.protocol.batch import publish_acks as _py_publish_acks
from lockmq.protocol.batch import publish_fields
from lockmq.protocol.batch import queue_run as _py_queue_run
from lockmq.protocol.batch import sealed_publish_acks as _py_sealed_acks
from lockmq.protocol.compiled import session_pads
from lockmq.security import SecurityError
from lockmq.store import Appended, InvalidRecord, NewRecord, validate_topic

from .peer import Handler
from .publish import PublishRefused, Results

if TYPE_CHECKING:   # (types only: the connection is built from this class)
    from .services import Services

_ONEWAY = Flag.ONEWAY
# The compiled hot path (lockmq.accel): each run of a read's publishes to one topic
# queued for the store in one call, a store answer's acks packed in one; the
# pure-Python twins otherwise
_queue_run = accel.speedups.queue_run if accel.COMPILED else _py_queue_run
_publish_acks = accel.speedups.publish_acks if accel.COMPILED else _py_publish_acks
# ... and a sealed session's acks (None: the session seals each: protocol/batch.py)
_sealed_acks = accel.speedups.sealed_publish_acks if accel.COMPILED else None
#: a connection joins the lane after this many publish answers of its Python path
#: (a storm's lock, one publish and gone, never does: joining costs syscalls)
LANE_AFTER_ANSWERS = 2
#: records of a lock's message rate the lane may spend before it asks again
LANE_CREDIT = 256
#: topics a connection's lane may take at most (a lock publishes to a few)
LANE_TOPICS = 16
#: the ``_limits_logged`` and ``_lane_topics`` of a connection that has none yet
#: (shared, never written: a connection makes its own on first use)
_NONE_LOGGED: frozenset = frozenset()
_NO_TOPICS: set = set()


def _code(name: str) -> int:
    return int(getattr(ErrorCode, name, ErrorCode.INTERNAL))


class PublishIntake:
    """A connection's publishes (see the module docstring)."""

    __slots__ = ("_pub", "_pub_recs", "_pub_size", "_pub_bytes", "_topics_ok",
                 "_producer_ok", "_limits_logged", "_paused_for_pub", "_lane_fd",
                 "_lane_topics", "_answered_reads")

    if TYPE_CHECKING:   # (the connection's: declared there)
        services: Services
        principal: Any
        session: Any
        closed: bool
        id: int
        peer: str

    def _start_intake(self) -> None:
        self._pub: list[tuple[int, bool, NewRecord]] = []
        self._pub_recs: list[NewRecord] = []   # the records of _pub (what the store takes)
        self._pub_size = 0                     # their buffer cost (payload + 64 each)
        self._pub_bytes = 0                    # handed to the store, not answered yet
        self._topics_ok: set[str] = set()   # topic names already validated
        self._producer_ok = ""              # producer id already checked (guard)
        self._limits_logged: set[str] = _NONE_LOGGED   # caps hit: logged once (see _log_once)
        self._paused_for_pub = False        # too much waits for the store: not reading
        self._lane_fd = -1           # the socket's fd while it is in the lane (lane.py)
        self._lane_topics: set[str] = _NO_TOPICS   # topics the lane may take (allowed here)
        self._answered_reads = 0     # publish answers written by the Python path (lane.py)

    def check_producer_id(self, sn: str) -> None:
        """May this session publish under producer id ``sn`` (reserved ids,
        lookalikes, another's id)? Raises the guard's SecurityError; asked once per
        id and session (PUBLISH and PUBLISH_AT both ask here)."""
        if sn != self._producer_ok:
            self.services.guard.check_producer_id(self.principal, sn)
            self._producer_ok = sn

    def _on_publish(self, frame: Any) -> None:
        topic, seq, lock_ts_ms, payload = publish_fields(frame.body)   # Publish.decode's
        self._publish(frame.opaque, frame.flags, frame.sn, topic, seq, lock_ts_ms, payload)

    def _on_publishes(self, pubs: list[tuple]) -> None:
        """PUBLISH frames the compiled scanner took, as :meth:`_publish` arguments.

        The common case -- a run of records to a topic already checked, answers
        wanted, the broker not closing, the session's own SN -- is queued by one call
        (``queue_run``) and checked once (``guard.publish_quota``: the rights, and a
        lock's rate counted for the whole run); anything else, and every record over
        the quota (taken back out of the queue), goes through :meth:`_publish` one by
        one, which refuses each as before. Errors are answered as
        :meth:`data_received` answers a frame's."""
        b = self.services
        principal = self.principal
        inline = not b.connections.closing and principal.name == self._producer_ok
        topics_ok = self._topics_ok
        cap = b.config.broker.max_publish_batch
        done = i = slow = 0
        n = len(pubs)
        while i < n and not self.closed:
            p = pubs[i]
            first = i
            try:
                if inline and i >= slow and p[3] in topics_ok:
                    queue = self._pub
                    i, size = _queue_run(pubs, i, cap - len(queue), NewRecord, queue,
                                         self._pub_recs)
                    if i > first:
                        try:
                            granted = b.guard.publish_quota(principal, p[3], i - first)
                        except Exception:   # (a guard bug: nothing of the run stays)
                            del queue[first - i:]
                            del self._pub_recs[first - i:]
                            i = first
                            raise
                        if granted and b.lane is not None and p[3] not in self._lane_topics:
                            self._lane_allow(p[3])
                        if first + granted < i:   # over the quota: taken back out, and
                            slow = i              # then refused one by one (below)
                            i = first + granted
                            del queue[i - slow:]
                            del self._pub_recs[i - slow:]
                            size -= sum(len(q[6]) + 64 for q in pubs[i:slow])
                        self._pub_size += size
                        done += granted
                        if len(queue) >= cap:
                            self._submit_publishes()   # (the publish path stores it at once)
                        if granted:
                            continue
                # ONEWAY, a new topic or producer id, closing, over the quota
                i = first + 1
                self._publish(*p)
                inline = not b.connections.closing and principal.name == self._producer_ok
            except Exception as exc:  # noqa: BLE001 -- as in data_received
                i = max(i, first + 1)
                if not self._frame_failed(Frame(Op.PUBLISH, p[2], p[1], p[0], b""), exc):
                    break
        b.stats.c["publish_received"] += done

    def _publish(self, opaque: int, flags: int, sn: str, topic: str, seq: int,
                 lock_ts_ms: int, payload: bytes) -> None:
        """One PUBLISH the session allowed: checked (topic, rights, producer id) and
        queued for the store."""
        b = self.services
        oneway = bool(flags & _ONEWAY)
        b.stats.c["publish_received"] += 1
        if oneway:
            b.stats.c["publish_oneway"] += 1
        if topic not in self._topics_ok:
            try:
                validate_topic(topic)
            except InvalidRecord as exc:
                b.stats.inc("publish_refused")
                self._pub_error(oneway, _code("INVALID_ARGUMENT"), str(exc), opaque)
                return
            if len(self._topics_ok) >= 64:
                self._topics_ok.clear()
            self._topics_ok.add(topic)
        try:
            # (the frame's SN was bound to the principal by the session already)
            b.admission.check_publish(self.principal, topic, n=1)
        except SecurityError as exc:
            self._pub_refused(exc, oneway, opaque)
            return
        if b.connections.closing:
            self._pub_error(oneway, _code("SHUTTING_DOWN"), "the broker is shutting down",
                            opaque, 1000)
            return
        sn = sn or self.principal.name
        if sn != self._producer_ok:   # (inline: the common case is one compare)
            try:
                self.check_producer_id(sn)
            except SecurityError as exc:   # FORBIDDEN
                b.stats.inc("producer_ids_refused")
                if self._log_once("producer"):   # (the guard logs each, rate-limited)
                    b.log("producer_id_refused", conn=self.id, peer=self.peer,
                          principal=self.principal.name, producer_id=sn[:80],
                          reason=exc.reason, level="warning")
                self._pub_refused(exc, oneway, opaque)
                return
        rec = NewRecord(topic, sn, seq, lock_ts_ms, payload)
        self._pub.append((opaque, oneway, rec))
        self._pub_recs.append(rec)
        self._pub_size += len(payload) + 64
        if len(self._pub) >= b.config.broker.max_publish_batch:
            self._submit_publishes()   # (the publish path stores it at once)

    def _log_once(self, cap: str) -> bool:
        """True the first time this connection hits ``cap`` (then it is logged)."""
        if cap in self._limits_logged:
            return False
        if self._limits_logged is _NONE_LOGGED:
            self._limits_logged = set()
        self._limits_logged.add(cap)
        return True

    def _pub_refused(self, exc: SecurityError, oneway: bool, opaque: int) -> None:
        """A publish the guard refused: counted; answered unless it was ONEWAY and the
        guard keeps the link (then only counted in ``publish_oneway_refused``)."""
        self.services.stats.inc("publish_refused")
        if exc.close or not oneway:
            self.refused(exc, opaque)
        else:
            self.services.stats.c["publish_oneway_refused"] += 1

    def _pub_error(self, oneway: bool, code: int, msg: str, opaque: int,
                   retry_after_ms: int = 0) -> None:
        """Answer a refused publish -- unless it was ONEWAY (SPEC: never an answer;
        it is counted in ``publish_oneway_refused``)."""
        if oneway:
            self.services.stats.c["publish_oneway_refused"] += 1
        else:
            self.send_error(code, msg, opaque, retry_after_ms=retry_after_ms)

    @property
    def publishes_pending(self) -> bool:
        """Publishes handed to the publish path and not answered yet?"""
        return self._pub_bytes > 0

    def _submit_publishes(self) -> None:
        batch = self._pub
        records = self._pub_recs
        size = self._pub_size
        self._pub = []
        self._pub_recs = []
        self._pub_size = 0
        self._pub_bytes += size
        if self._pub_bytes > self.services.config.broker.max_conn_buffer_bytes:
            self._paused_for_pub = True
            self._update_reading()
        self.services.publisher.submit(records, partial(self._publishes_stored, batch, size))

    def _publishes_stored(self, batch: list[tuple[int, bool, NewRecord]], size: int,
                          results: list[Appended | Exception]) -> None:
        """The publish path's answer for one :meth:`_submit_publishes`: per record, what
        the store did (:class:`Appended`), or why it was not stored (an
        :class:`InvalidRecord` alone, a :class:`PublishRefused` for the batch)."""
        c = self.services.stats.c
        # The acks of a run of stored records are packed in one call (lockmq._core,
        # or protocol/batch.py; with frame MACs on, each sealed by the session there).
        # Answers keep the order of the requests.
        data, frames, stored, dup, i = self._ack_run(batch, results, 0)
        if frames:
            self._send_acks(data, frames)
        if i < len(results):   # a refusal (then the rest, one by one)
            st, dp = self._answer_publishes(batch, results, i)
            stored += st
            dup += dp
        c["publish_stored"] += stored
        c["publish_duplicates"] += dup
        self._pub_bytes -= size
        if self._paused_for_pub and self._pub_bytes <= \
                self.services.config.broker.max_conn_buffer_bytes // 2:
            self._paused_for_pub = False
            self._update_reading()
        if not self._pub_bytes and self._lane_topics:
            self._answered_reads += 1
            if self._answered_reads >= LANE_AFTER_ANSWERS:
                self._lane_join()

    def _ack_run(self, batch: list[tuple[int, bool, NewRecord]],
                 results: list[Appended | Exception], i: int) -> tuple[bytes, int, int, int, int]:
        """The acks of the run of stored records from ``results[i]`` on, in one call:
        ``(bytes, frames, stored, duplicates, next index)`` (sealed when the session has
        frame MACs: each ack takes the session's next counter)."""
        session = self.session
        if session.mac_key is None:
            return _publish_acks(batch, results, i)
        if _sealed_acks is None:
            return _py_sealed_acks(session, batch, results, i)
        got = _sealed_acks(batch, results, i, session_pads(session), session.tx)
        session.tx += got[1]   # (one counter per ack, as sealing each would take)
        return got

    def _answer_publishes(self, batch: list[tuple[int, bool, NewRecord]],
                          results: list[Appended | Exception], i: int) -> tuple[int, int]:
        """:meth:`_publishes_stored` from ``results[i]`` on: each refusal answered
        alone, each run of stored records' acks in one call; returns how many were
        stored and how many were duplicates."""
        stored = dup = 0
        n = len(results)
        while i < n:
            a = results[i]
            if isinstance(a, Exception):
                opaque, oneway, _r = batch[i]
                i += 1
                if isinstance(a, PublishRefused):
                    self._pub_error(oneway, a.code, a.message, opaque, a.retry_after_ms)
                else:
                    self._pub_error(oneway, _code("INVALID_ARGUMENT"), str(a), opaque)
                continue
            data, frames, st, dp, j = self._ack_run(batch, results, i)
            i = j if j > i else i + 1   # (never loops on an answer of no known kind)
            stored += st
            dup += dp
            if frames:
                self._send_acks(data, frames)
        return stored, dup

    def _send_acks(self, data: bytes, frames: int) -> None:
        c = self.services.stats.c
        c["frames_out"] += frames
        if self.closed:
            return
        if self._lane_fd >= 0:   # (an answer of the lane's for a socket it gave back)
            self._lane_leave()
        # the store's answer is all this connection gets now: written at once, not
        # one loop iteration later (after whatever else was queued, in order)
        if self.out:
            self.out.append(data)
            self.flush()
            return
        t = self.transport
        if t is not None and not t.is_closing():   # (flush, without the list)
            c["bytes_out"] += len(data)
            t.write(data)

    # -- the lane (lane.py) -------------------------------------------------------------

    def _lane_allow(self, topic: str) -> None:
        """``topic`` passed the guard's rights here: the lane may take it."""
        if self._lane_topics is _NO_TOPICS:
            self._lane_topics = set()
        if len(self._lane_topics) < LANE_TOPICS:
            self._lane_topics.add(topic)

    def _lane_join(self) -> None:
        """Hand the socket to the lane if this connection is in its steady state: past
        its handshake on plain TCP, its own producer id checked, and
        nothing held -- no bytes in the decoder, no answer unsent or unanswered. A
        session with frame MACs hands its key's pads and tag counters over with it."""
        b = self.services
        t = self.transport
        principal = self.principal
        if (b.lane is None or self._lane_fd >= 0 or self.closed or self.tls or t is None
                or principal is None or self.session.state != ESTABLISHED
                or principal.name != self._producer_ok
                or self.out or self._pub or self._pub_bytes or self.decoder.buffered()
                or self._paused_for_write or self._paused_for_pub or b.connections.closing
                or t.is_closing() or not t.is_reading() or t.get_write_buffer_size()):
            return
        sock = t.get_extra_info("socket")
        if sock is None:
            return
        credit = b.guard.publish_credit(principal, LANE_CREDIT)
        if credit == 0:
            return
        session = self.session
        sealed = None if session.mac_key is None else \
            (session_pads(session), session.rx, session.tx)
        if b.lane.join(self, sock.fileno(), session.name, self._lane_topics, credit,
                       b.config.broker.max_conn_buffer_bytes, sealed):
            self._lane_fd = sock.fileno()
            t.pause_reading()
        elif credit > 0:
            b.guard.return_credit(principal, credit)

    def _lane_leave(self) -> None:
        """Take the socket back from the lane (before Python writes to it or closes it)."""
        back = self.services.lane.leave(self._lane_fd)
        if back is None:
            self._lane_left(b"", 0)
        else:
            self._lane_left(back[0], back[1], counters=back[2])

    def _lane_left(self, data: bytes, credit: int, unsent: bytes = b"",
                   counters: tuple[int, int] | None = None) -> None:
        """The socket is Python's again: ``credit`` goes back to the lock's budget, a
        sealed session takes its tag ``counters`` (rx, tx) back, the transport reads
        again, ``unsent`` acks are written and ``data`` -- the bytes the lane did not
        take, or the partial frame it held -- is read here."""
        self._lane_fd = -1
        session = self.session
        if counters is not None and session.mac_key is not None:
            # the lane counts mod 2**32 (a tag's counter is a u32): what it added since
            # it took the socket, onto the session's own count
            session.rx += (counters[0] - session.rx) & 0xFFFFFFFF
            session.tx += (counters[1] - session.tx) & 0xFFFFFFFF
        b = self.services
        if credit > 0:
            b.guard.return_credit(self.principal, credit)
        self._update_reading()
        if unsent:
            self._send_acks(unsent, 0)
        if data:   # (from flush too: data_received's own flush writes what is queued)
            self.data_received(data)

    def _lane_refused(self, batch: list[tuple[int, bool, None]], results: Results) -> None:
        """A lane answer with a refusal in it, or a sealed session's acks for a socket
        that left the lane: answered here, in order (the socket Python's first, so a
        sealed ack takes the session's counter)."""
        if self._lane_fd >= 0:
            self._lane_leave()
        stored, dup = self._answer_publishes(batch, results, 0)
        c = self.services.stats.c
        c["publish_stored"] += stored
        c["publish_duplicates"] += dup


#: this feature's part of the dispatch table
PUBLISH_HANDLERS: dict[int, Handler] = {Op.PUBLISH: PublishIntake._on_publish}
