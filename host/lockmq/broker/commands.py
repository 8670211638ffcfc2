"""Downlink commands: a service asks, the broker delivers to the lock, the lock answers.

Flow::

    service --COMMAND(target, cmd_id, expires_ms, kind, args)--> broker
    broker  --COMMAND(target, broker cmd_id, expires_ms, kind, args, mac)--> lock
    lock    --COMMAND_RESULT(target, broker cmd_id, status, detail)--> broker
    broker  --COMMAND_RESULT(target, service cmd_id, status, detail)--> service
                                          (RESPONSE flag, the service's opaque)

The broker numbers commands per lock itself (the lock runs only a ``cmd_id`` higher
than the last it ran, so re-sending after a reconnect is safe) and signs them with
the guard. A command for an offline lock waits (in memory) until the lock comes
online or ``expires_ms`` passes (0 = now + ``default_expiry_s``); then the sender
gets status OFFLINE. A forwarded command without a result within
``result_timeout_s`` is answered EXPIRED. If the lock drops the connection before
answering, the command waits for it again.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from lockmq.protocol import Command, CommandResult, CommandStatus, ErrorCode, Flag, Op

from .periodic import start_periodic, stop_task

if TYPE_CHECKING:
    from .connection import Connection
    from .server import Broker


class Pending:
    """A command on its way to a lock."""

    __slots__ = ("sender", "opaque", "cmd", "broker_id", "sent_at", "received_ms", "lock_conn")

    def __init__(self, sender: "Connection", opaque: int, cmd: Command, broker_id: int) -> None:
        self.sender = sender
        self.opaque = opaque
        self.cmd = cmd
        self.broker_id = broker_id
        self.sent_at = 0.0
        self.received_ms = int(time.time() * 1000)
        self.lock_conn: "Connection | None" = None


class Commands:
    """Queues, forwards and matches downlink commands (see the module docstring)."""

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.queued: dict[str, deque[Pending]] = {}
        self.forwarded: dict[tuple[str, int], Pending] = {}
        self.total = 0
        self._task: asyncio.Task[Any] | None = None

    def start(self) -> None:
        """Start the expiry sweep."""
        self._task = start_periodic("lockmq-commands", 1.0, self.sweep)

    async def stop(self) -> None:
        """Stop the sweep."""
        await stop_task(self._task)

    def submit(self, sender: "Connection", opaque: int, cmd: Command) -> None:
        """A service's COMMAND: check, queue, forward if the lock is online."""
        b = self.broker
        cfg = b.config.commands
        b.stats.inc("commands_received")
        try:
            b.guard.check_command(sender.principal, cmd.target)
        except Exception as exc:  # noqa: BLE001 -- SecurityError
            b.stats.inc("commands_refused")
            sender.refused(exc, opaque)
            return
        now_ms = int(time.time() * 1000)
        if cmd.expires_ms == 0:
            cmd.expires_ms = now_ms + int(cfg.default_expiry_s * 1000)
        if cmd.expires_ms <= now_ms or cmd.expires_ms > now_ms + cfg.max_expiry_s * 1000:
            b.stats.inc("commands_refused")
            sender.send_error(int(ErrorCode.INVALID_ARGUMENT),
                              f"expires_ms must be in the future and at most "
                              f"{cfg.max_expiry_s:g} s ahead", opaque)
            return
        q = self.queued.setdefault(cmd.target, deque())
        if len(q) >= cfg.max_pending_per_lock or self.total >= cfg.max_pending_total:
            b.stats.inc("commands_refused")
            sender.send_error(int(ErrorCode.BUSY), "too many commands waiting for this lock",
                              opaque, retry_after_ms=5000)
            if not q:
                del self.queued[cmd.target]
            return
        p = Pending(sender, opaque, cmd, 0)
        q.append(p)
        self.total += 1
        b.log("command_queued", target=cmd.target, kind=cmd.kind, sender=sender.principal.name,
              online=cmd.target in b.devices.online_by_sn, level="debug")
        lock = b.devices.online_by_sn.get(cmd.target)
        if lock is not None:
            self._forward_all(lock)

    def lock_online(self, lock: "Connection") -> None:
        """A lock connected: send what waits for it."""
        self._forward_all(lock)

    def _forward_all(self, lock: "Connection") -> None:
        sn = lock.principal.name
        q = self.queued.pop(sn, None)
        if not q:
            return
        now_ms = int(time.time() * 1000)
        for p in q:
            self.total -= 1
            if p.cmd.expires_ms <= now_ms:
                self._answer(p, CommandStatus.OFFLINE, "the lock stayed offline until expiry")
                continue
            self._forward(lock, p)

    def _forward(self, lock: "Connection", p: Pending) -> None:
        b = self.broker
        sn = lock.principal.name
        c = p.cmd
        try:
            if not p.broker_id:
                p.broker_id = b.guard.next_command_id(sn)
            mac = b.guard.sign_command(sn, p.broker_id, c.expires_ms, c.kind, c.args,
                                       principal=lock.principal)
        except Exception as exc:  # noqa: BLE001 -- AuthFailed: unknown/disabled lock
            b.stats.inc("commands_refused")
            self._answer(p, CommandStatus.REFUSED, f"cannot sign for this lock: {exc}")
            return
        out = Command(sn, p.broker_id, c.expires_ms, c.kind, c.args, mac)
        p.sent_at = time.monotonic()
        p.lock_conn = lock
        self.forwarded[(sn, p.broker_id)] = p
        lock.send_frame(Op.COMMAND, out.encode(), p.broker_id)
        b.stats.inc("commands_forwarded")

    def result(self, lock: "Connection", res: CommandResult) -> None:
        """A lock's COMMAND_RESULT: pass it to the sender."""
        b = self.broker
        sn = lock.principal.name
        p = self.forwarded.pop((sn, res.cmd_id), None)
        b.stats.inc("commands_results")
        if p is None:
            b.log("command_result_unknown", sn=sn, cmd_id=res.cmd_id, level="warning")
            return
        b.log("command_result", target=sn, cmd_id=res.cmd_id, status=res.status,
              ms=int((time.monotonic() - p.sent_at) * 1000))
        self._answer(p, res.status, res.detail)

    def _answer(self, p: Pending, status: int, detail: str) -> None:
        if status in (CommandStatus.OFFLINE, CommandStatus.EXPIRED):
            self.broker.stats.inc("commands_expired")
        if p.sender.state == "closed":
            self.broker.log("command_result_dropped", target=p.cmd.target,
                            reason="sender disconnected", status=status, level="warning")
            return
        p.sender.send_frame(Op.COMMAND_RESULT, CommandResult(
            p.cmd.target, p.cmd.cmd_id, status, detail[:1000]).encode(), p.opaque,
            Flag.RESPONSE)

    def connection_closed(self, conn: "Connection") -> None:
        """A lock left before answering: the commands sent on that connection wait for
        the lock again (or go at once to its newer connection, if it reconnected)."""
        if not conn.principal or conn.principal.kind != "lock":
            return
        sn = conn.principal.name
        back = [k for k, p in self.forwarded.items() if k[0] == sn and p.lock_conn is conn]
        if not back:
            return
        q = self.queued.setdefault(sn, deque())
        for k in reversed(back):
            p = self.forwarded.pop(k)
            p.lock_conn = None
            q.appendleft(p)
            self.total += 1
        now_online = self.broker.devices.online_by_sn.get(sn)
        if now_online is not None and now_online is not conn and now_online.state == "open":
            self._forward_all(now_online)

    def sweep(self) -> None:
        """Answer commands whose expiry or result timeout passed."""
        now_ms = int(time.time() * 1000)
        for sn in list(self.queued):
            q = self.queued[sn]
            keep = deque()
            for p in q:
                if p.cmd.expires_ms <= now_ms:
                    self.total -= 1
                    self._answer(p, CommandStatus.OFFLINE,
                                 "the lock stayed offline until the command expired")
                else:
                    keep.append(p)
            if keep:
                self.queued[sn] = keep
            else:
                del self.queued[sn]
        limit = time.monotonic() - self.broker.config.commands.result_timeout_s
        for k, p in list(self.forwarded.items()):
            if p.sent_at < limit:
                del self.forwarded[k]
                self._answer(p, CommandStatus.EXPIRED, "no result from the lock in time")

    def info(self) -> dict[str, Any]:
        """Admin view: commands waiting per lock and awaiting results."""
        return {"queued": {sn: len(q) for sn, q in self.queued.items()},
                "awaiting_result": len(self.forwarded), "total_queued": self.total}
