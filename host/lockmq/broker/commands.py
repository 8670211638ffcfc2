"""Downlink commands: a service asks, the broker delivers to the lock, the lock answers.

Flow::

    service --COMMAND(target, cmd_id, expires_ms, kind, args)--> broker
    broker  --COMMAND(target, broker cmd_id, expires_ms, kind, args, mac)--> lock
    lock    --COMMAND_RESULT(target, broker cmd_id, status, detail)--> broker
    broker  --COMMAND_RESULT(target, service cmd_id, status, detail)--> service
                   (a service cmd_id of 0: the broker cmd_id, the one the lock logs)
                                          (RESPONSE flag, the service's opaque)

The broker numbers commands per lock itself (the lock runs only a ``cmd_id`` higher
than the last it ran, so re-sending after a reconnect is safe) and signs them with
the guard. A command for an offline lock waits (in memory) until the lock comes
online or ``expires_ms`` passes (0 = now + ``default_expiry_s``); then the sender
gets status OFFLINE. A forwarded command without a result within
``result_timeout_s`` is answered EXPIRED. If the lock drops the connection before
answering, the command waits for it again -- at most ``max_delivery_attempts``
sends in all, then the sender gets FAILED (a command that breaks the lock's link
must not be resent at every reconnect until it expires).

Refused at submit time, before anything is held (the Guard checks rights per kind
and that the lock is registered):

* a command whose frame to the lock would exceed the lock's frame limit -- the
  ``max_frame`` it stated in CONNECT (remembered per SN) or, if it stated none,
  ``lock_max_frame_default`` -- with INVALID_ARGUMENT naming both sizes;
* a command over one of the caps on waiting commands (count and bytes, per
  sender, per lock, broker-wide) with BUSY naming the cap. Non-admin senders share
  only ``100 - admin_reserve_pct`` % of the per-lock and broker-wide caps, and each
  sender stays under its own cap, so no token can block an admin's unlock.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Callable

from lockmq.config import CommandsSection
from lockmq.protocol import Command, CommandResult, CommandStatus, ErrorCode, Flag, Op
from lockmq.security import BrokerGuard, SecurityError
from lockmq.security.commands import command_frame_size

from .admission import Admission
from .logs import EventLog, Stats
from .peer import Handler, Peer
from .periodic import start_periodic, stop_task



#: SNs whose stated frame limit is remembered while they are offline (bounded: with
#: auth required only registered locks get in; with auth off any name could).
_MAX_REMEMBERED_LIMITS = 1 << 16


class Pending:
    """A command on its way to a lock."""

    __slots__ = ("sender", "opaque", "cmd", "broker_id", "sent_at", "received_ms", "lock_conn",
                 "owner", "cost", "attempts", "done", "deadline")

    def __init__(self, sender: Peer, opaque: int, cmd: Command, broker_id: int,
                 owner: str = "", cost: int = 0) -> None:
        self.sender = sender
        self.opaque = opaque
        self.cmd = cmd
        self.broker_id = broker_id
        self.sent_at = 0.0
        self.received_ms = int(time.time() * 1000)
        #: when it expires, on the monotonic clock: a step of the wall clock neither
        #: expires a waiting command early nor keeps it past its time
        self.deadline = time.monotonic() + (cmd.expires_ms - self.received_ms) / 1000
        self.lock_conn: Peer | None = None
        self.owner = owner          # whose caps it counts against
        self.cost = cost            # bytes it counts for (its frame to the lock)
        self.attempts = 0           # times sent to the lock
        self.done = False           # answered: released from every cap


class DetachedSender:
    """Stands in for the connection of a command the broker submits on someone's
    behalf (a scheduled command at its time, a committed transactional command):
    that sender may be long gone, so a subclass says what becomes of the lock's
    result (:meth:`result`) and of a refusal (:meth:`failed`)."""

    closed = False

    def __init__(self, principal: Any) -> None:
        self.principal = principal

    def send_frame(self, opcode: int, body: bytes, opaque: int = 0, flags: int = 0) -> None:
        """The command's answer (COMMAND_RESULT)."""
        if opcode == Op.COMMAND_RESULT:
            self.result(CommandResult.decode(body))

    def send_error(self, code: int, message: str, opaque: int, retry_after_ms: int = 0) -> None:
        """Refused by the command path (caps, size, expiry)."""
        self.failed(int(code), message)

    def refused(self, exc: SecurityError, opaque: int) -> None:
        """Refused by the guard."""
        self.failed(int(exc.code), exc.public_message or str(exc))

    def result(self, res: CommandResult) -> None:
        """The lock's (or the broker's OFFLINE/EXPIRED/FAILED) result."""
        raise NotImplementedError

    def failed(self, code: int, message: str) -> None:
        """Refused with error ``code`` before reaching the lock."""
        raise NotImplementedError


def _owner(principal: Any) -> str:
    """The cap key of a sender: its token (a token's connections share one cap)."""
    tid = getattr(principal, "token_id", "")
    return f"token:{tid}" if tid else f"{getattr(principal, 'kind', '?')}:" \
        f"{getattr(principal, 'name', '?')}"


class Commands:
    """Queues, forwards and matches downlink commands (see the module docstring)."""

    def __init__(self, cfg: CommandsSection, stats: Stats, log: EventLog, guard: BrokerGuard,
                 online_lock: Callable[[str], Peer | None],
                 admission: Admission | None = None) -> None:
        self.cfg = cfg
        self.stats = stats
        self.log = log
        self.guard = guard
        #: the one rights decision, at submit and again at each send to the lock
        self.admission = admission or Admission(guard, stats, log,
                                                reserve_pct=cfg.admin_reserve_pct)
        self.admission.on_revoked(self.cancel_principal)
        #: the connection of lock SN if it is online now (``Devices.online_lock``)
        self.online_lock = online_lock
        self.queued: dict[str, deque[Pending]] = {}
        # SN -> broker id -> command sent, awaiting its result; by SN so that a lock's
        # close looks at its own commands only, not at every lock's
        self.forwarded: dict[str, dict[int, Pending]] = {}
        self.total = 0                                   # queued (not yet forwarded)
        self.held = 0                                    # accepted, not yet answered
        self.held_bytes = 0
        self.by_owner: dict[str, list[int]] = {}         # owner -> [count, bytes]
        self.by_lock: dict[str, list[int]] = {}          # SN -> [count, bytes]
        self.lock_limits: dict[str, int] = {}            # SN -> max_frame it last stated
        self._task: asyncio.Task[Any] | None = None

    def handlers(self) -> dict[int, Handler]:
        """This feature's part of the connection's dispatch table."""
        return {Op.COMMAND: self.on_command, Op.COMMAND_RESULT: self.on_result}

    def on_command(self, peer: Peer, frame: Any) -> None:
        """A service's COMMAND frame."""
        self.submit(peer, frame.opaque, Command.decode(frame.body))

    def on_result(self, peer: Peer, frame: Any) -> None:
        """A lock's COMMAND_RESULT frame."""
        self.result(peer, CommandResult.decode(frame.body))

    def start(self) -> None:
        """Start the expiry sweep."""
        self._task = start_periodic("lockmq-commands", 1.0, self.sweep, self.log)

    async def stop(self) -> None:
        """Stop the sweep."""
        await stop_task(self._task)

    def submit(self, sender: Peer, opaque: int, cmd: Command) -> None:
        """A service's COMMAND (or one the broker issues for someone: a scheduled or
        committed command, whose sender is a DetachedSender): check, queue, forward if
        the lock is online. The rights are those of the sender *now* (a detached
        sender's principal is re-read from the registry: ``Admission``)."""
        cfg = self.cfg
        self.stats.inc("commands_received")
        principal = sender.principal
        try:
            self.admission.check_command(principal, cmd.target, cmd.kind, cmd.args,
                                         fresh=isinstance(sender, DetachedSender))
        except SecurityError as exc:
            self.stats.inc("commands_refused")
            sender.refused(exc, opaque)
            return
        now_ms = int(time.time() * 1000)
        if cmd.expires_ms == 0:
            cmd.expires_ms = now_ms + int(cfg.default_expiry_s * 1000)
        if cmd.expires_ms <= now_ms or cmd.expires_ms > now_ms + cfg.max_expiry_s * 1000:
            self.stats.inc("commands_refused")
            sender.send_error(int(ErrorCode.INVALID_ARGUMENT),
                              f"expires_ms must be in the future and at most "
                              f"{cfg.max_expiry_s:g} s ahead", opaque)
            return
        # What the lock can receive: refuse now rather than break its link later.
        size = command_frame_size(cmd.target, cmd.args)
        limit, stated = self.frame_limit(cmd.target)
        if size > limit:
            self._refuse(sender, opaque, "too_large", int(ErrorCode.INVALID_ARGUMENT),
                         f"command too large for lock {cmd.target!r}: its frame would be "
                         f"{size} bytes, over the {limit}-byte frame limit the lock "
                         f"{'stated' if stated else 'is assumed to have (commands.lock_max_frame_default)'}"
                         f"; arguments may be at most {limit - (size - len(cmd.args))} bytes",
                         target=cmd.target, size=size, limit=limit)
            return
        owner = _owner(principal)
        over = self._over_cap(owner, principal, cmd.target, size)
        if over is not None:
            setting, detail, fits_ever = over
            if fits_ever:
                self._refuse(sender, opaque, "cap", int(ErrorCode.BUSY),
                             f"too many commands waiting: {detail} (commands.{setting}); "
                             f"retry when some are answered", retry_after_ms=5000,
                             cap=setting, target=cmd.target, owner=owner)
            else:
                self._refuse(sender, opaque, "cap", int(ErrorCode.INVALID_ARGUMENT),
                             f"command of {size} bytes is larger than commands.{setting}",
                             cap=setting, target=cmd.target, owner=owner)
            return
        p = Pending(sender, opaque, cmd, 0, owner, size)
        self._hold(p)
        self.queued.setdefault(cmd.target, deque()).append(p)
        self.total += 1
        self.log("command_queued", target=cmd.target, kind=cmd.kind, sender=principal.name,
              online=self.online_lock(cmd.target) is not None, level="debug")
        lock = self.online_lock(cmd.target)
        if lock is not None:
            self._forward_all(lock)

    # -- limits ---------------------------------------------------------------------

    def frame_limit(self, sn: str) -> tuple[int, bool]:
        """``(largest frame lock sn can receive, whether it stated it)``: from its
        current session, else the last one it stated, else the configured default."""
        lock = self.online_lock(sn)
        n = lock.peer_max_frame if lock is not None \
            else self.lock_limits.get(sn, 0)
        return (n, True) if n else (self.cfg.lock_max_frame_default, False)

    def _over_cap(self, owner: str, principal: Any, sn: str,
                  cost: int) -> tuple[str, str, bool] | None:
        """The first cap a new command would exceed: ``(setting, detail, could fit
        once others are answered)``, or None."""
        cfg = self.cfg
        # services share all but the admins' reserve of the per-lock and global caps
        share = self.admission.share
        oc, ob = self.by_owner.get(owner, (0, 0))
        lc, lb = self.by_lock.get(sn, (0, 0))
        checks = (
            ("max_pending_per_sender", oc + 1, cfg.max_pending_per_sender,
             f"this sender (token) has {oc} commands waiting"),
            ("max_pending_bytes_per_sender", ob + cost, cfg.max_pending_bytes_per_sender,
             f"this sender (token) has {ob} bytes of commands waiting"),
            ("max_pending_per_lock", lc + 1, share(cfg.max_pending_per_lock, principal),
             f"{lc} commands are waiting for lock {sn!r}"),
            ("max_pending_bytes_per_lock", lb + cost,
             share(cfg.max_pending_bytes_per_lock, principal),
             f"{lb} bytes of commands are waiting for lock {sn!r}"),
            ("max_pending_total", self.held + 1, share(cfg.max_pending_total, principal),
             f"{self.held} commands are waiting in the broker"),
            ("max_pending_bytes_total", self.held_bytes + cost,
             share(cfg.max_pending_bytes_total, principal),
             f"{self.held_bytes} bytes of commands are waiting in the broker"),
        )
        for setting, _want, cap, detail in checks:   # too big even for an empty queue?
            if (cost if "bytes" in setting else 1) > cap:
                return setting, detail, False
        for setting, want, cap, detail in checks:
            if want > cap:
                return setting, detail, True
        return None

    def _hold(self, p: Pending) -> None:
        self.held += 1
        self.held_bytes += p.cost
        for table, key in ((self.by_owner, p.owner), (self.by_lock, p.cmd.target)):
            e = table.setdefault(key, [0, 0])
            e[0] += 1
            e[1] += p.cost

    def _release(self, p: Pending) -> None:
        """Count an answered command out of every cap (once)."""
        if p.done:
            return
        p.done = True
        self.held -= 1
        self.held_bytes -= p.cost
        for table, key in ((self.by_owner, p.owner), (self.by_lock, p.cmd.target)):
            e = table.get(key)
            if e is not None:
                e[0] -= 1
                e[1] -= p.cost
                if e[0] <= 0:
                    del table[key]

    def _refuse(self, sender: Peer, opaque: int, reason: str, code: int, message: str,
                retry_after_ms: int = 0, **fields: Any) -> None:
        """Answer a refused command; count it and log it (one line per reason per
        second at most, with how many were not logged)."""
        self.stats.inc("commands_refused")
        self.stats.inc(f"commands_refused_{reason}")
        sender.send_error(code, message, opaque, retry_after_ms=retry_after_ms)
        self.log.limited("command_refused", f"command_refused:{reason}:{fields.get('cap', '')}",
                         reason=reason, sender=getattr(sender.principal, "name", "?"),
                         message=message, level="warning", **fields)

    def lock_online(self, lock: Peer) -> None:
        """A lock connected: remember the frame limit it stated, send what waits for it."""
        sn = lock.principal.name
        n = lock.peer_max_frame
        self.lock_limits.pop(sn, None)          # re-inserted last: the dict is an LRU
        if n:
            self.lock_limits[sn] = n
            if len(self.lock_limits) > _MAX_REMEMBERED_LIMITS:
                del self.lock_limits[next(iter(self.lock_limits))]
        self._forward_all(lock)

    def _forward_all(self, lock: Peer) -> None:
        sn = lock.principal.name
        q = self.queued.pop(sn, None)
        if not q:
            return
        now = time.monotonic()
        for p in q:
            self.total -= 1
            if p.deadline <= now:
                self._answer(p, CommandStatus.OFFLINE, "the lock stayed offline until expiry")
                continue
            self._forward(lock, p)

    def _forward(self, lock: Peer, p: Pending) -> None:
        sn = lock.principal.name
        c = p.cmd
        # The lock may have reconnected stating a smaller limit since the submit.
        limit = lock.peer_max_frame or \
            self.cfg.lock_max_frame_default
        if p.cost > limit:
            self.stats.inc("commands_refused_too_large")
            self._answer(p, CommandStatus.FAILED, f"command frame of {p.cost} bytes is over the "
                                                  f"{limit}-byte frame limit the lock states now")
            return
        # Its sender must still stand now: the command may have waited for the lock, or
        # be a resend after a reconnect; a revoked sender's command never goes out.
        try:
            self.admission.check_standing(p.sender.principal, "command")
        except SecurityError as exc:
            self.stats.inc("commands_refused")
            self._answer(p, CommandStatus.REFUSED, f"not sent: {exc}")
            return
        try:
            if not p.broker_id:
                p.broker_id = self.guard.next_command_id(sn)
            mac = self.guard.sign_command(sn, p.broker_id, c.expires_ms, c.kind, c.args,
                                       principal=lock.principal)
        except SecurityError as exc:   # AuthFailed: unknown/disabled lock
            self.stats.inc("commands_refused")
            self._answer(p, CommandStatus.REFUSED, f"cannot sign for this lock: {exc}")
            return
        out = Command(sn, p.broker_id, c.expires_ms, c.kind, c.args, mac)
        p.sent_at = time.monotonic()
        p.lock_conn = lock
        p.attempts += 1
        self.forwarded.setdefault(sn, {})[p.broker_id] = p
        lock.send_frame(Op.COMMAND, out.encode(), p.broker_id)
        self.stats.inc("commands_forwarded")

    def result(self, lock: Peer, res: CommandResult) -> None:
        """A lock's COMMAND_RESULT: pass it to the sender."""
        sn = lock.principal.name
        p = self._take_forwarded(sn, res.cmd_id)
        self.stats.inc("commands_results")
        if p is None:
            self.log("command_result_unknown", sn=sn, cmd_id=res.cmd_id, level="warning")
            return
        took = time.monotonic() - p.sent_at
        self.stats.latency.command_round_trip.observe(took)
        self.log("command_result", target=sn, cmd_id=res.cmd_id, status=res.status,
                 ms=int(took * 1000))
        self._answer(p, res.status, res.detail)

    def _answer(self, p: Pending, status: int, detail: str) -> None:
        self._release(p)
        if status in (CommandStatus.OFFLINE, CommandStatus.EXPIRED):
            self.stats.inc("commands_expired")
        if p.sender.closed:
            self.log("command_result_dropped", target=p.cmd.target,
                            reason="sender disconnected", status=status, level="warning")
            return
        # a sender's cmd_id 0 asks the broker to number it: the answer then carries the
        # id the lock ran and logged (`lockmq command` prints it), else the sender's own
        p.sender.send_frame(Op.COMMAND_RESULT, CommandResult(
            p.cmd.target, p.cmd.cmd_id or p.broker_id, status, detail[:1000]).encode(), p.opaque,
            Flag.RESPONSE)

    def connection_closed(self, conn: Peer) -> None:
        """A lock left before answering: the commands sent on that connection wait for
        the lock again (or go at once to its newer connection, if it reconnected)."""
        if not conn.principal or conn.principal.kind != "lock":
            return
        sn = conn.principal.name
        mine = self.forwarded.get(sn)
        back = [k for k, p in mine.items() if p.lock_conn is conn] if mine else []
        if not back:
            return
        q = self.queued.setdefault(sn, deque())
        given_up = []
        limit = self.cfg.max_delivery_attempts
        for k in reversed(back):
            p = self._take_forwarded(sn, k)
            p.lock_conn = None
            if p.attempts >= limit:     # it may be what breaks the link: not again
                given_up.append(p)
                continue
            q.appendleft(p)
            self.total += 1
        if not q:
            del self.queued[sn]
        for p in given_up:
            self.stats.inc("commands_undeliverable")
            self.log("command_undeliverable", target=sn, cmd_id=p.broker_id,
                            kind=p.cmd.kind, size=p.cost, attempts=p.attempts,
                            sender=getattr(p.sender.principal, "name", "?"), level="warning")
            self._answer(p, CommandStatus.FAILED,
                         f"lock {sn} dropped its link {p.attempts} times after this command "
                         f"was sent, without answering it: not sent again "
                         f"(commands.max_delivery_attempts)")
        now_online = self.online_lock(sn)
        if now_online is not None and now_online is not conn and now_online.established:
            self._forward_all(now_online)

    def cancel_principal(self, matches: Callable[[Any], bool], why: str) -> int:
        """Cancel the commands waiting for their lock whose sender ``matches``
        (revoked: ``Admission``); each is answered REFUSED and logged. Returns how many.
        A command to a lock that stops standing is refused when it would be sent."""
        n = 0
        for sn in list(self.queued):
            q = self.queued[sn]
            keep: deque[Pending] = deque()
            for p in q:
                if matches(p.sender.principal):
                    self.total -= 1
                    n += 1
                    self.log("command_cancelled", target=sn, kind=p.cmd.kind,
                             sender=getattr(p.sender.principal, "name", "?"), why=why,
                             level="warning")
                    self._answer(p, CommandStatus.REFUSED, f"cancelled: {why}")
                else:
                    keep.append(p)
            if keep:
                self.queued[sn] = keep
            else:
                del self.queued[sn]
        return n

    def sweep(self) -> None:
        """Answer commands whose expiry or result timeout passed."""
        now = time.monotonic()
        for sn in list(self.queued):
            q = self.queued[sn]
            keep = deque()
            for p in q:
                if p.deadline <= now:
                    self.total -= 1
                    self._answer(p, CommandStatus.OFFLINE,
                                 "the lock stayed offline until the command expired")
                else:
                    keep.append(p)
            if keep:
                self.queued[sn] = keep
            else:
                del self.queued[sn]
        limit = time.monotonic() - self.cfg.result_timeout_s
        late = [(sn, k) for sn, mine in self.forwarded.items()
                for k, p in mine.items() if p.sent_at < limit]
        for sn, k in late:
            self._answer(self._take_forwarded(sn, k), CommandStatus.EXPIRED,
                         "no result from the lock in time")

    def _take_forwarded(self, sn: str, broker_id: int) -> Pending | None:
        """Remove and return the command sent to lock SN as BROKER_ID (None if unknown)."""
        mine = self.forwarded.get(sn)
        if not mine:
            return None
        p = mine.pop(broker_id, None)
        if not mine:
            del self.forwarded[sn]
        return p

    def info(self) -> dict[str, Any]:
        """Admin view: commands waiting per lock and awaiting results."""
        return {"queued": {sn: len(q) for sn, q in self.queued.items()},
                "awaiting_result": sum(map(len, self.forwarded.values())), "total_queued": self.total,
                "held": self.held, "held_bytes": self.held_bytes,
                "by_sender": {k: {"count": v[0], "bytes": v[1]} for k, v in self.by_owner.items()},
                "lock_max_frame": dict(self.lock_limits)}
