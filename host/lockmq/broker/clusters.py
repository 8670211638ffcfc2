"""Consumer clusters: one topic queue, competing members, leases, retries, dead letters.

The paper's consumption model (section 2.1.3): all messages of a topic form one
queue; a *cluster* subscribes to the topic and its members compete for the messages,
joining and leaving at any time -- there are no partitions. Several clusters on one
topic each get every message (each has its own position).

How one cluster reads its topic
-------------------------------
A :class:`Source` is a topic read in queue order. ``committed`` is the first queue
offset not yet finished (everything below it is acked, retried or dead-lettered) and
is what is persisted (``consume-<cluster>.log``); ``next`` is the next offset to read.
Offsets in ``[committed, next)`` are the cluster's *window*: leased, waiting to be
(re)delivered, or finished out of order. A restart restarts from ``committed``, so it
redelivers at most the window, never the backlog.

Each delivery is a :class:`Lease` with a fresh id and a deadline (the visibility
timeout). Ack finishes it; a lease that expires goes back to the front of the ready
queue (and to the dead-letter topic after ``max_retries + 1`` deliveries); when a
member leaves, its leases are released at once.

Retries (RocketMQ's design: one queue per delay level): a nack writes the message to
``$retry.<cluster>.<level>`` (level = index in ``[consumers] retry_levels_s``) with its due time
and retry count in the record headers, then finishes the original. Within one level
due times grow in append order, so the cluster reads each level topic in order as a
:class:`Source`, releasing the head record when it is due and peeking no further:
retries survive a restart, memory holds only a small read-ahead per level, and the
saved retry positions stay close behind. After ``max_retries`` nacks the message goes
to ``$dlq.<cluster>`` with the reason and the delivery count.

Per-lock ordering (``ordered``): two messages of the same lock are never in flight at
once. A message whose lock is busy waits behind it; a nacked message stays in memory
until its retry is due (the committed position does not move past it, so a restart
still redelivers it) and keeps its lock blocked, so the lock's order holds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from typing import Any, Awaitable, Callable, Protocol

from lockmq.config import ConsumersSection
from lockmq.store.records import NewRecord, StoredRecord

RETRY_PREFIX = "$retry."
DLQ_PREFIX = "$dlq."
#: A message read from retry level L is leased as ``RETRY_BIT | L << 56 | its queue
#: offset in $retry.<cluster>.<L>`` so that the wire lease ``(queue_offset, delivery)``
#: is unique within the subscription.
RETRY_BIT = 1 << 63
LEVEL_SHIFT = 56
RETRY_READ_AHEAD = 64
MAX_DELIVERY = 0xFFFF


class ClusterError(Exception):
    """A consumer request the cluster refuses; ``code`` names a protocol ErrorCode."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ClusterHost(Protocol):
    """What a cluster needs from the broker core (implemented in ``core.py``)."""

    def read(self, topic: str, queue_offset: int, max_count: int) -> list[StoredRecord]:
        """Durable records of ``topic`` from ``queue_offset`` on."""

    def queue_end(self, topic: str) -> int:
        """One past the last durable queue offset of ``topic``."""

    def topics(self) -> list[str]:
        """Every topic in the store (a cluster finds its retry topics there)."""

    def append_system(self, records: list[NewRecord]) -> Awaitable[Any]:
        """Store broker-generated records (retry, dead letters); resolves when durable."""

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run a background coroutine owned by the broker."""

    def log(self, event: str, **fields: Any) -> None:
        """Write one structured log line."""

    def wall_ms(self) -> float:
        """Wall time on the broker's clock (lockmq.clock)."""

    def steady_ms(self) -> float:
        """Steady time on the broker's clock (lockmq.clock: never jumps with the wall
        clock): a cluster's last activity (expiry) and retry due times."""

    def damage_at(self, topic: str, queue_offset: int) -> Any:
        """The store's quarantined damage holding that record (None: not damaged):
        a queue offset :meth:`read` passed over was damaged, not deleted."""


class Source:
    """One topic read in queue order by one cluster (see the module docstring)."""

    __slots__ = ("topic", "committed", "next", "done_above", "gaps", "dirty")

    def __init__(self, topic: str, committed: int) -> None:
        self.topic = topic
        self.committed = committed
        self.next = committed
        self.done_above: set[int] = set()
        #: ranges ``lo -> hi`` above ``committed`` that retention deleted (skipped):
        #: finished as a whole, so a skip costs O(1) however many offsets it covers
        self.gaps: dict[int, int] = {}
        self.dirty = False

    def _walk(self, c: int) -> int:
        """The first offset from ``c`` on that is not finished (consumes what it passes)."""
        done, gaps = self.done_above, self.gaps
        while True:
            if c in done:
                done.discard(c)
                c += 1
            elif gaps and c in gaps:
                c = gaps.pop(c)
            else:
                return c

    def finish(self, qoff: int) -> None:
        """Mark ``qoff`` finished and move ``committed`` over finished offsets."""
        if qoff < self.committed:
            return
        if qoff == self.committed:
            self.committed = self._walk(qoff + 1)
            self.dirty = True
        else:
            self.done_above.add(qoff)

    def finish_many(self, qoffs: list[int]) -> None:
        """:meth:`finish` for a batch (an ACK's leases): one set update, then one walk
        of ``committed`` over the finished offsets."""
        if not qoffs:
            return
        c = self.committed
        if min(qoffs) < c:   # already finished (as in :meth:`finish`): ignore those
            qoffs = [q for q in qoffs if q >= c]
        done = self.done_above
        done.update(qoffs)
        if c in done:
            self.committed = self._walk(c)
            self.dirty = True

    def skip_to(self, qoff: int) -> None:
        """The store no longer has offsets below ``qoff`` (retention): skip them."""
        if qoff <= self.next:
            return
        if self.committed == self.next:
            self.committed = qoff
            self.dirty = True
        else:   # the window below ``next`` is still in memory: finish the gap after it
            self.gaps[self.next] = qoff
        self.next = qoff


class Lease:
    """A message of the cluster's window: ready, leased to a member, or held."""

    __slots__ = ("wire", "source", "qoff", "rec", "member", "deadline", "deliveries",
                 "retries")

    def __init__(self, source: Source, qoff: int, rec: StoredRecord, deliveries: int = 0,
                 retries: int = 0, retry_level: int = -1) -> None:
        #: the queue offset shown to the consumer (with RETRY_BIT for retry records)
        self.wire = qoff if retry_level < 0 else RETRY_BIT | retry_level << LEVEL_SHIFT | qoff
        self.source = source
        self.qoff = qoff
        self.rec = rec
        self.member: Member | None = None
        self.deadline = 0.0
        self.deliveries = deliveries
        self.retries = retries


class ParkedPull:
    """A PULL waiting for messages (long poll): answered when work arrives or at the
    timer."""

    __slots__ = ("opaque", "max_messages", "timer")

    def __init__(self, opaque: int, max_messages: int, timer: asyncio.TimerHandle) -> None:
        self.opaque = opaque
        self.max_messages = max_messages
        self.timer = timer


class Member:
    """One subscribed consumer connection in a cluster.

    ``notify(member)`` is how the cluster tells the member's connection that work
    arrived while it was idle (:attr:`wants_notify`, which only the cluster sets)."""

    __slots__ = ("member_id", "name", "peer", "notify", "leases", "wants_notify",
                 "capped", "joined_ms", "delivered", "acked", "nacked", "max_inflight",
                 "lease_ms", "parked")

    def __init__(self, member_id: int, name: str, peer: str,
                 notify: Callable[["Member"], None], max_inflight: int = 0,
                 lease_ms: int = 0) -> None:
        #: the subscription id on the member's connection
        self.member_id = member_id
        #: 0 = the cluster's setting; else min(this, the setting)
        self.max_inflight = max_inflight
        #: 0 = the cluster's visibility timeout
        self.lease_ms = lease_ms
        #: the member's PULL waiting for messages, if any
        self.parked: ParkedPull | None = None
        self.name = name
        self.peer = peer
        self.notify = notify
        self.leases: set[int] = set()
        self.wants_notify = True
        self.capped = False
        self.joined_ms = int(time.time() * 1000)
        self.delivered = 0
        self.acked = 0
        self.nacked = 0

    def park(self, pull: ParkedPull) -> None:
        """Hold ``pull`` until work arrives (one at a time: see :meth:`unpark`)."""
        self.parked = pull

    def unpark(self) -> ParkedPull | None:
        """Stop holding the parked PULL (its timer cancelled); return it to be answered."""
        pull = self.parked
        if pull is not None:
            self.parked = None
            pull.timer.cancel()
        return pull

    def info(self) -> dict[str, Any]:
        """Admin view of the member."""
        return {"id": self.member_id, "name": self.name, "peer": self.peer,
                "inflight": len(self.leases), "delivered": self.delivered,
                "acked": self.acked, "nacked": self.nacked, "joined_ms": self.joined_ms,
                "idle": self.wants_notify}


class Cluster:
    """A consumer cluster on one topic (see the module docstring)."""

    def __init__(self, name: str, topic: str, ordered: bool, settings: ConsumersSection,
                 host: ClusterHost, positions: dict[str, int], start_latest: bool) -> None:
        self.name = name
        self.topic = topic
        self.ordered = ordered
        self.s = settings
        self.host = host
        self.retry_prefix = f"{RETRY_PREFIX}{name}."
        self.dlq_topic = DLQ_PREFIX + name
        if topic in positions:
            main_pos = positions[topic]
        else:
            main_pos = host.queue_end(topic) if start_latest else 0
        self.main = Source(topic, main_pos)
        self.main.dirty = topic not in positions
        # retry level -> its Source and the records read ahead of it (not yet due)
        self.retry_sources: dict[int, Source] = {}
        self.retry_ahead: dict[int, deque[tuple[float, Lease]]] = {}
        for t in list(host.topics()) + list(positions):
            if t.startswith(self.retry_prefix) and t[len(self.retry_prefix):].isdigit():
                self._retry_source(int(t[len(self.retry_prefix):]), positions.get(t, 0))
        self.members: dict[int, Member] = {}   # keyed by id(member)
        self.leases: dict[int, Lease] = {}
        self.ready: deque[Lease] = deque()
        self.waiting: dict[str, deque[Lease]] = {}   # ordered: sn -> messages behind it
        self.waiting_count = 0
        self.busy_sns: set[str] = set()
        self.delayed: list[tuple[float, int, Lease]] = []   # in-memory retries (monotonic)
        # one entry per PULL: (deadline, tie, wire ids it handed out); a lease
        # expires if it is still leased and its own ``deadline`` has passed
        self.expiry: list[tuple[float, int, list[int]]] = []
        self.pending_writes = 0   # nacks/dead letters being written
        self._tie = itertools.count()
        self._wake_turn = 0   # rotates the order in which wake() notifies members
        self.capped = False
        self.stats = {"delivered": 0, "acked": 0, "nacked": 0, "redelivered": 0,
                      "released": 0, "retried": 0, "dead_lettered": 0,
                      "member_cap_hits": 0, "cluster_cap_hits": 0, "unknown_lease": 0,
                      "skipped": 0, "damaged_skipped": 0}
        #: when a member was last connected or a position last moved (broker clock):
        #: what ``[clusters] offsets_retention_ms`` counts from; saved with positions
        #: steady time (lockmq.clock): what expiry and retry due times are judged on
        self.steady_ms: Callable[[], float] = getattr(host, "steady_ms", host.wall_ms)
        self.last_active_ms = self.steady_ms()
        self.activity_dirty = False

    # -- membership -----------------------------------------------------------------

    def join(self, member: Member) -> None:
        """Add a member; it is notified at once if there is work."""
        self.members[id(member)] = member
        self.touch()
        self.host.log("member_join", cluster=self.name, topic=self.topic,
                      member=member.member_id, name=member.name, peer=member.peer,
                      members=len(self.members))
        self.wake()

    def leave(self, member: Member, reason: str = "left") -> int:
        """Remove a member and release its leases at once; returns how many."""
        self.members.pop(id(member), None)
        self.touch()
        released = 0
        for wire in sorted(member.leases, reverse=True):
            lease = self.leases.pop(wire, None)
            if lease is None:
                continue
            lease.member = None
            self.ready.appendleft(lease)
            released += 1
        member.leases.clear()
        self.stats["released"] += released
        self.host.log("member_leave", cluster=self.name, member=member.member_id,
                      reason=reason, released=released, members=len(self.members))
        if released:
            self.wake()
        return released

    def touch(self) -> None:
        """The cluster is in use now (a member joined, left, acked or nacked)."""
        self.last_active_ms = self.steady_ms()
        self.activity_dirty = True

    def skip_to_start(self, queue_start: Callable[[str], int]) -> int:
        """Retention deleted records this cluster had not read: move every source
        (main topic and retry levels) to ``queue_start(topic)``. Returns how many
        messages were skipped (also counted in ``stats["skipped"]``). Messages already
        read into memory (the window) are still delivered."""
        n = 0
        for src in [self.main, *self.retry_sources.values()]:
            start = queue_start(src.topic)
            if src.next < start:
                n += start - src.next
                src.skip_to(start)
        self.stats["skipped"] += n
        return n

    def counters(self) -> dict[str, int]:
        """What ``consume-<cluster>.log`` keeps besides positions (see lockmq.store.positions)."""
        return {"last_active_ms": int(self.last_active_ms), "skipped": self.stats["skipped"]}

    # -- load -----------------------------------------------------------------------

    @property
    def load(self) -> int:
        """Messages held by the cluster: leased, ready, waiting for their lock, delayed."""
        return (len(self.leases) + len(self.ready) + self.waiting_count + len(self.delayed)
                + self.pending_writes)

    def backlog(self) -> int:
        """Messages of the topic not yet finished by this cluster (lag)."""
        return max(0, self.host.queue_end(self.topic) - self.main.committed)

    def has_work(self) -> bool:
        """True if a pull could return something now."""
        if self.ready:
            return True
        src = self.main
        return (self.load < self.s.max_inflight_per_cluster
                and src.next - src.committed < self.s.max_window
                and src.next < self.host.queue_end(self.topic))

    def available(self) -> int:
        """Messages a pull could get now or soon: ready plus unread (the NOTIFY count)."""
        return len(self.ready) + max(0, self.host.queue_end(self.topic) - self.main.next)

    def settled(self, member: Member) -> None:
        """``member`` acked or nacked: wake idle members if that freed room for them
        (``member`` itself idle at its cap, or the cluster at its cap)."""
        if member.wants_notify or self.capped:
            self.wake()

    def wake(self) -> None:
        """Send NOTIFY to idle members (those whose last pull came back empty).

        The first one notified starts one place further each time: a parked PULL is
        answered at once, so with a trickle of messages a fixed order would hand all
        of them to the same member while the others (a member that just joined) idle.
        """
        if not self.members or not self.has_work():
            return
        ms = list(self.members.values())
        if len(ms) > 1:
            k = self._wake_turn % len(ms)
            self._wake_turn += 1
            ms = ms[k:] + ms[:k]
        for m in ms:
            if m.wants_notify and len(m.leases) < self.member_cap(m):
                m.wants_notify = False
                m.notify(m)

    # -- reading --------------------------------------------------------------------

    def _enqueue(self, lease: Lease) -> None:
        if self.ordered:
            sn = lease.rec.sn
            if sn in self.busy_sns:
                self.waiting.setdefault(sn, deque()).append(lease)
                self.waiting_count += 1
                return
            self.busy_sns.add(sn)
        self.ready.append(lease)

    def _sn_free(self, lease: Lease) -> None:
        if not self.ordered:
            return
        sn = lease.rec.sn
        q = self.waiting.get(sn)
        if q:
            nxt = q.popleft()
            self.waiting_count -= 1
            if not q:
                del self.waiting[sn]
            self.ready.append(nxt)   # the lock stays busy: its next message is up
        else:
            self.busy_sns.discard(sn)

    def _fill(self, want: int) -> None:
        """Read new messages of the topic into the ready queue, up to the cluster cap."""
        src = self.main
        cap = self.s.max_inflight_per_cluster
        end = self.host.queue_end(self.topic)
        while len(self.ready) < want and src.next < end:
            room = cap - self.load
            span = self.s.max_window - (src.next - src.committed)
            if room <= 0 or span <= 0:
                if not self.capped:
                    self.capped = True
                    self.stats["cluster_cap_hits"] += 1
                    self.host.log("cluster_inflight_cap", cluster=self.name,
                                  cap=cap, load=self.load, window=src.next - src.committed,
                                  max_window=self.s.max_window,
                                  reason="in-flight cap" if room <= 0 else
                                  "window: the oldest unfinished message holds the position",
                                  level="warning")
                return
            room = min(room, span)
            n = min(room, max(want - len(self.ready), 1), self.s.max_pull)
            recs = self.host.read(self.topic, src.next, n)
            if not recs:
                # everything up to the end may be damaged: pass it, or stay (retention)
                if not self._pass_damage(src, src.next, end):
                    break
                continue
            first = recs[0].queue_offset
            if (not self.ordered and first == src.next
                    and recs[-1].queue_offset == first + len(recs) - 1):
                # the common case: contiguous, no ordering -- one pass
                self.ready.extend([Lease(src, r.queue_offset, r) for r in recs])
                src.next = first + len(recs)
                continue
            for rec in recs:
                if rec.queue_offset > src.next:
                    self._pass_damage(src, src.next, rec.queue_offset)
                    src.skip_to(rec.queue_offset)
                src.next = rec.queue_offset + 1
                self._enqueue(Lease(src, rec.queue_offset, rec))
        self.capped = False

    def _pass_damage(self, src: Source, lo: int, hi: int) -> bool:
        """The store passed over queue offsets ``[lo, hi)`` of ``src``: if they are
        damaged records (not retention's), skip them -- logged, counted and written
        to the dead-letter topic as a payload-less entry naming them -- so the
        cluster goes on with the next intact record. True if it skipped."""
        damage_at = getattr(self.host, "damage_at", None)
        d = damage_at(src.topic, lo) if damage_at is not None and hi > lo else None
        if d is None:
            return False
        n = hi - lo
        self.stats["damaged_skipped"] += n
        what = d.describe() if hasattr(d, "describe") else str(d)
        self.host.log("cluster_skipped_damaged", cluster=self.name, topic=src.topic,
                      queue_offset=lo, count=n, damage=what, level="error")
        h = {"cluster": self.name, "reason": "damaged record skipped", "damaged": True,
             "orig_topic": src.topic, "orig_queue_offset": lo, "count": n,
             "damage": what, "dead_ms": int(time.time() * 1000)}
        self.host.spawn(self._write_damage_entry(NewRecord(self.dlq_topic, "", 0, 0, b"", h)))
        src.skip_to(hi)
        return True

    async def _write_damage_entry(self, rec: NewRecord) -> None:
        try:
            await self.host.append_system([rec])
        except Exception as exc:  # noqa: BLE001 -- the log line and counter remain
            self.host.log("system_write_failed", cluster=self.name, what="damage entry",
                          error=repr(exc), level="warning")

    def retry_topic(self, level: int) -> str:
        """The retry topic of ``level``: ``$retry.<cluster>.<level>``."""
        return f"{self.retry_prefix}{level}"

    def _retry_source(self, level: int, committed: int = 0) -> Source:
        src = self.retry_sources.get(level)
        if src is None:
            src = self.retry_sources[level] = Source(self.retry_topic(level), committed)
            self.retry_ahead[level] = deque()
        return src

    def _retry_view(self, rec: StoredRecord, level: int, src: Source) -> tuple[float, Lease]:
        h = rec.headers or {}
        view = StoredRecord(
            int(h.get("orig_offset", rec.offset)), int(h.get("orig_queue_offset", -1)),
            str(h.get("orig_topic", self.topic)), str(h.get("orig_sn", rec.sn)),
            int(h.get("orig_seq", rec.seq)), int(h.get("orig_lock_ts_ms", rec.lock_ts_ms)),
            int(h.get("orig_broker_ts_us", rec.broker_ts_us)), h.get("orig_headers"),
            rec.payload)
        lease = Lease(src, rec.queue_offset, view, int(h.get("deliveries", 0)),
                      int(h.get("retries", 0)), retry_level=level)
        return float(h.get("due_ms", 0)), lease

    def _release_retries(self) -> bool:
        """Move due retry records of every level to the ready queue; True if any moved.

        Each level is read in order; reading stops at the first record not yet due
        (a small read-ahead is kept), so memory does not grow with the retry backlog.
        """
        moved = False
        now_wall = self.steady_ms()   # due times are steady (a clock step holds none)
        room = self.s.max_retry_held
        for level, src in self.retry_sources.items():
            ahead = self.retry_ahead[level]
            while True:
                if not ahead:
                    if src.next >= self.host.queue_end(src.topic):
                        break
                    recs = self.host.read(src.topic, src.next, RETRY_READ_AHEAD)
                    if not recs:
                        if self._pass_damage(src, src.next, self.host.queue_end(src.topic)):
                            continue
                        break
                    for rec in recs:
                        if rec.queue_offset > src.next:
                            self._pass_damage(src, src.next, rec.queue_offset)
                            src.skip_to(rec.queue_offset)
                        src.next = rec.queue_offset + 1
                        ahead.append(self._retry_view(rec, level, src))
                if ahead[0][0] > now_wall or len(self.ready) >= room:
                    break
                self._enqueue(ahead.popleft()[1])
                moved = True
        return moved

    def _release_due(self) -> bool:
        """Move due retries (retry topics and in-memory ones) to the ready queue;
        True if any moved."""
        moved = self._release_retries() if self.retry_sources else False
        now = time.monotonic()
        d = self.delayed
        while d and d[0][0] <= now:
            self.ready.append(heapq.heappop(d)[2])   # ordered: its lock is still busy
            moved = True
        return moved

    # -- the consumer's requests ------------------------------------------------------

    def member_cap(self, member: Member) -> int:
        """In-flight cap of ``member`` (its SUBSCRIBE may lower the setting)."""
        cap = self.s.max_inflight_per_member
        return min(cap, member.max_inflight) if member.max_inflight else cap

    def pull(self, member: Member, max_count: int) -> list[Lease]:
        """Lease up to ``max_count`` messages to ``member`` (empty: it will get NOTIFY)."""
        room = self.member_cap(member) - len(member.leases)
        n = min(max_count, self.s.max_pull, room)
        if n <= 0:
            if not member.capped:
                member.capped = True
                self.stats["member_cap_hits"] += 1
                self.host.log("member_inflight_cap", cluster=self.name,
                              member=member.member_id, cap=self.member_cap(member),
                              level="warning")
            member.wants_notify = True
            return []
        member.capped = False
        self._release_due()
        if len(self.ready) < n:
            self._fill(n)
        deadline = time.monotonic() + (member.lease_ms or self.s.visibility_timeout_ms) / 1000.0
        out = self._take_ready(min(n, len(self.ready)))
        leases = self.leases
        mleases = member.leases
        wires: list[int] = []
        add_wire = wires.append
        redelivered = 0
        for lease in out:
            lease.member = member
            lease.deadline = deadline
            d = lease.deliveries + 1
            if d > 1:
                redelivered += 1
                if d > MAX_DELIVERY:
                    d = MAX_DELIVERY
            lease.deliveries = d
            w = lease.wire
            leases[w] = lease
            mleases.add(w)
            add_wire(w)
        if wires:
            # one expiry entry per PULL; ``tick`` checks each lease's own deadline.
            # (Only the wire ids: an acked lease must not stay in memory until then.)
            heapq.heappush(self.expiry, (deadline, next(self._tie), wires))
        if redelivered:
            self.stats["redelivered"] += redelivered
        member.delivered += len(out)
        self.stats["delivered"] += len(out)
        member.wants_notify = not out
        return out

    def _take_ready(self, k: int) -> list[Lease]:
        """Pop the first ``k`` messages of the ready queue (all of it in one copy when
        a PULL takes everything, the usual case while draining a backlog)."""
        ready = self.ready
        if k >= len(ready):
            out = list(ready)
            ready.clear()
            return out
        popleft = ready.popleft
        return [popleft() for _ in range(k)]

    def _take(self, member: Member, wire: int, delivery: int) -> Lease:
        lease = self.leases.get(wire)
        if lease is None or lease.member is not member or lease.deliveries != delivery:
            self.stats["unknown_lease"] += 1
            raise ClusterError("UNKNOWN_LEASE",
                               f"lease ({wire}, {delivery}) is unknown, expired or not "
                               f"yours (cluster {self.name})")
        del self.leases[wire]
        member.leases.discard(wire)
        return lease

    def ack(self, member: Member, wire: int, delivery: int) -> None:
        """Finish a leased message; raises :class:`ClusterError` for an unknown lease."""
        lease = self.leases.get(wire)
        if lease is None or lease.member is not member or lease.deliveries != delivery:
            self._take(member, wire, delivery)   # raises UNKNOWN_LEASE
            return
        del self.leases[wire]
        member.leases.discard(wire)
        lease.source.finish(lease.qoff)
        if self.ordered:
            self._sn_free(lease)
        self.touch()
        member.acked += 1
        self.stats["acked"] += 1

    def ack_many(self, member: Member, keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """:meth:`ack` for every ``(wire, delivery)`` of one ACK frame; returns the keys
        that are unknown, expired or not ``member``'s (the others are applied).

        The main topic's offsets are finished together (:meth:`Source.finish_many`)
        and the counters move once per frame: the per-message work is two lookups
        and two deletions."""
        leases = self.leases
        get = leases.get
        discard = member.leases.discard
        main = self.main
        ordered = self.ordered
        done: list[int] = []
        bad: list[tuple[int, int]] = []
        for key in keys:
            wire, delivery = key
            lease = get(wire)
            if lease is None or lease.member is not member or lease.deliveries != delivery:
                bad.append(key)
                continue
            del leases[wire]
            discard(wire)
            if lease.source is main:
                done.append(lease.qoff)
            else:
                lease.source.finish(lease.qoff)
            if ordered:
                self._sn_free(lease)
        main.finish_many(done)
        self.touch()   # once per ACK frame
        n = len(keys) - len(bad)
        member.acked += n
        self.stats["acked"] += n
        if bad:
            self.stats["unknown_lease"] += len(bad)
        return bad

    def nack(self, member: Member, wire: int, delivery: int, delay_ms: int | None = None,
             reason: str = "") -> str:
        """Retry a leased message later (or dead-letter it). Returns what was done:
        ``"retry"`` or ``"dlq"``."""
        lease = self._take(member, wire, delivery)
        self.touch()
        member.nacked += 1
        self.stats["nacked"] += 1
        lease.retries += 1
        reason = reason or "nack"
        if lease.retries > self.s.max_retries:
            self._dead_letter(lease, reason)
            return "dlq"
        if delay_ms is None:
            level = self.s.retry_level(lease.retries)
            delay = self.s.level_delay_ms(level)
        else:
            delay = float(delay_ms)
            level = self.s.level_for_delay(delay)
        self.stats["retried"] += 1
        if self.ordered:
            heapq.heappush(self.delayed, (time.monotonic() + delay / 1000.0,
                                          next(self._tie), lease))
        else:
            self._write_retry(lease, level, delay, reason)
        return "retry"

    # -- retry and dead-letter writes -----------------------------------------------

    def _orig_headers(self, lease: Lease) -> dict[str, Any]:
        r = lease.rec
        return {"cluster": self.name, "orig_topic": r.topic, "orig_sn": r.sn,
                "orig_seq": r.seq, "orig_lock_ts_ms": r.lock_ts_ms,
                "orig_broker_ts_us": r.broker_ts_us, "orig_offset": r.offset,
                "orig_queue_offset": r.queue_offset, "orig_headers": r.headers,
                "deliveries": lease.deliveries, "retries": lease.retries}

    def _write_retry(self, lease: Lease, level: int, delay_ms: float, reason: str) -> None:
        h = self._orig_headers(lease)
        h["due_ms"] = int(self.steady_ms() + delay_ms)
        h["reason"] = reason
        h["level"] = level
        self._retry_source(level)
        self._write(lease, NewRecord(self.retry_topic(level), "", 0, lease.rec.lock_ts_ms,
                                     lease.rec.payload, h), "retry", delay_ms)

    def replay_record(self, rec: NewRecord) -> NewRecord:
        """Point a replayed dead letter at retry level 0 (due now); see ``dlq.replay``."""
        rec.topic = self.retry_topic(0)
        self._retry_source(0)
        return rec

    def _dead_letter(self, lease: Lease, reason: str) -> None:
        h = self._orig_headers(lease)
        h["reason"] = reason
        h["dead_ms"] = int(time.time() * 1000)
        self.stats["dead_lettered"] += 1
        self.host.log("dead_letter", cluster=self.name, msg=f"{lease.rec.sn}:{lease.rec.seq}",
                      reason=reason, deliveries=lease.deliveries, level="warning")
        self._write(lease, NewRecord(self.dlq_topic, "", 0, lease.rec.lock_ts_ms,
                                     lease.rec.payload, h), "dlq", 0.0)

    def _write(self, lease: Lease, rec: NewRecord, what: str, delay_ms: float) -> None:
        """Store ``rec`` (sn/seq assigned by the host), then finish ``lease``.

        If the store refuses, the message stays in memory and is retried later (it
        is never dropped: the committed position does not move past it)."""
        self.pending_writes += 1

        async def run() -> None:
            try:
                res = await self.host.append_system([rec])
                if res and getattr(res[0], "duplicate", False):
                    # not stored: finishing the original now would lose the message
                    raise RuntimeError(f"{what} record taken as a duplicate, not stored")
            except Exception as exc:  # noqa: BLE001 -- any store error: keep it in memory
                self.pending_writes -= 1
                self.host.log("system_write_failed", cluster=self.name, what=what,
                              error=repr(exc), level="warning")
                back = max(delay_ms, 1000.0 * self.s.time_scale)
                if what == "dlq":
                    lease.retries -= 1  # the next nack tries the dead-letter write again
                heapq.heappush(self.delayed, (time.monotonic() + back / 1000.0,
                                              next(self._tie), lease))
                return
            self.pending_writes -= 1
            lease.source.finish(lease.qoff)
            self._sn_free(lease)
            self.wake()

        self.host.spawn(run())

    # -- timers ---------------------------------------------------------------------

    def tick(self) -> None:
        """Expire leases, release due retries, read the retry topic, wake idle members."""
        now = time.monotonic()
        exp = self.expiry
        woke = False
        leases = self.leases
        while exp and exp[0][0] <= now:
            wires = heapq.heappop(exp)[2]
            back = []
            for wire in wires:
                lease = leases.get(wire)
                if lease is None or lease.deadline > now:
                    continue            # acked, nacked, released or leased again since
                del leases[wire]
                member = lease.member
                if member is not None:
                    member.leases.discard(wire)
                lease.member = None
                if lease.deliveries > self.s.max_retries:
                    lease.retries = max(lease.retries, lease.deliveries)
                    self._dead_letter(lease, "lease expired")
                    continue
                back.append(lease)
            if back:
                self.stats["redelivered_after_timeout"] = \
                    self.stats.get("redelivered_after_timeout", 0) + len(back)
                self.ready.extendleft(reversed(back))
                woke = True
        if self._release_due():
            woke = True
        if woke or any(m.wants_notify for m in self.members.values()):
            self.wake()

    # -- persistence and admin ------------------------------------------------------

    def reset_to(self, qoff: int) -> None:
        """Move the main position to ``qoff`` (no members may be connected): what was
        read ahead but not leased is forgotten; retries are kept."""
        assert not self.members and not self.leases
        src = self.main
        self.ready = deque(x for x in self.ready if x.source is not src)
        self.waiting.clear()
        self.waiting_count = 0
        self.busy_sns.clear()
        self.delayed = [x for x in self.delayed if x[2].source is not src]
        heapq.heapify(self.delayed)
        src.committed = src.next = qoff
        src.done_above.clear()
        src.gaps.clear()
        src.dirty = True
        self.capped = False

    def positions(self) -> dict[str, int]:
        """What ``consume-<cluster>.log`` holds: committed offset per source topic."""
        out = {self.main.topic: self.main.committed}
        for src in self.retry_sources.values():
            out[src.topic] = src.committed
        return out

    def take_dirty(self) -> bool:
        """True (once) if a position moved since the last call."""
        d = self.main.dirty
        self.main.dirty = False
        for src in self.retry_sources.values():
            d = d or src.dirty
            src.dirty = False
        return d

    def info(self) -> dict[str, Any]:
        """Admin view of the cluster (``clusters`` admin op)."""
        end = self.host.queue_end(self.topic)
        return {
            "name": self.name, "topic": self.topic, "ordered": self.ordered,
            "members": [m.info() for m in self.members.values()],
            "inflight": len(self.leases), "ready": len(self.ready),
            "waiting_for_lock": self.waiting_count, "delayed": len(self.delayed),
            "retry_scheduled": sum(
                len(self.retry_ahead[lv]) + self.host.queue_end(src.topic) - src.next
                for lv, src in self.retry_sources.items()),
            "committed": self.main.committed, "next": self.main.next, "queue_end": end,
            "backlog": max(0, end - self.main.committed),
            "unread": max(0, end - self.main.next),
            "dlq_size": self.host.queue_end(self.dlq_topic),
            "cluster_cap": self.s.max_inflight_per_cluster, "cluster_capped": self.capped,
            "member_cap": self.s.max_inflight_per_member,
            "last_active_ms": int(self.last_active_ms), "skipped": self.stats["skipped"],
            "stats": dict(self.stats),
        }
