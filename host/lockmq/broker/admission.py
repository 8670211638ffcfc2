"""The one admission decision: may this principal's message or command take effect *now*?

Every path where a publish or a command takes effect asks :class:`Admission`, never the
guard directly: a direct publish and the compiled lane (the rights of a live session,
whose cached decisions die with it), a scheduled delivery, a committed transactional
message or command, a command held for an offline lock and forwarded at its reconnect
(and each resend), a DLQ replay. Two kinds of check, one object:

* **live sessions** (``fresh=False``): the guard's rights checks plus the in-memory
  revocation book -- O(1), on the hot path. A session that stops standing is closed at
  once by the watcher below, so its cached decisions (the connection's checked topics,
  the lane's admitted run) go with it;
* **deferred items** (``fresh=True``): the principal re-read from the registry at the
  moment the item takes effect (``BrokerGuard.standing``): a token revoked between
  submit and due time refuses the item -- cancelled, logged, counted, shown to admins.

The **watcher** polls the registry file's ``data_version`` (a few µs) every
``POLL_S`` (and looks in full every ``RESCAN_S``, for tokens that expire); when ``lockmq tokens revoke`` / ``lockmq devices disable|rekey|remove``
wrote it, it reads which tokens are no longer active and which devices changed, then
closes the live sessions of those principals and asks each holder of pending work
(registered with :meth:`on_revoked`) to cancel what they left.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from lockmq.protocol import ErrorCode
from lockmq.security import BrokerGuard, PermissionDenied, Permissions, Principal

from .logs import EventLog, Stats
from .periodic import stop_task

#: seconds between two looks at the registry file's data_version
POLL_S = 0.25
#: a full look at least this often, file changed or not (a token's expiry is a time,
#: not a write)
RESCAN_S = 30.0


class Revoked(PermissionDenied):
    """The principal no longer stands (token revoked or expired; lock disabled, removed
    or re-keyed): what it asked for does not take effect."""

    public_message = "the credential of this request was revoked"


class Admission:
    """See the module docstring. ``connections``: the broker's ``Connections`` (their
    ``by_id`` map), whose sessions the watcher closes."""

    def __init__(self, guard: BrokerGuard, stats: Stats, log: EventLog,
                 connections: Any = None, reserve_pct: int = 10) -> None:
        self.guard = guard
        #: the share of every broker-wide cap only admins may use (``share``)
        self.reserve_pct = reserve_pct
        self.stats = stats
        self.log = log
        self.connections = connections
        #: token ids that are revoked or expired; lock SN -> why it stopped standing
        self.revoked_tokens: set[str] = set()
        self.locks_out: dict[str, str] = {}
        self._handlers: list[Callable[[Callable[[Any], bool], str], int]] = []
        self._version = -1
        self._scanned_at = 0.0
        self._task: asyncio.Task[Any] | None = None

    # -- the decision ---------------------------------------------------------------

    def standing(self, principal: Any, fresh: bool = False) -> str:
        """Why ``principal`` may not act now ("" if it may); ``fresh``: ask the
        registry itself, not only what the watcher saw."""
        if principal is None:
            return "no principal"
        tid = getattr(principal, "token_id", "")
        if tid and tid in self.revoked_tokens:
            return "token revoked"
        if getattr(principal, "kind", "") == "lock" and principal.name in self.locks_out:
            return self.locks_out[principal.name]
        if fresh:
            try:
                return self.guard.standing(principal)
            except Exception as exc:  # noqa: BLE001 -- a registry error: refuse, say why
                return f"standing unknown ({exc!r})"
        return ""

    def check_standing(self, principal: Any, what: str) -> None:
        """Does ``principal`` still stand, by the registry now (Revoked if not)? For an
        item whose rights were decided already and that takes effect later with the
        same principal (a held command's send): its rights cannot change -- a token's
        permissions are fixed at creation -- only whether it still stands."""
        self._require(principal, True, what)

    def _require(self, principal: Any, fresh: bool, what: str) -> None:
        why = self.standing(principal, fresh)
        if why:
            self.stats.inc("admission_refused_revoked")
            self.log.limited("admission_refused", f"admission_refused:{what}",
                             name=getattr(principal, "name", "?"),
                             token=getattr(principal, "token_id", "") or None, what=what,
                             why=why, level="warning")
            raise Revoked(f"{getattr(principal, 'name', '?')}: {why}", reason="revoked")

    def check_publish(self, principal: Any, topic: str, sn: Any = None, n: int = 1,
                      fresh: bool = False) -> None:
        """May ``principal`` publish to ``topic`` now? Raises a SecurityError."""
        # (on every record of the Python path: the book is looked at inline, the
        # common case costs two lookups)
        if fresh or principal is None or principal.token_id in self.revoked_tokens \
                or (self.locks_out and principal.name in self.locks_out):
            self._require(principal, fresh, "publish")
        self.guard.check_publish(principal, topic, sn, n)

    def check_command(self, principal: Any, sn: str, kind: int | None = None,
                      args: bytes | None = None, fresh: bool = False) -> None:
        """May ``principal`` send command ``kind`` to lock ``sn`` now?"""
        self._require(principal, fresh, "command")
        self.guard.check_command(principal, sn, kind, args)

    def share(self, cap: int, principal: Any) -> int:
        """What of broker-wide cap ``cap`` ``principal`` may fill: all of it for an
        admin, all but the admins' reserve (``commands.admin_reserve_pct``) for
        anyone else -- so no token, nor all of them together, can take the room an
        admin's unlock needs. One rule for the scheduler, transactions, commands."""
        if getattr(principal, "is_admin", False):
            return cap
        return max(1, cap * (100 - self.reserve_pct) // 100)

    def check_admin(self, principal: Any, op: str = "") -> None:
        """May ``principal`` run admin op ``op`` (``dlq.replay``, ``txn.resolve``,
        ``scheduled.cancel`` ...) now?"""
        self._require(principal, False, "admin")
        self.guard.check_admin(principal, op)

    def principal_of(self, token_id: str, token_name: str, name: str,
                     admin: bool) -> Principal:
        """The principal a deferred item was submitted by, with its rights as they are
        *now*: its token re-read (by id; by name for items stored before ids were
        kept). The result still has to pass :meth:`check_publish` /
        :meth:`check_command` with ``fresh=True``."""
        tokens = getattr(self.guard, "tokens", None)
        if tokens is None:      # auth off: the admin-or-service of then, as then
            return Principal(name=name, kind="admin" if admin else "service",
                             permissions=Permissions(admin=admin), token_name=token_name)
        info = tokens.get(token_id) if token_id else None
        if info is None and not token_id:
            active = tokens.active_by_name(token_name)
            info = active[0] if active else None
        if info is None:
            return Principal(name=name, kind="service", token_id=token_id or "?unknown",
                             token_name=token_name)
        return Principal(name=name, kind="admin" if info.permissions.admin else "service",
                         permissions=info.permissions, token_id=info.id, token_name=info.name)

    # -- revocation -----------------------------------------------------------------

    def on_revoked(self, handler: Callable[[Callable[[Any], bool], str], int]) -> None:
        """``handler(matches, why)`` cancels what the principals ``matches(principal)``
        says left pending, and returns how many items it cancelled."""
        self._handlers.append(handler)

    def start(self) -> None:
        """Start watching the registry (a running loop is needed)."""
        self._scan(initial=True)
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="lockmq-admission")

    async def stop(self) -> None:
        """Stop watching."""
        await stop_task(self._task, self.log)
        self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 -- keep watching; say so
                self.log.limited("admission_watch_failed", "admission_watch_failed",
                                 error=repr(exc), level="error")

    def poll(self) -> None:
        """Look at the registry once; act on what changed since the last look."""
        v = self.guard.security_version()
        if v != self._version or time.time() - self._scanned_at > RESCAN_S:
            self._version = v
            self._scan()

    def _scan(self, initial: bool = False) -> None:
        since = self._scanned_at - 2.0       # (updated_at is wall time: a little slack)
        self._scanned_at = time.time()
        tokens, devices = self.guard.revocations(since)
        new_tokens = tokens - self.revoked_tokens
        self.revoked_tokens = tokens
        if initial:     # the book as the broker starts: nothing is live to end yet
            self.locks_out = {sn: "lock disabled" for sn, enabled, _ in devices if not enabled}
            return
        if new_tokens:
            self._revoke(lambda p: getattr(p, "token_id", "") in new_tokens,
                         "token revoked or expired", sorted(new_tokens))
        # the live lock sessions by SN, once (a bulk import changes thousands of rows)
        online: dict[str, list[Any]] = {}
        for conn in self._sessions(lambda p: p.kind == "lock"):
            online.setdefault(conn.principal.name, []).append(conn)
        existing = getattr(getattr(self.guard, "registry", None), "existing", None)
        if online and existing is not None:
            # a removed lock's row is gone (no change to see): its sessions end too
            for sn in set(online) - existing(list(online)):
                self._revoke(lambda p, sn=sn: p.kind == "lock" and p.name == sn,
                             "lock removed", [sn])
        for sn, enabled, version in devices:
            if sn not in online and enabled:
                self.locks_out.pop(sn, None)
                continue
            if not enabled:
                fresh = sn not in self.locks_out
                self.locks_out[sn] = "lock disabled"
                if fresh:
                    self._revoke(lambda p, sn=sn: p.kind == "lock" and p.name == sn,
                                 "lock disabled", [sn])
                continue
            self.locks_out.pop(sn, None)

            # a re-key: the sessions under the old key stop standing (a new one is fine)
            def old_key(p: Any, sn: str = sn, version: int = version) -> bool:
                return p.kind == "lock" and p.name == sn and bool(p.key_version) \
                    and p.key_version != version
            if any(old_key(c.principal) for c in online.get(sn, ())):
                self._revoke(old_key, "lock re-keyed", [sn])

    def _sessions(self, matches: Callable[[Any], bool]) -> list[Any]:
        conns = getattr(self.connections, "by_id", {}) if self.connections is not None else {}
        return [c for c in list(conns.values())
                if c.principal is not None and not c.closed and matches(c.principal)]

    def _revoke(self, matches: Callable[[Any], bool], why: str, who: list[str]) -> None:
        """Close the live sessions of the principals ``matches`` picks; cancel what
        they left pending; log and count it."""
        closed = 0
        for conn in self._sessions(matches):
            conn.fatal(int(ErrorCode.AUTH_FAILED), f"session ended: {why}")
            closed += 1
        cancelled = 0
        for handler in self._handlers:
            try:
                cancelled += handler(matches, why)
            except Exception as exc:  # noqa: BLE001 -- the others still cancel
                self.log("revocation_cancel_failed", error=repr(exc), level="error")
        self.stats.inc("sessions_closed_revoked", closed)
        self.stats.inc("pending_cancelled_revoked", cancelled)
        self.log("principal_revoked", who=",".join(who)[:200], why=why,
                 sessions_closed=closed, pending_cancelled=cancelled, level="warning")
