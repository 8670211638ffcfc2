"""Transactional messages (RocketMQ's half messages with check-back; SPEC
"Transactional messages").

A TXN_PUBLISH stores a *half* record in the broker-internal topic
:data:`HALF_TOPIC` (no client may write a ``$sys.`` topic), with the real topic and
message id in its headers; its commit-log offset is the txn id. A commit stores the
real record under the producer's ``(sn, seq)`` (deduplicated like any publish, so a
commit repeated after a crash delivers once) and an op record in :data:`OP_TOPIC`,
in one append; a rollback stores only the op record. A half message to
:data:`COMMAND_TOPIC` carries a COMMAND, issued through ``Commands`` on commit. On start the
pending transactions are rebuilt from the two topics. A transaction left undecided
for ``check_after_s`` is checked back (TXN_CHECK) with a connection of its producer
group and principal, every ``check_interval_s``, at most ``max_checks`` times; then
``on_check_limit`` decides, and the log says so.

Rights are decided by the broker's one ``Admission``: when the half is stored, and
again when a commit takes effect, against the storing principal's token as it is
then (``tok`` header): a commit of a principal revoked meanwhile is written as a
rollback (``by = revoked``), and a revocation rolls back its pending transactions at
once; ``txn.list`` shows them (``recent_revoked``).

The four ``on_*`` handlers are this feature's part of the connection's dispatch
table (:meth:`Transactions.handlers`); they see a connection as a ``peer.Peer``.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from lockmq.config import TransactionsSection
from lockmq.protocol import ErrorCode, Flag, Op
from lockmq.protocol import Command, CommandResult, ProtocolError, PublishAck
from lockmq.protocol.txn import OUTCOME_NAMES, TxnCheck, TxnEnd, TxnJoin, TxnOutcome, TxnPublish
from lockmq.security import BrokerGuard, Principal, SecurityError
from lockmq.security.identity import owner_of
from lockmq.store import InvalidRecord, NewRecord, validate_topic

from .admission import Admission
from .commands import DetachedSender
from .core import BrokerCore, SystemSeq
from .logs import EventLog, Stats
from .peer import Handler, Peer
from .periodic import start_periodic, stop_task

#: half messages (broker-internal: the ``$sys.`` prefix keeps clients from writing it)
HALF_TOPIC = "$sys.txn.half"
#: commit / rollback op records, one per ended transaction
OP_TOPIC = "$sys.txn.op"
#: the producer id of half and op records: a system id (``$``: no client may use it,
#: the store never deduplicates it), numbered here so that a commit's record and its
#: op record go to the store in one append (one group commit)
TXN_SN = "$txn"
#: a half message to this topic is a COMMAND body: on commit it is issued to its lock
#: through the normal command path instead of being stored as a message
COMMAND_TOPIC = "$command"
#: outcomes of recently ended transactions kept for a repeated TXN_END
RECENT_ENDED = 10_000
#: groups one connection may join (TXN_JOIN / TXN_PUBLISH)
MAX_GROUPS_PER_CONN = 16
_RESP = Flag.RESPONSE


@dataclass
class Pending:
    """One undecided transaction."""

    txn_id: int
    topic: str
    sn: str
    seq: int
    lock_ts_ms: int
    payload: bytes
    group: str
    owner: str          # owner_of(principal) that stored it (a token's name): who may end it
    stored_ms: int      # broker wall time of the half record
    checks: int = 0
    next_check: float = 0.0   # monotonic
    ending: bool = False      # a commit/rollback is being written
    principal: Any = None     # who stored it (in memory only: a command's sender)
    tok: str = ""             # the token id it was stored with ("" before 0.4)

    def owner_principal(self) -> Any:
        """Who stored it, as far as the record knows (to match a revocation)."""
        return Principal(name=self.owner, kind="service", token_id=self.tok,
                         token_name=self.owner)

    def info(self) -> dict[str, Any]:
        """The admin view (``txn.list``)."""
        return {"txn_id": self.txn_id, "topic": self.topic, "msg_id": f"{self.sn}:{self.seq}",
                "group": self.group, "principal": self.owner, "stored_ms": self.stored_ms,
                "checks": self.checks, "bytes": len(self.payload)}


class TxnError(Exception):
    """A refused transactional request: the wire code and a message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Transactions:
    """The broker's transactions: pending half messages, their ends and check-backs."""

    def __init__(self, config: TransactionsSection, core: BrokerCore, guard: BrokerGuard,
                 stats: Stats, log: EventLog, commands: Any = None,
                 admission: Admission | None = None) -> None:
        self.cfg = config
        self.commands = commands   # broker/commands.py: where committed commands go
        self.core = core
        self.guard = guard
        #: the one rights decision (the command path's when there is one)
        self.admission = admission or getattr(commands, "admission", None) \
            or Admission(guard, stats, log)
        self.admission.on_revoked(self.cancel_principal)
        #: transactions rolled back because their principal was revoked (``txn.list``)
        self.revoked: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self.stats = stats
        self.log = log
        self.pending: dict[int, Pending] = {}
        self._by_msg: dict[tuple[str, int], int] = {}
        self._per_owner: Counter[str] = Counter()
        self._ended: OrderedDict[int, int] = OrderedDict()   # txn_id -> outcome
        self._groups: dict[str, set[Any]] = {}                # group -> connections
        #: connection -> the groups it joined (held weakly: gone with the connection)
        self._joined: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
        self._task: asyncio.Task[None] | None = None
        self._seq = SystemSeq()   # of TXN_SN (resumed from the store at start)

    # -- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        """Rebuild the pending transactions from the store, then start check-backs."""
        self.recover()
        c = self.cfg
        tick = max(0.02, min(1.0, c.check_after_s / 4, c.check_interval_s / 4))
        self._task = start_periodic("txn_checks", tick, self.check_due, self.log)

    async def stop(self) -> None:
        """Stop the check-back timer (pending transactions stay in the log)."""
        await stop_task(self._task)
        self._task = None

    def recover(self) -> None:
        """Pending = half records of the broker without an op record."""
        store = self.core.store
        assert store is not None
        self._seq = SystemSeq.after_last(store, TXN_SN)
        ended: dict[int, int] = {}
        for r in store.scan(OP_TOPIC):
            h = r.headers or {}
            if r.sn == TXN_SN and isinstance(h.get("txn_id"), int):
                ended[h["txn_id"]] = int(h.get("outcome", 0))
        now_ms = int(self.core.wall_ms())
        for r in store.scan(HALF_TOPIC):
            h = r.headers or {}
            if r.sn != TXN_SN or r.offset in ended or not isinstance(h.get("seq"), int):
                continue
            p = Pending(r.offset, str(h["topic"]), str(h["sn"]), h["seq"], r.lock_ts_ms,
                        r.payload, str(h["group"]), str(h["principal"]),
                        r.broker_ts_us // 1000, tok=str(h.get("tok", "")))
            age_s = max(0.0, (now_ms - p.stored_ms) / 1000)
            p.next_check = time.monotonic() + max(0.0, self.cfg.check_after_s - age_s)
            self._add(p)
        for txn_id, outcome in list(ended.items())[-RECENT_ENDED:]:
            self._ended[txn_id] = outcome
        if self.pending or ended:
            self.log("txn_recovered", pending=len(self.pending), ended=len(ended))

    # -- bookkeeping --------------------------------------------------------------------

    def _add(self, p: Pending) -> None:
        self.pending[p.txn_id] = p
        self._by_msg[(p.sn, p.seq)] = p.txn_id
        self._per_owner[p.owner] += 1

    def _remove(self, p: Pending, outcome: int) -> None:
        self.pending.pop(p.txn_id, None)
        self._by_msg.pop((p.sn, p.seq), None)
        self._per_owner[p.owner] -= 1
        if self._per_owner[p.owner] <= 0:
            del self._per_owner[p.owner]
        self._ended[p.txn_id] = outcome
        while len(self._ended) > RECENT_ENDED:
            self._ended.popitem(last=False)


    def join(self, conn: Peer, group: str) -> None:
        """``conn`` answers check-backs of ``group`` (its own principal's only)."""
        if not group or len(group) > 128:
            raise TxnError(ErrorCode.INVALID_ARGUMENT, "group must be 1..128 characters")
        joined = self._joined.get(conn)
        if joined is None:
            joined = self._joined[conn] = set()
        if group in joined:
            return
        if len(joined) >= MAX_GROUPS_PER_CONN:
            raise TxnError(ErrorCode.LIMIT_EXCEEDED,
                           f"a connection may join at most {MAX_GROUPS_PER_CONN} groups")
        joined.add(group)
        self._groups.setdefault(group, set()).add(conn)

    def handlers(self) -> dict[int, Handler]:
        """This feature's part of the dispatch table."""
        return {Op.TXN_PUBLISH: self.on_publish, Op.TXN_END: self.on_end,
                Op.TXN_CHECK_ANSWER: self.on_check_answer, Op.TXN_JOIN: self.on_join}

    # -- requests ---------------------------------------------------------------------

    def on_publish(self, conn: Peer, frame: Any) -> None:
        """TXN_PUBLISH: store the half message, answer TXN_PUBLISH_ACK(txn_id)."""
        body = TxnPublish.decode(frame.body)
        principal = conn.principal
        sn = frame.sn or principal.name
        try:
            validate_topic(body.topic)
            if body.topic == COMMAND_TOPIC:   # the rights of the command it carries
                cmd = Command.decode(body.payload)
                self.admission.check_command(principal, cmd.target, cmd.kind, cmd.args)
            else:
                self.admission.check_publish(principal, body.topic, n=1)
            conn.check_producer_id(sn)
            self.join(conn, body.group)
        except (InvalidRecord, ProtocolError) as exc:   # a bad topic or command body
            conn.send_error(ErrorCode.INVALID_ARGUMENT, str(exc), frame.opaque)
            return
        except SecurityError as exc:
            self.stats.inc("txn_refused")
            conn.refused(exc, frame.opaque)
            return
        except TxnError as exc:
            conn.send_error(exc.code, exc.message, frame.opaque)
            return
        known = self._by_msg.get((sn, body.seq))
        if known is not None:   # a retried half: same transaction
            conn.send_frame(Op.TXN_PUBLISH_ACK, PublishAck(PublishAck.DUPLICATE, known).encode(),
                            frame.opaque, _RESP)
            return
        c = self.cfg
        owner = owner_of(principal)
        # per principal, and of the broker-wide cap all but the admins' reserve
        if self._per_owner[owner] >= c.max_pending_per_principal \
                or len(self.pending) >= self.admission.share(c.max_pending_total, principal):
            self.stats.inc("txn_limit_exceeded")
            self.log.limited("txn_limit_exceeded", principal=owner,
                             pending=self._per_owner[owner], level="warning")
            conn.send_error(ErrorCode.LIMIT_EXCEEDED,
                            f"too many undecided transactions (at most "
                            f"{c.max_pending_per_principal} per principal, "
                            f"{c.max_pending_total} in all): commit or roll back first",
                            frame.opaque)
            return
        headers = {"topic": body.topic, "sn": sn, "seq": body.seq, "group": body.group,
                   "principal": owner, "tok": getattr(principal, "token_id", "")}
        half = NewRecord(HALF_TOPIC, TXN_SN, self._seq.take(), body.lock_ts_ms, body.payload,
                         headers)
        self.core.spawn(self._store_half(conn, frame.opaque, half, body, sn))

    async def _store_half(self, conn: Peer, opaque: int, half: NewRecord, body: TxnPublish,
                          sn: str) -> None:
        try:
            res = await self.core.append([half])
        except Exception as exc:  # noqa: BLE001 -- StoreBusy, closed ...: never ack
            conn.send_error(ErrorCode.BUSY, f"half message not stored: {exc}", opaque, 100)
            return
        p = Pending(res[0].offset, body.topic, sn, body.seq, body.lock_ts_ms, body.payload,
                    body.group, owner_of(conn.principal), int(self.core.wall_ms()))
        p.next_check = time.monotonic() + self.cfg.check_after_s
        p.principal = conn.principal
        p.tok = str(half.headers.get("tok", "")) if half.headers else ""
        self._add(p)
        self.stats.inc("txn_half_stored")
        conn.send_frame(Op.TXN_PUBLISH_ACK, PublishAck(PublishAck.STORED, p.txn_id).encode(),
                        opaque, _RESP)

    def on_end(self, conn: Peer, frame: Any) -> None:
        """TXN_END: commit or roll back; OK once durable."""
        body = TxnEnd.decode(frame.body)
        if body.outcome == TxnOutcome.UNKNOWN:
            conn.send_error(ErrorCode.INVALID_ARGUMENT, "TXN_END needs commit (1) or rollback (2)",
                            frame.opaque)
            return
        self._decide(conn, body.txn_id, body.outcome, "producer", frame.opaque)

    def on_check_answer(self, conn: Peer, frame: Any) -> None:
        """TXN_CHECK_ANSWER: as TXN_END (never answered); UNKNOWN waits for the next check."""
        body = TxnEnd.decode(frame.body)
        if body.outcome == TxnOutcome.UNKNOWN:
            self.stats.inc("txn_check_unknown")
            return
        self._decide(conn, body.txn_id, body.outcome, "check", None)

    def on_join(self, conn: Peer, frame: Any) -> None:
        """TXN_JOIN: this connection answers the group's check-backs; OK."""
        try:
            self.join(conn, TxnJoin.decode(frame.body).group)
        except TxnError as exc:
            conn.send_error(exc.code, exc.message, frame.opaque)
            return
        conn.send_frame(Op.OK, b"", frame.opaque, _RESP)

    def _decide(self, conn: Peer, txn_id: int, outcome: int, by: str, opaque: int | None) -> None:
        try:
            p = self._owned(conn.principal, txn_id, outcome)
        except TxnError as exc:
            self.stats.inc("txn_refused")
            if opaque is not None:
                conn.send_error(exc.code, exc.message, opaque)
            return
        if p is None:   # already ended this way: a retried TXN_END
            if opaque is not None:
                conn.send_frame(Op.OK, b"", opaque, _RESP)
            return
        p.ending = True

        if conn.principal is not None:
            p.principal = conn.principal   # (after a restart: the committing producer's)

        async def run() -> None:
            try:
                await self.end(p, outcome, by)
            except Exception as exc:  # noqa: BLE001 -- not durable: the producer retries
                if opaque is not None:
                    conn.send_error(ErrorCode.BUSY, f"transaction not ended: {exc}", opaque, 100)
                return
            if opaque is None:
                return
            if outcome == TxnOutcome.COMMIT and txn_id in self.revoked:
                conn.send_error(ErrorCode.FORBIDDEN, "not committed: rolled back, the "
                                "credential that stored it was revoked", opaque)
            else:
                conn.send_frame(Op.OK, b"", opaque, _RESP)
        self.core.spawn(run())

    def _owned(self, principal: Any, txn_id: int, outcome: int) -> Pending | None:
        """The pending transaction ``principal`` may end; None if already ended so."""
        p = self.pending.get(txn_id)
        if p is None:
            done = self._ended.get(txn_id)
            if done == outcome:
                return None
            if done is None:
                raise TxnError(ErrorCode.INVALID_ARGUMENT, f"unknown transaction {txn_id}")
            raise TxnError(ErrorCode.INVALID_ARGUMENT,
                           f"transaction {txn_id} already ended: {OUTCOME_NAMES[done]}")
        if p.owner != owner_of(principal) and not principal.is_admin:
            raise TxnError(ErrorCode.FORBIDDEN,
                           f"transaction {txn_id} belongs to another principal")
        if p.ending:
            raise TxnError(ErrorCode.BUSY, f"transaction {txn_id} is being ended")
        return p

    # -- ending -----------------------------------------------------------------------

    async def end(self, p: Pending, outcome: int, by: str) -> None:
        """Write the outcome durably: the record (commit), then the op record, in one
        append. Should a crash keep the record and lose the op record, the transaction
        is pending again after restart; its next commit is then taken as a duplicate
        of the stored record and delivers nothing new."""
        p.ending = True   # (callers set it before spawning this, too)
        if outcome == TxnOutcome.COMMIT and p.topic != COMMAND_TOPIC:
            # the storing principal's rights as they are now (a command's: the command
            # path checks them when it issues it)
            why = self._refused_now(p)
            if why:
                outcome, by = TxnOutcome.ROLLBACK, "revoked"
                self._note_revoked(p, why)
        try:
            op = NewRecord(OP_TOPIC, TXN_SN, self._seq.take(), 0, b"",
                           {"txn_id": p.txn_id, "outcome": outcome, "by": by})
            records = [op]
            if outcome == TxnOutcome.COMMIT and p.topic != COMMAND_TOPIC:
                records.insert(0, NewRecord(p.topic, p.sn, p.seq, p.lock_ts_ms, p.payload))
            await self.core.append(records)
        finally:
            p.ending = False
        self._remove(p, outcome)
        if outcome == TxnOutcome.COMMIT and p.topic == COMMAND_TOPIC:
            self._issue_command(p)
        name = OUTCOME_NAMES[outcome]
        self.stats.inc("txn_committed" if outcome == TxnOutcome.COMMIT else "txn_rolled_back")
        self.log("txn_end", txn_id=p.txn_id, outcome=name, by=by, topic=p.topic,
                 msg_id=f"{p.sn}:{p.seq}", checks=p.checks,
                 level="warning" if by == "check_limit" else "debug")

    def _refused_now(self, p: Pending) -> str:
        """Why ``p``'s message may not be committed now ("" if it may)."""
        a = self.admission
        principal = a.principal_of(p.tok, p.owner, p.owner, False) if p.tok else p.principal
        if principal is None:     # (after a restart, stored before token ids were kept)
            principal = a.principal_of("", p.owner, p.owner, False)
        try:
            a.check_publish(principal, p.topic, n=1, fresh=True)
        except SecurityError as exc:
            return str(exc)
        return ""

    def _note_revoked(self, p: Pending, why: str) -> None:
        self.revoked[p.txn_id] = {"txn_id": p.txn_id, "topic": p.topic, "principal": p.owner,
                                  "msg_id": f"{p.sn}:{p.seq}", "why": why[:200]}
        while len(self.revoked) > 200:
            self.revoked.popitem(last=False)
        self.stats.inc("txn_rolled_back_revoked")
        self.log("txn_revoked", txn_id=p.txn_id, topic=p.topic, principal=p.owner,
                 why=why[:200], level="warning")

    def cancel_principal(self, matches: Callable[[Any], bool], why: str) -> int:
        """A revocation (``Admission``): roll back the pending transactions of the
        principals ``matches`` picks (in the background). Returns how many."""
        mine = [p for p in self.pending.values() if not p.ending and (
            matches(p.owner_principal()) or (p.principal is not None and matches(p.principal)))]
        for p in mine:
            p.ending = True
            self._note_revoked(p, why)
            self.core.spawn(self.end(p, TxnOutcome.ROLLBACK, "revoked"))
        return len(mine)

    def _issue_command(self, p: Pending) -> None:
        """A committed transactional command goes the normal command path (rights,
        caps, queue while the lock is offline, expiry); its result is logged."""
        sender = CommandSender(p.principal, p.txn_id, self.stats, self.log)
        if p.principal is None or self.commands is None:
            sender.send_error(ErrorCode.INTERNAL, "committed by the broker after a restart "
                              "with no producer connected: not issued", 0)
            return
        self.stats.inc("txn_commands_issued")
        self.commands.submit(sender, 0, Command.decode(p.payload))

    async def resolve(self, txn_id: int, outcome: int) -> dict[str, Any]:
        """An operator's decision (``txn.resolve``)."""
        p = self.pending.get(txn_id)
        if p is None or p.ending:
            return {"ok": False, "error": "INVALID_ARGUMENT",
                    "message": f"no pending transaction {txn_id}"}
        p.ending = True
        await self.end(p, outcome, "operator")
        return {"ok": True, "txn_id": txn_id, "outcome": OUTCOME_NAMES[outcome]}

    # -- check-back -------------------------------------------------------------------

    def check_due(self) -> None:
        """Check back every transaction whose time has come (the periodic timer)."""
        now = time.monotonic()
        limit = self.cfg.max_checks
        for p in list(self.pending.values()):
            if p.ending or p.next_check > now:
                continue
            p.next_check = now + self.cfg.check_interval_s
            if p.checks >= limit:
                outcome = TxnOutcome.COMMIT if self.cfg.on_check_limit == "commit" \
                    else TxnOutcome.ROLLBACK
                self.stats.inc("txn_check_limit")
                p.ending = True
                self.core.spawn(self.end(p, outcome, "check_limit"))
                continue
            conn = self._producer_of(p)
            p.checks += 1   # a check with no producer online counts too (RocketMQ's)
            if conn is None:
                self.stats.inc("txn_check_no_producer")
                continue
            self.stats.inc("txn_checks_sent")
            headers = json.dumps({"checks": p.checks}, separators=(",", ":"))
            conn.send_frame(Op.TXN_CHECK, TxnCheck(p.txn_id, p.topic, p.sn, p.seq, headers,
                                                   p.payload).encode())

    def _producer_of(self, p: Pending) -> Any:
        """A live connection of the group with the transaction's owner or an admin
        (any one: a producer restarted under another id with the same token answers)."""
        conns = self._groups.get(p.group)
        if not conns:
            return None
        for c in list(conns):
            if not c.established:
                conns.discard(c)   # closed: forget it here
                continue
            pr = c.principal
            if pr is not None and (owner_of(pr) == p.owner or pr.is_admin):
                return c
        if not conns:
            del self._groups[p.group]
        return None

    # -- operators --------------------------------------------------------------------

    def admin_list(self, args: dict[str, Any]) -> dict[str, Any]:
        """``txn.list``: the pending transactions (oldest first, at most ``limit``)."""
        limit = args.get("limit", 1000)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit <= 10_000:
            return {"ok": False, "error": "INVALID_ARGUMENT",
                    "message": "limit must be an integer in [1, 10000]"}
        items = sorted(self.pending.values(), key=lambda p: p.txn_id)[:limit]
        return {"ok": True, "count": len(self.pending), "transactions": [p.info() for p in items],
                "recent_revoked": list(self.revoked.values())}

    def admin_resolve(self, args: dict[str, Any]) -> Any:
        """``txn.resolve``: ``{"txn_id": N, "outcome": "commit"|"rollback"}``."""
        txn_id, outcome = args.get("txn_id"), args.get("outcome")
        if not isinstance(txn_id, int) or outcome not in ("commit", "rollback"):
            return {"ok": False, "error": "INVALID_ARGUMENT",
                    "message": "txn_id (an integer) and outcome (commit|rollback) are required"}
        return self.resolve(txn_id, TxnOutcome.COMMIT if outcome == "commit"
                            else TxnOutcome.ROLLBACK)


class CommandSender(DetachedSender):
    """The sender of a committed transactional command, for ``Commands.submit``: the
    producer may be gone, so the lock's result (or a refusal) is logged and counted."""

    def __init__(self, principal: Any, txn_id: int, stats: Stats, log: EventLog) -> None:
        super().__init__(principal)
        self.txn_id = txn_id
        self.stats = stats
        self.log = log

    def result(self, res: CommandResult) -> None:
        self.stats.inc("txn_command_results")
        self.log("txn_command_result", txn_id=self.txn_id, target=res.target,
                 cmd_id=res.cmd_id, status=res.status, detail=res.detail)

    def failed(self, code: int, message: str) -> None:
        self.stats.inc("txn_commands_refused")
        self.log("txn_command_refused", txn_id=self.txn_id, code=code, message=message,
                 level="warning")
