"""Scheduled publishes and commands: records in the log, one timer, delivered once.

A PUBLISH_AT or COMMAND_AT is stored like any publish (group commit, fsync, then
the answer) as a record of the internal topic ``$scheduled``; its queue offset there
is the *schedule id*. The broker keeps every waiting item in memory (a dict and a
heap of due times, capped per principal, in count and in bytes) and rebuilds both
from ``$scheduled`` on start. One task sleeps until the earliest due time (at most
``max_sleep_ms``, so a test's ManualClock is seen too) and then:

* publishes: writes a batch of due items to their real topics under the system id
  ``$scheduled`` / seq = schedule id, with the header ``scheduled_id``; then appends
  one ``done`` op record naming the ids (and, per topic, the last queue offset
  written). A crash between the two leaves items written but not marked: on start,
  each due item's topic is scanned from a bound (its queue end when it was
  scheduled, and past the last marked offset) for its ``scheduled_id``, and those
  found are only marked -- so an item is written once;
* commands: hands the command to the command path (``Commands.submit``) and then
  marks it done: at least once.

Rights are checked twice, by the one ``Admission``: when an item is scheduled, and
again when it takes effect, against its principal's token as it is *then* (the ``tok``
header): an item whose token was revoked or expired meanwhile is not delivered but
cancelled (``done`` with ``why = revoked``), logged ``scheduled_cancelled`` and shown
by ``scheduled.list`` (``recent_cancelled``). A revocation seen by the admission's
watcher cancels its principal's waiting items at once.

Cancel (SCHEDULE_CANCEL or the admin op ``scheduled.cancel``) appends a ``done``
op with ``why = cancelled``. Records of ``$scheduled``:

=========  ======================================================================
``pub``    producer's (sn, seq), payload; headers ``t, at, topic, owner, q0, tok``
``cmd``    ``$scheduled`` id; payload = COMMAND body; headers ``t, at, owner, by,
           admin, tok``
``done``   ``$scheduled`` id; headers ``t, why, ids, q`` (topic -> last offset)
=========  ======================================================================
"""

from __future__ import annotations

import asyncio
import heapq
from typing import Any, Callable

from lockmq.clock import steady_ms_of
from lockmq.config import ScheduledSection
from lockmq.protocol import Command, CommandResult, ErrorCode, Flag, Op, PublishAck
from lockmq.protocol.schedule import CommandAt, CommandScheduled, PublishAt, ScheduleCancel
from lockmq.security import BrokerGuard, Principal, SecurityError
from lockmq.security.principal import ADMIN, SERVICE
from lockmq.store import InvalidRecord, NewRecord, StoreBusy, validate_topic

from .admission import Admission
from .commands import Commands, DetachedSender
from .core import MAX_SEQ, BrokerCore, SystemSeq
from .logs import EventLog, Stats
from .peer import Handler, Peer
from .periodic import stop_task
from .publish import PublishPath, PublishRefused


#: the internal topic of scheduled items and their op records
TOPIC = "$scheduled"
#: the producer id of the broker's own records here and of delivered messages
SCHED_SN = "$scheduled"
#: results of scheduled commands kept for ``scheduled.list`` and ``scheduled.result``
#: (bounded: the oldest is forgotten)
RECENT_RESULTS = 200
#: scheduled commands in the command path whose answer is not in yet, remembered for
#: ``scheduled.result`` (bounded: the oldest is forgotten -- the command path expires
#: each command and answers it, so this only guards against one it never answers)
MAX_SENT = 10_000
#: items shown by ``scheduled.list`` at most
MAX_LIST = 1000


class Item:
    """One waiting scheduled publish (``kind`` "pub") or command ("cmd")."""

    __slots__ = ("id", "at_ms", "kind", "topic", "sn", "seq", "lock_ts_ms", "payload",
                 "owner", "by", "admin", "q0", "busy", "stored_ms", "tok", "not_before")

    def __init__(self, id: int, at_ms: int, kind: str, topic: str, sn: str, seq: int,
                 lock_ts_ms: int, payload: bytes, owner: str, by: str = "",
                 admin: bool = False, q0: int = 0, tok: str = "") -> None:
        self.id = id
        self.at_ms = at_ms
        self.kind = kind
        self.topic = topic          # real topic (pub) or the lock's SN (cmd)
        self.sn = sn
        self.seq = seq
        self.lock_ts_ms = lock_ts_ms
        self.payload = payload      # message payload (pub) or COMMAND body (cmd)
        self.owner = owner          # the cap key: token name or lock SN
        self.by = by                # principal name (commands: whose command)
        self.admin = admin
        self.q0 = q0                # the topic's queue end when scheduled (dedup bound)
        self.busy = False           # being delivered: no longer cancellable
        self.stored_ms = 0.0        # when its newest record was written (refresh)
        self.tok = tok              # the token id it was scheduled with ("" before 0.4)
        self.not_before = 0.0       # steady time before which it never fires (0: at_ms)

    def principal(self) -> Principal:
        """Who scheduled it, as far as the item knows (for matching a revocation)."""
        return Principal(name=self.by or self.owner, kind=ADMIN if self.admin else SERVICE,
                         token_id=self.tok, token_name=self.owner)

    def view(self) -> dict[str, Any]:
        """The admin view of the item."""
        return {"id": self.id, "kind": "publish" if self.kind == "pub" else "command",
                ("topic" if self.kind == "pub" else "target"): self.topic,
                "at_ms": self.at_ms, "owner": self.owner, "bytes": len(self.payload)}


def _remember(table: dict[int, Any], key: int, value: Any, cap: int) -> None:
    """Put ``key`` last in insertion-ordered ``table``; forget the oldest over ``cap``."""
    table.pop(key, None)
    table[key] = value
    if len(table) > cap:
        del table[next(iter(table))]


def owner_of(principal: Any) -> str:
    """The cap key of a principal: its token's name, else its own name."""
    return getattr(principal, "token_name", "") or getattr(principal, "name", "?")


class ScheduledSender(DetachedSender):
    """The sender of a scheduled command when it enters the command path (the service
    that scheduled it may be long gone): the outcome goes to ``done(item, status,
    detail)``, a refusal as the negated error code."""

    def __init__(self, item: Item, principal: Any, done: Callable[[Item, int, str], None]) -> None:
        super().__init__(principal)
        self.item = item
        self._done = done

    def result(self, res: CommandResult) -> None:
        self._done(self.item, res.status, res.detail)

    def failed(self, code: int, message: str) -> None:
        self._done(self.item, -code, message)


class Scheduler:
    """Scheduled items: submit, hold, deliver on time, cancel (module docstring)."""

    def __init__(self, cfg: ScheduledSection, core: BrokerCore, publisher: PublishPath,
                 commands: Commands, guard: BrokerGuard, stats: Stats, log: EventLog,
                 closing: Callable[[], bool], admission: Admission | None = None) -> None:
        self.cfg = cfg
        self.core = core
        self.clock = core.clock
        self.publisher = publisher
        self.commands = commands
        self.guard = guard
        #: the one rights decision (the command path's, so both see one revocation book)
        self.admission = admission or commands.admission
        self.admission.on_revoked(self.cancel_principal)
        #: items cancelled because their principal was revoked (``scheduled.list``)
        self.cancelled: dict[int, dict[str, Any]] = {}
        self.stats = stats
        self.log = log
        self.closing = closing
        self.items: dict[int, Item] = {}
        #: (producer id, seq) -> schedule id of each waiting publish: a retransmitted
        #: PUBLISH_AT is answered with its id (bounded by the items' caps)
        self.pub_ids: dict[tuple[str, int], int] = {}
        self._heap: list[tuple[int, int]] = []          # (at_ms, id); stale ids skipped
        self.by_owner: dict[str, int] = {}              # waiting + being stored
        self.bytes_by_owner: dict[str, int] = {}        # ... their payload bytes
        self.held = 0
        self.held_bytes = 0
        self.last_q: dict[str, int] = {}                # topic -> last offset marked
        #: schedule id -> its command's result, oldest first (RECENT_RESULTS at most)
        self.recent: dict[int, dict[str, Any]] = {}
        #: schedule id -> due time of each command in the command path, not answered yet
        self.sent: dict[int, int] = {}
        self._seq = SystemSeq()   # of SCHED_SN (resumed from the store at start)
        #: the clock's time at the timer's last look (tests wait for it to pass a time)
        self.looked_at_ms = 0.0
        #: ``wall - steady`` at start: an item due at ``at_ms`` (wall) also waits for
        #: steady time ``at_ms - offset``, so a forward step of the wall clock fires
        #: nothing early (a backward one makes it late: it is tied to the wall clock)
        self._offset0 = self.clock.wall_ms() - steady_ms_of(self.clock)
        self._refreshed_at = 0.0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[Any] | None = None

    # -- life cycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Rebuild the waiting items from ``$scheduled``, settle the ones a crash left
        written but unmarked, and start the timer task."""
        self._wake = asyncio.Event()
        self._rebuild()
        await self._settle_in_doubt()
        self._task = asyncio.ensure_future(self._run())
        self.log("scheduled_started", waiting=len(self.items), bytes=self.held_bytes)

    async def stop(self) -> None:
        """Stop the timer (an item cut mid-write is settled at the next start)."""
        await stop_task(self._task, self.log)
        self._task = None

    def _rebuild(self) -> None:
        store = self.core.store
        assert store is not None
        self._seq = SystemSeq.after_last(store, SCHED_SN)
        for r in store.scan(TOPIC):
            self._replay(r)
        for it in self.items.values():
            self._count_in(it.owner, len(it.payload))
        self._heap = [(it.at_ms, it.id) for it in self.items.values()]
        heapq.heapify(self._heap)

    def _replay(self, r: Any) -> None:
        h = r.headers or {}
        t = h.get("t")
        # a refreshed record (see _refresh) carries its first id and producer id
        sid = int(h.get("id", r.queue_offset))
        try:
            if t == "pub":
                it = Item(sid, int(h["at"]), "pub", str(h["topic"]), str(h.get("sn", r.sn)),
                          int(h.get("seq", r.seq)), r.lock_ts_ms, bytes(r.payload),
                          str(h["owner"]), q0=int(h.get("q0", 0)), tok=str(h.get("tok", "")))
            elif t == "cmd":
                it = Item(sid, int(h["at"]), "cmd", Command.decode(r.payload).target,
                          r.sn, r.seq, 0, bytes(r.payload), str(h["owner"]),
                          str(h.get("by", "")), bool(h.get("admin")), tok=str(h.get("tok", "")))
            if t in ("pub", "cmd"):
                # (steady time, the scale of the refresh; a record dated by a wall
                # clock that was ahead must not hold its refresh back)
                it.stored_ms = min(r.broker_ts_us / 1000, steady_ms_of(self.clock))
                self._hold(it)
            elif t == "done":
                for i in h.get("ids", ()):
                    self._forget(int(i))
                for topic, qo in (h.get("q") or {}).items():
                    self.last_q[topic] = max(self.last_q.get(topic, -1), int(qo))
        except Exception as exc:  # noqa: BLE001 -- a damaged op must not stop the start
            self.log("scheduled_record_skipped", queue_offset=r.queue_offset, error=repr(exc),
                     level="warning")

    async def _settle_in_doubt(self) -> None:
        """Items due before this start may have been written to their topic by the
        last run without being marked (a crash between the two): find them there."""
        now = self.clock.wall_ms()
        due: dict[str, dict[int, Item]] = {}
        for it in self.items.values():
            if it.kind == "pub" and it.at_ms <= now:
                due.setdefault(it.topic, {})[it.id] = it
        store = self.core.store
        assert store is not None
        found: list[Item] = []
        for topic, byid in due.items():
            q = max(min(it.q0 for it in byid.values()), self.last_q.get(topic, -1) + 1,
                    store.queue_start(topic))
            for r in store.scan(topic, q):
                sid = (r.headers or {}).get("scheduled_id") if r.sn == SCHED_SN else None
                if sid is not None and int(sid) in byid:
                    found.append(byid.pop(int(sid)))
                    if not byid:
                        break
        if found:
            await self._mark(found, "delivered", {})
            self.stats.inc("scheduled_dedup", len(found))
            self.log("scheduled_settled", written_before_crash=len(found), level="warning")

    def handlers(self) -> dict[int, Handler]:
        """This feature's part of the connection's dispatch table."""
        return {Op.PUBLISH_AT: self.on_publish_at, Op.COMMAND_AT: self.on_command_at,
                Op.SCHEDULE_CANCEL: self.on_cancel}

    # -- submit ---------------------------------------------------------------------

    def on_publish_at(self, conn: Peer, frame: Any) -> None:
        """A PUBLISH_AT: check rights, horizon and caps, store it, answer PUBLISH_ACK
        with the schedule id."""
        p = PublishAt.decode(frame.body)
        oneway = bool(frame.flags & Flag.ONEWAY)
        principal = conn.principal
        sn = frame.sn or principal.name
        try:
            validate_topic(p.topic)
            if p.topic.startswith("$"):
                raise InvalidRecord("scheduled messages go to client topics, not $ topics")
            self.admission.check_publish(principal, p.topic, n=1)
            conn.check_producer_id(sn)   # (once per connection and id, as for PUBLISH)
        except SecurityError as exc:
            self.stats.inc("scheduled_refused")
            if exc.close or not oneway:
                conn.refused(exc, frame.opaque)
            return
        except InvalidRecord as exc:
            self._refuse(conn, frame, oneway, ErrorCode.INVALID_ARGUMENT, str(exc))
            return
        owner = owner_of(principal)
        if not self._admit(conn, frame, oneway, owner, p.deliver_at_ms, len(p.payload),
                           principal):
            return
        tok = getattr(principal, "token_id", "")
        rec = NewRecord(TOPIC, sn, p.seq, p.lock_ts_ms, p.payload, {
            "t": "pub", "at": p.deliver_at_ms, "topic": p.topic, "owner": owner,
            "q0": self.core.queue_end(p.topic), "tok": tok})

        def stored(results: list[Any]) -> None:
            a = results[0]
            item = None
            if not isinstance(a, Exception) and not a.duplicate:
                item = Item(a.queue_offset, p.deliver_at_ms, "pub", p.topic, sn, p.seq,
                            p.lock_ts_ms, p.payload, owner, q0=rec.headers["q0"], tok=tok)
            self._stored(conn, frame, oneway, owner, len(p.payload), a, item)
            if item is not None and not oneway:
                conn.send_frame(Op.PUBLISH_ACK, PublishAck(PublishAck.STORED, item.id).encode(),
                                frame.opaque, Flag.RESPONSE)
            elif a is not None and not isinstance(a, Exception) and not oneway:
                # a retransmission: its id while it waits (0 once delivered or cancelled)
                sid = self.pub_ids.get((sn, p.seq), 0)
                conn.send_frame(Op.PUBLISH_ACK, PublishAck(PublishAck.DUPLICATE, sid).encode(),
                                frame.opaque, Flag.RESPONSE)

        self.publisher.submit([rec], stored)

    def on_command_at(self, conn: Peer, frame: Any) -> None:
        """A COMMAND_AT: check the command right now, store it, answer
        COMMAND_SCHEDULED; at its time it enters the command path."""
        c = CommandAt.decode(frame.body)
        principal = conn.principal
        try:
            self.admission.check_command(principal, c.target, c.kind, c.args)
        except SecurityError as exc:
            self.stats.inc("scheduled_refused")
            conn.refused(exc, frame.opaque)
            return
        if c.expires_ms and c.expires_ms <= c.not_before_ms:
            self._refuse(conn, frame, False, ErrorCode.INVALID_ARGUMENT,
                         "expires_ms must be after not_before_ms (or 0: the default expiry)")
            return
        owner = owner_of(principal)
        body = Command(c.target, c.cmd_id, c.expires_ms, c.kind, c.args).encode()
        if not self._admit(conn, frame, False, owner, c.not_before_ms, len(body), principal):
            return
        admin = bool(getattr(principal, "is_admin", False))
        tok = getattr(principal, "token_id", "")
        rec = NewRecord(TOPIC, SCHED_SN, self._seq.take(), 0, body, {
            "t": "cmd", "at": c.not_before_ms, "owner": owner, "by": principal.name,
            "admin": admin, "tok": tok})

        def stored(results: list[Any]) -> None:
            a = results[0]
            item = None
            if not isinstance(a, Exception):
                item = Item(a.queue_offset, c.not_before_ms, "cmd", c.target, SCHED_SN, rec.seq,
                            0, body, owner, principal.name, admin, tok=tok)
            self._stored(conn, frame, False, owner, len(body), a, item)
            if item is not None:
                conn.send_frame(Op.COMMAND_SCHEDULED,
                                CommandScheduled(c.target, c.cmd_id, item.id).encode(),
                                frame.opaque, Flag.RESPONSE)

        self.publisher.submit([rec], stored)

    def _admit(self, conn: Peer, frame: Any, oneway: bool, owner: str, at_ms: int,
               size: int, principal: Any = None) -> bool:
        """Horizon and caps -- per principal, and of the broker-wide caps only what is
        not the admins' reserve for anyone else (``Admission.share``); on success the
        item is counted in (until stored or not)."""
        cfg = self.cfg
        if self.closing():
            self._refuse(conn, frame, oneway, ErrorCode.SHUTTING_DOWN,
                         "the broker is shutting down", 1000)
            return False
        if at_ms > self.clock.wall_ms() + cfg.max_horizon_s * 1000:
            self._refuse(conn, frame, oneway, ErrorCode.INVALID_ARGUMENT,
                         f"the delivery time is more than scheduled.max_horizon_s = "
                         f"{cfg.max_horizon_s:g} s ahead")
            return False
        n = self.by_owner.get(owner, 0)
        nb = self.bytes_by_owner.get(owner, 0)
        share = self.admission.share
        admin = bool(getattr(principal, "is_admin", False))
        over = None
        if n + 1 > cfg.max_per_principal:
            over = f"{owner!r} has {n} scheduled items waiting (scheduled.max_per_principal)"
        elif not admin and nb + size > cfg.max_bytes_per_principal:
            over = f"{owner!r} has {nb} bytes of scheduled items waiting " \
                   f"(scheduled.max_bytes_per_principal)"
        elif self.held + 1 > share(cfg.max_total, principal):
            over = f"{self.held} scheduled items are waiting (scheduled.max_total" \
                   f"{'' if admin else ', less the admins reserve'})"
        elif self.held_bytes + size > share(cfg.max_bytes_total, principal):
            over = f"{self.held_bytes} bytes of scheduled items are waiting " \
                   f"(scheduled.max_bytes_total{'' if admin else ', less the admins reserve'})"
        if over is not None:
            self.stats.inc("scheduled_refused_cap")
            self._refuse(conn, frame, oneway, ErrorCode.LIMIT_EXCEEDED,
                         f"too many scheduled items: {over}")
            self.log.limited("scheduled_refused", f"scheduled_cap:{owner}", owner=owner,
                             message=over, level="warning")
            return False
        self._count_in(owner, size)
        return True

    def _stored(self, conn: Peer, frame: Any, oneway: bool, owner: str, size: int,
                a: Any, item: Item | None) -> None:
        """What the store did with a scheduled record: hold the item, or answer why not."""
        if item is None:
            self._count_out(owner, size)
        if isinstance(a, PublishRefused):
            self._refuse(conn, frame, oneway, a.code, a.message, a.retry_after_ms)
        elif isinstance(a, Exception):
            self._refuse(conn, frame, oneway, ErrorCode.INVALID_ARGUMENT, str(a))
        elif item is not None:
            item.stored_ms = steady_ms_of(self.clock)
            item.not_before = item.at_ms - (self.clock.wall_ms() - item.stored_ms)
            self._hold(item)
            heapq.heappush(self._heap, (item.at_ms, item.id))
            self.stats.inc("scheduled_accepted")
            if self._wake is not None and self._heap[0][1] == item.id:
                self._wake.set()      # the new earliest: re-arm the timer

    def _refuse(self, conn: Peer, frame: Any, oneway: bool, code: int, message: str,
                retry_after_ms: int = 0) -> None:
        self.stats.inc("scheduled_refused")
        if not oneway:
            conn.send_error(int(code), message, frame.opaque, retry_after_ms=retry_after_ms)

    def _count_in(self, owner: str, size: int) -> None:
        self.by_owner[owner] = self.by_owner.get(owner, 0) + 1
        self.bytes_by_owner[owner] = self.bytes_by_owner.get(owner, 0) + size
        self.held += 1
        self.held_bytes += size

    def _count_out(self, owner: str, size: int) -> None:
        n = self.by_owner.get(owner, 0) - 1
        if n > 0:
            self.by_owner[owner] = n
            self.bytes_by_owner[owner] = self.bytes_by_owner.get(owner, 0) - size
        else:
            self.by_owner.pop(owner, None)
            self.bytes_by_owner.pop(owner, None)
        self.held -= 1
        self.held_bytes -= size

    # -- cancel ---------------------------------------------------------------------

    def on_cancel(self, conn: Peer, frame: Any) -> None:
        """SCHEDULE_CANCEL: the sender's own item (or any, for an admin) -> OK."""
        sid = ScheduleCancel.decode(frame.body).schedule_id
        p = conn.principal
        why = self._cancellable(sid, owner_of(p), bool(getattr(p, "is_admin", False)))
        if why:
            conn.send_error(int(ErrorCode.INVALID_ARGUMENT), why, frame.opaque)
            return

        async def run() -> None:
            try:
                await self.cancel(sid)
            except Exception as exc:  # noqa: BLE001 -- the store refused the op record
                conn.send_error(int(ErrorCode.BUSY), f"not cancelled: {exc}", frame.opaque,
                                retry_after_ms=100)
                return
            conn.send_frame(Op.OK, b"", frame.opaque, Flag.RESPONSE)

        self.core.spawn(run())

    def _cancellable(self, sid: int, owner: str, admin: bool) -> str:
        """Why ``sid`` cannot be cancelled by ``owner`` ("" when it can)."""
        it = self.items.get(sid)
        if it is None or (not admin and it.owner != owner):
            return f"no waiting scheduled item {sid} of yours (unknown, delivered or cancelled)"
        if it.busy:
            return f"scheduled item {sid} is being delivered now"
        return ""

    async def cancel(self, sid: int) -> None:
        """Cancel waiting item ``sid`` durably (an op record), then forget it."""
        it = self.items[sid]
        it.busy = True
        try:
            await self._mark([it], "cancelled", {})
        except Exception:
            it.busy = False
            raise
        self.stats.inc("scheduled_cancelled")

    # -- delivery -------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                due = self._pop_due()
                if due:
                    await self._deliver(due)
                    continue
                if await self._refresh():
                    continue
                wait_ms = self.cfg.max_sleep_ms
                if self._heap:
                    head = self.items.get(self._heap[0][1])
                    early = 0.0 if head is None else \
                        self._not_before(head) - steady_ms_of(self.clock)
                    wait_ms = min(wait_ms, max(1.0, self._heap[0][0] - self.clock.wall_ms(),
                                               early))
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), wait_ms / 1000.0)
                except asyncio.TimeoutError:
                    pass
            except asyncio.CancelledError:
                raise
            except StoreBusy:
                await asyncio.sleep(0.05)
            except Exception as exc:  # noqa: BLE001 -- keep the timer alive; retry later
                self.log("scheduled_delivery_failed", error=repr(exc), level="error")
                await asyncio.sleep(1.0)

    def _pop_due(self) -> list[Item]:
        now = self.clock.wall_ms()
        self.looked_at_ms = now
        heap, items = self._heap, self.items
        out: list[Item] = []
        steady = steady_ms_of(self.clock)
        while heap and heap[0][0] <= now and len(out) < self.cfg.batch:
            it = items.get(heap[0][1])
            if it is not None and not it.busy and self._not_before(it) > steady:
                break             # the wall clock stepped forward: not its time yet
            _, sid = heapq.heappop(heap)
            it = items.get(sid)
            if it is not None and not it.busy:
                it.busy = True
                out.append(it)
        return out

    def _not_before(self, it: Item) -> float:
        return it.not_before or it.at_ms - self._offset0

    async def _deliver(self, due: list[Item]) -> None:
        # The rights of each item's principal as they are now: a revoked one's items
        # are cancelled here, never delivered.
        refused = [it for it in due if self._refused_now(it)]
        if refused:
            try:
                await self._cancel_items(refused, "revoked")
            except BaseException:
                for it in due:            # nothing written: due again at the next look
                    it.busy = False
                    heapq.heappush(self._heap, (it.at_ms, it.id))
                raise
            due = [it for it in due if it not in refused]
            if not due:
                return
        pubs = [it for it in due if it.kind == "pub"]
        q: dict[str, int] = {}
        try:
            if pubs:
                res = await self.core.append([NewRecord(
                    it.topic, SCHED_SN, it.id & MAX_SEQ, it.lock_ts_ms, it.payload,
                    {"scheduled_id": it.id, "producer": it.sn, "producer_seq": it.seq,
                     "deliver_at_ms": it.at_ms}) for it in pubs])
                for it, a in zip(pubs, res):
                    q[it.topic] = max(q.get(it.topic, -1), a.queue_offset)
        except BaseException:
            for it in due:            # nothing written: due again at the next look
                it.busy = False
                heapq.heappush(self._heap, (it.at_ms, it.id))
            raise
        for it in due:
            if it.kind == "cmd":
                self._submit_command(it)
        # Written: never write again -- retry the mark until it is stored (a crash or
        # shutdown before that is settled at the next start by the topic scan).
        while True:
            try:
                await self._mark(due, "delivered", q)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- StoreBusy and friends
                self.log.limited("scheduled_mark_retry", "scheduled_mark_retry",
                                 error=repr(exc), level="warning")
                await asyncio.sleep(0.1)
        now = self.clock.wall_ms()
        self.stats.inc("scheduled_delivered", len(pubs))
        self.stats.inc("scheduled_commands_due", len(due) - len(pubs))
        # summed lateness: lateness_ms_total / (delivered + commands_due) is the mean
        self.stats.inc("scheduled_lateness_ms", int(sum(max(0.0, now - it.at_ms) for it in due)))

    def _refused_now(self, it: Item) -> bool:
        """Whether ``it``'s principal may no longer do what it scheduled (logged)."""
        principal = self.admission.principal_of(it.tok, it.owner, it.by or it.owner, it.admin)
        try:
            if it.kind == "pub":
                self.admission.check_publish(principal, it.topic, n=1, fresh=True)
            else:
                c = Command.decode(it.payload)
                self.admission.check_command(principal, c.target, c.kind, c.args, fresh=True)
        except SecurityError as exc:
            self.log("scheduled_cancelled", id=it.id, kind=it.kind, target=it.topic,
                     owner=it.owner, why=exc.reason, detail=str(exc), level="warning")
            return True
        return False

    def cancel_principal(self, matches: Callable[[Any], bool], why: str) -> int:
        """The admission's watcher saw ``why`` (a revocation): cancel every waiting item
        of the principals ``matches`` picks. Returns how many (written in the
        background: a ``done`` op with ``why = revoked``)."""
        mine = [it for it in self.items.values() if not it.busy and matches(it.principal())]
        if not mine:
            return 0
        for it in mine:
            it.busy = True
            self.log("scheduled_cancelled", id=it.id, kind=it.kind, target=it.topic,
                     owner=it.owner, why="revoked", detail=why, level="warning")

        async def run() -> None:
            try:
                await self._cancel_items(mine, "revoked")
            except Exception:   # not written: they are refused at their time instead
                for it in mine:
                    it.busy = False
                raise
        asyncio.get_running_loop().create_task(run())
        return len(mine)

    async def _cancel_items(self, items: list[Item], why: str) -> None:
        """Mark ``items`` done (``why``), keep them for ``scheduled.list``."""
        await self._mark(items, why, {})
        for it in items:
            _remember(self.cancelled, it.id, {"id": it.id, "kind": it.kind,
                                              "target": it.topic, "owner": it.owner,
                                              "at_ms": it.at_ms, "why": why}, RECENT_RESULTS)
        self.stats.inc("scheduled_cancelled_revoked", len(items))

    def _submit_command(self, it: Item) -> None:
        c = Command.decode(it.payload)
        # who scheduled it, its rights re-read now: the command path checks them again
        principal = self.admission.principal_of(it.tok, it.owner, it.by, it.admin)
        sender = ScheduledSender(it, principal, self._command_done)
        _remember(self.sent, it.id, it.at_ms, MAX_SENT)
        self.commands.submit(sender, 0, c)   # type: ignore[arg-type]

    def _command_done(self, it: Item, status: int, detail: str) -> None:
        self.sent.pop(it.id, None)
        _remember(self.recent, it.id, {"id": it.id, "target": it.topic, "status": status,
                                       "detail": detail[:200], "at_ms": it.at_ms},
                  RECENT_RESULTS)
        self.stats.inc("scheduled_command_results")
        self.log("scheduled_command_result", id=it.id, target=it.topic, status=status,
                 detail=detail[:200], level="info" if status == 0 else "warning")

    async def _refresh(self) -> bool:
        """Write items stored more than ``refresh_after_s`` ago again (same id), so that
        retention, which deletes the oldest segments first, never takes the record of a
        waiting item (a ``done`` op is always newer than what it marks). True if any.
        Judged on steady time: a step of the wall clock neither holds it back nor
        makes it due (retention ages on steady time too)."""
        now = steady_ms_of(self.clock)
        if now - self._refreshed_at < 1000:
            return False
        self._refreshed_at = now
        limit = now - self.cfg.refresh_after_s * 1000
        old = [it for it in self.items.values() if it.stored_ms < limit and not it.busy]
        old = old[:self.cfg.batch]
        if not old:
            return False
        recs = []
        for it in old:
            h: dict[str, Any] = {"t": it.kind, "at": it.at_ms, "owner": it.owner, "id": it.id,
                                 "tok": it.tok}
            if it.kind == "pub":
                h.update(topic=it.topic, q0=it.q0, sn=it.sn, seq=it.seq)
            else:
                h.update(by=it.by, admin=it.admin)
            recs.append(NewRecord(TOPIC, SCHED_SN, self._seq.take(), it.lock_ts_ms, it.payload, h))
        await self.core.append(recs)
        for it in old:
            it.stored_ms = now
        self.stats.inc("scheduled_refreshed", len(old))
        return True

    async def _mark(self, items: list[Item], why: str, q: dict[str, int]) -> None:
        """Append the ``done`` op record for ``items``, then forget them."""
        rec = NewRecord(TOPIC, SCHED_SN, self._seq.take(), 0, b"",
                        {"t": "done", "why": why, "ids": [it.id for it in items], "q": q})
        await self.core.append([rec])
        for topic, qo in q.items():
            self.last_q[topic] = max(self.last_q.get(topic, -1), qo)
        for it in items:
            if self._forget(it.id) is not None:
                self._count_out(it.owner, len(it.payload))

    def _hold(self, it: Item) -> None:
        """Keep waiting item ``it`` (a publish also under its message id)."""
        self.items[it.id] = it
        if it.kind == "pub":
            self.pub_ids[(it.sn, it.seq)] = it.id

    def _forget(self, sid: int) -> Item | None:
        """Drop waiting item ``sid``; the item, or None if it was not waiting."""
        it = self.items.pop(sid, None)
        if it is not None and it.kind == "pub" and self.pub_ids.get((it.sn, it.seq)) == sid:
            del self.pub_ids[(it.sn, it.seq)]
        return it

    # -- operators ------------------------------------------------------------------

    def list_op(self, args: dict[str, Any]) -> dict[str, Any]:
        """Admin ``scheduled.list`` [owner, limit]: waiting items, earliest first."""
        owner = args.get("owner")
        limit = args.get("limit", 100)
        if not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
            return {"ok": False, "error": "INVALID_ARGUMENT",
                    "message": f"limit must be an integer in [1, {MAX_LIST}]"}
        its = [it for it in self.items.values() if not owner or it.owner == owner]
        shown = heapq.nsmallest(limit, its, key=lambda it: (it.at_ms, it.id))
        return {"ok": True, "waiting": len(self.items), "bytes": self.held_bytes,
                "by_owner": dict(self.by_owner), "items": [it.view() for it in shown],
                "recent_command_results": list(self.recent.values()),
                "recent_cancelled": list(self.cancelled.values())}

    def result_op(self, args: dict[str, Any]) -> dict[str, Any]:
        """Admin ``scheduled.result`` {id}: what became of scheduled item ``id`` --
        ``waiting`` (not due yet), ``sent`` (a command in the command path, the lock
        has not answered), ``done`` (a command's ``result``: status 0 = ok, a lock's
        CommandStatus, or a refusal as the negated error code) or ``unknown`` (never
        scheduled here, a delivered message, a cancelled item, or a result older
        than the last RECENT_RESULTS or from before a restart). What a client polls
        (``lockmq.client.Admin.scheduled_result``): results are not pushed."""
        sid = args.get("id")
        if not isinstance(sid, int) or isinstance(sid, bool) or sid < 0:
            return {"ok": False, "error": "INVALID_ARGUMENT",
                    "message": "id (a schedule id: an integer >= 0) is required"}
        res = self.recent.get(sid)
        if res is not None:
            return {"ok": True, "id": sid, "state": "done", "result": res}
        if sid in self.sent:
            return {"ok": True, "id": sid, "state": "sent", "at_ms": self.sent[sid]}
        it = self.items.get(sid)
        if it is not None:
            return {"ok": True, "id": sid, "state": "waiting", "kind": it.kind,
                    "at_ms": it.at_ms}
        return {"ok": True, "id": sid, "state": "unknown",
                "hint": "not waiting and no result kept: never scheduled on this broker, "
                        "a delivered message, cancelled, or a result older than the last "
                        f"{RECENT_RESULTS} (or from before a restart)"}

    def cancel_op(self, args: dict[str, Any]) -> Any:
        """Admin ``scheduled.cancel`` {id}: cancel any waiting item."""
        sid = args.get("id")
        if not isinstance(sid, int) or isinstance(sid, bool):
            return {"ok": False, "error": "INVALID_ARGUMENT", "message": "id (an integer) is required"}
        why = self._cancellable(sid, "", True)
        if why:
            return {"ok": False, "error": "INVALID_ARGUMENT", "message": why}

        async def run() -> dict[str, Any]:
            await self.cancel(sid)
            return {"ok": True, "cancelled": sid}
        return run()
