"""Transactional messages: a database change and a message, both or neither
(RocketMQ's ``TransactionMQProducer``; SPEC "Transactional messages").

:meth:`TransactionProducer.send` stores a *half* message that no consumer sees,
runs your ``local_transaction(msg, arg)`` (your database change), then commits the
message when it returns ``COMMIT`` (or True) and rolls it back on ``ROLLBACK`` (or
False). ``UNKNOWN`` (or an exception: the database may or may not have committed)
leaves the decision to the check-back: after ``[transactions] check_after_s`` the
broker asks a connected producer of the same group (and token) what became of it,
and ``check(msg)`` answers from the database. A producer that crashed between the
two steps is thus covered by the next one that starts with the same group.

:func:`idempotent_transaction` builds both callbacks on the idempotency helper:
the message id is marked in the same database transaction as the change, and the
check-back reads the mark::

    idem = idempotency_store("grants.db")

    def grant(conn, msg, card):
        conn.execute("INSERT INTO grants VALUES (?, ?)", (card, msg.id))

    local, check = idempotent_transaction(idem, grant)
    async with TransactionProducer("broker:6800", group="card-grants",
                                   local_transaction=local, check=check) as tp:
        await tp.send("cards.granted", b"...", arg="0a1b2c3d")

Sync callbacks run in a worker thread (they do database I/O); coroutine functions
are awaited on the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Union

from lockmq.protocol import Command, ConnectAck, Flag, Op, PublishAck, Role
from lockmq.protocol.txn import OUTCOME_NAMES, TxnCheck, TxnEnd, TxnJoin, TxnOutcome, TxnPublish

from ._base import SessionClient, default_client_id
from ._conn import FrameConnection
from .session import Credentials, Endpoint, error_from_body

#: the broker's topic for transactional commands (broker/transactions.py)
COMMAND_TOPIC = "$command"
COMMIT = TxnOutcome.COMMIT
ROLLBACK = TxnOutcome.ROLLBACK
UNKNOWN = TxnOutcome.UNKNOWN

#: what a callback may return: an outcome, or True (commit) / False (rollback)
Decision = Union[int, bool, None]


@dataclass(frozen=True)
class TxnMessage:
    """The message of a transaction, as the callbacks see it.

    Attributes:
        id: ``producer_id:seq``, the id consumers will see (idempotency key).
        topic: where it is delivered once committed.
        payload: its bytes.
        txn_id: the broker's transaction id (0 before the half message is stored).
        checks: which check-back this is (0 in the local transaction).
    """

    id: str
    topic: str
    payload: bytes
    txn_id: int = 0
    checks: int = 0


@dataclass(frozen=True)
class TxnResult:
    """What :meth:`TransactionProducer.send` did."""

    message_id: str
    txn_id: int
    outcome: str   # "commit", "rollback" or "unknown" (left to the check-back)


def _outcome(decision: Decision) -> int:
    if decision is True:
        return COMMIT
    if decision is False:
        return ROLLBACK
    if decision in (COMMIT, ROLLBACK, UNKNOWN):
        return int(decision)   # type: ignore[arg-type]
    if decision is None:
        return UNKNOWN
    raise ValueError(f"a transaction callback returned {decision!r}: "
                     "use COMMIT, ROLLBACK, UNKNOWN, True or False")


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    out = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(out):
        out = await out
    return out


class TransactionProducer(SessionClient):
    """Send messages that are delivered only if a local transaction committed.

    Args:
        endpoint: the broker.
        group: the producer group; every producer of the group (with the same
            token) answers the group's check-backs.
        local_transaction: ``fn(msg: TxnMessage, arg) -> Decision``.
        check: ``fn(msg: TxnMessage) -> Decision``: what became of the local
            transaction of ``msg`` (it may have run in a producer that crashed).
        producer_id: the SN of this producer's messages (default: unique per
            instance, so sequence numbers from 0 never collide with an earlier run).
        token / credentials: authentication.
        request_timeout_s: how long to wait for the broker's answer to a request.
    """

    def __init__(self, endpoint: Endpoint | str | list[Endpoint] = "127.0.0.1:6800", *, group: str,
                 local_transaction: Callable[[TxnMessage, Any], Decision | Awaitable[Decision]],
                 check: Callable[[TxnMessage], Decision | Awaitable[Decision]],
                 producer_id: str | None = None, token: str | None = None,
                 credentials: Credentials | None = None, request_timeout_s: float = 30.0,
                 start_seq: int = 0) -> None:
        super().__init__(endpoint, client_id=producer_id or default_client_id(group),
                         role=Role.SERVICE, credentials=credentials, token=token)
        self.group = group
        self.producer_id = self.client_id
        self.local_transaction = local_transaction
        self.check = check
        self.request_timeout_s = request_timeout_s
        self._seq = start_seq
        self.stats = {"sent": 0, "committed": 0, "rolled_back": 0, "unknown": 0,
                      "checks": 0}

    async def send(self, topic: str, payload: bytes, arg: Any = None,
                   lock_ts_ms: int = 0) -> TxnResult:
        """Store the half message, run the local transaction, end the transaction.

        An exception of ``local_transaction`` is re-raised after the transaction was
        left to the check-back (the database may have committed before it)."""
        seq = self._seq
        self._seq = (seq + 1) & 0xFFFFFFFF
        msg_id = f"{self.producer_id}:{seq}"
        frame = await self._request(Op.TXN_PUBLISH, TxnPublish(self.group, topic, seq, lock_ts_ms,
                                                                bytes(payload)).encode())
        txn_id = PublishAck.decode(frame.body).offset   # the half record's offset
        self.stats["sent"] += 1
        msg = TxnMessage(msg_id, topic, bytes(payload), txn_id)
        try:
            outcome = _outcome(await _call(self.local_transaction, msg, arg))
        except BaseException:
            self.stats["unknown"] += 1
            raise
        if outcome == UNKNOWN:
            self.stats["unknown"] += 1
        else:
            await self.end(txn_id, outcome)
        return TxnResult(msg_id, txn_id, OUTCOME_NAMES[outcome])

    async def send_command(self, target: str, kind: int, args: bytes = b"", arg: Any = None,
                           expires_in_s: float = 60.0) -> TxnResult:
        """A transactional COMMAND to lock ``target`` (a ``CommandKind``): issued
        through the broker's normal command path only if the local transaction
        commits. The lock's result is logged by the broker (``txn_command_result``),
        not returned here: the producer may be gone by then."""
        expires_ms = int((time.time() + expires_in_s) * 1000)
        return await self.send(COMMAND_TOPIC, Command(target, 0, expires_ms, kind,
                                                      bytes(args)).encode(), arg)

    async def end(self, txn_id: int, outcome: int) -> None:
        """Commit or roll back transaction ``txn_id`` (done by :meth:`send`)."""
        await self._request(Op.TXN_END, TxnEnd(txn_id, outcome).encode())
        self.stats["committed" if outcome == COMMIT else "rolled_back"] += 1

    async def _request(self, opcode: int, body: bytes) -> Any:
        frame = await asyncio.wait_for(self._require_conn().request(opcode, body),
                                       self.request_timeout_s)
        if frame.opcode == Op.ERROR:
            raise error_from_body(frame.body)
        return frame

    async def _on_connected(self, conn: FrameConnection, ack: ConnectAck) -> None:
        # join the group at once: check-backs of a crashed producer come here
        frame = await asyncio.wait_for(conn.request(Op.TXN_JOIN, TxnJoin(self.group).encode()),
                                       self.request_timeout_s)
        if frame.opcode == Op.ERROR:
            raise error_from_body(frame.body)

    def _on_frame(self, frame: Any) -> None:
        if frame.opcode == Op.TXN_CHECK:
            self._spawn(self._answer_check(TxnCheck.decode(frame.body)))

    async def _answer_check(self, chk: TxnCheck) -> None:
        checks = 0
        if chk.headers:
            try:
                checks = int(json.loads(chk.headers).get("checks", 0))
            except (ValueError, AttributeError):
                pass
        msg = TxnMessage(f"{chk.sn}:{chk.seq}", chk.topic, chk.payload, chk.txn_id, checks)
        self.stats["checks"] += 1
        try:
            outcome = _outcome(await _call(self.check, msg))
        except Exception:  # noqa: BLE001 -- undecided: the broker asks again
            outcome = UNKNOWN
        conn = self.conn
        if conn is not None and conn.is_open:
            conn.send(Op.TXN_CHECK_ANSWER, TxnEnd(chk.txn_id, outcome).encode(), 0,
                      Flag.ONEWAY)

    async def __aenter__(self) -> "TransactionProducer":
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def idempotent_transaction(idem: Any, work: Callable[[Any, TxnMessage, Any], Any]) -> tuple[
        Callable[[TxnMessage, Any], Decision], Callable[[TxnMessage], Decision]]:
    """``(local_transaction, check)`` on an idempotency store (SQLite/PostgreSQL).

    The local transaction runs ``work(conn, msg, arg)`` and marks ``msg.id`` as
    processed in the same database transaction (both or neither), then commits the
    message; the check-back commits it exactly when the mark is there. Set
    ``[transactions] check_after_s`` above your longest local transaction: a check
    that comes while it still runs sees no mark and rolls the message back."""
    def local_transaction(msg: TxnMessage, arg: Any) -> Decision:
        with idem.transaction(msg.id) as tx:
            if not tx.duplicate:
                work(tx.conn, msg, arg)
        return COMMIT

    def check(msg: TxnMessage) -> Decision:
        return COMMIT if idem.is_processed(msg.id) else ROLLBACK

    return local_transaction, check
