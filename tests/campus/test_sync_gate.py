"""Sync replication has one gate between "durable here" and "acknowledged":
``core.after_durable``. Both ways of writing through the core pass it -- ``append``
(the broker's own records: a transaction's end, a scheduled delivery) and
``append_then`` (the publish path) -- so no caller can ack what the standby lacks.

The standby is played by its one op, ``replica.fetch``: its ``from`` is the
acknowledgement of everything before it."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from lockmq.protocol import Op, Publish, Role, encode_frame
from lockmq.store import NewRecord
from lockmq.testing import BrokerProcess, BrokerThread, open_peer, wait_for


def _record(seq: int) -> NewRecord:
    return NewRecord("ev", "gate-test", seq, 0, b"r%d" % seq)


def _fetch(b: BrokerThread, upto: int) -> dict[str, Any]:
    """The standby acknowledges ``upto`` (the log end it has durably)."""
    return b.call(lambda: b.broker.admin.ops["replica.fetch"]({"from": upto, "wait_ms": 0}))


def _status(b: BrokerThread) -> dict[str, Any]:
    return b.call(lambda: b.broker.admin.ops["replica.status"]({}))


def test_append_and_append_then_both_wait_for_the_standby(tmp_path) -> None:
    b = BrokerThread(str(tmp_path / "data"),
                     replication={"sync": True, "sync_timeout_s": 60.0})
    b.start()
    try:
        core = b.broker.core
        _fetch(b, b.call(lambda: core.store.log_end))   # caught up: acks now wait
        assert _status(b)["in_sync"]
        answered: list[str] = []

        def then(res: Any, err: BaseException | None) -> None:
            answered.append("append_then" if err is None and res else f"error {err!r}")

        async def own_record() -> None:
            await core.append([_record(1)])
            answered.append("append")

        b.call(lambda: core.append_then([_record(0)], then))
        b.call(lambda: core.spawn(own_record()))
        # both durable here, both held: neither has been answered
        wait_for(lambda: _status(b)["waiting"] == 2, "both writes held for the standby")
        assert answered == []
        _fetch(b, b.call(lambda: core.store.log_end))   # the standby has them
        wait_for(lambda: sorted(answered) == ["append", "append_then"], "both released")
        assert _status(b)["waiting"] == 0
    finally:
        b.stop()


def test_without_sync_append_then_answers_once_durable(tmp_path) -> None:
    """Async replication (the default) installs no gate: the store answers directly."""
    b = BrokerThread(str(tmp_path / "data"))
    b.start()
    try:
        core = b.broker.core
        assert core.after_durable is None
        done: asyncio.Future[Any] = b.call(lambda: asyncio.get_running_loop().create_future())
        b.call(lambda: core.append_then(
            [_record(0)], lambda res, err: done.set_result((len(res or []), err))))
        wait_for(done.done, "answered")
        assert done.result() == (1, None)
    finally:
        b.stop()


def test_a_stopping_primary_acks_what_waits_for_the_standby_at_once(tmp_path) -> None:
    """SIGTERM while a publish waits for a silent standby: the record is durable on
    the primary, so the publisher gets its PUBLISH_ACK at once -- as when the standby
    times out (``replication_degraded``) -- before the broker's DISCONNECT, not a
    DISCONNECT after ``shutdown_grace_s`` with no answer (nor an ack after
    ``sync_timeout_s``, here far longer than the grace)."""
    primary = BrokerProcess(str(tmp_path / "data"), {
        "broker": {"auth": "off", "shutdown_grace_s": 2.0},
        "replication": {"sync": True, "sync_timeout_s": 600.0}})
    try:
        standby = open_peer(primary.port, sn="standby", role=Role.ADMIN)

        def caught_up() -> bool:   # (the broker's own records may move the end meanwhile)
            end = standby.admin("replica.status")["log_end"]
            return standby.admin("replica.fetch", **{"from": end, "wait_ms": 0})["in_sync"]

        wait_for(caught_up, "the standby caught up: acks wait for it")
        pub = open_peer(primary.port, sn="LOCK-1", role=Role.LOCK)
        op = pub.next_opaque()
        pub.raw(encode_frame(Op.PUBLISH, "LOCK-1", Publish("ev", 0, 0, b"held").encode(), op))
        wait_for(lambda: standby.admin("replica.status")["waiting"] >= 1,
                 "the publish waits for the standby")
        mark = primary.mark()
        primary.proc.send_signal(signal.SIGTERM)
        frames = pub.wait_closed(timeout=30)
        assert [f.opcode for f in frames][:1] == [Op.PUBLISH_ACK], frames
        assert frames[0].opaque == op
        primary.wait_log(r"replication_released_on_shutdown.*held=[1-9]", start=mark)
        assert primary.stop() == 0
        standby.close()
        pub.close()
    finally:
        primary.stop()


def _held_own_write(b: BrokerThread, answered: list[str]) -> None:
    """Catch the standby up, then start a write of the broker's own that it holds."""
    core = b.broker.core
    wait_for(lambda: _fetch(b, b.call(lambda: core.store.log_end))["in_sync"],
             "the standby caught up")

    async def own_record() -> None:
        await core.append([_record(len(answered))])
        answered.append("append")

    b.call(lambda: core.spawn(own_record()))
    wait_for(lambda: _status(b)["waiting"] >= 1, "the write held for the standby")


def test_stopping_answers_the_brokers_own_write_held_for_the_standby(tmp_path) -> None:
    """A write of the broker's own through ``core.append`` (a transaction's end, a
    scheduled delivery) held for a silent standby is answered when the broker stops
    -- not left hanging past the grace while the store closes under it."""
    b = BrokerThread(str(tmp_path / "data"), broker={"shutdown_grace_s": 1.0},
                     replication={"sync": True, "sync_timeout_s": 600.0})
    b.start()
    answered: list[str] = []
    try:
        _held_own_write(b, answered)
    finally:
        b.stop()
    assert answered == ["append"]


def test_after_the_shutdown_release_nothing_waits_for_the_standby(tmp_path) -> None:
    """Once released for the shutdown, a standby that fetches again does not make
    acks wait for it: what the broker writes while stopping is answered at once."""
    b = BrokerThread(str(tmp_path / "data"),
                     replication={"sync": True, "sync_timeout_s": 600.0})
    b.start()
    try:
        core = b.broker.core
        answered: list[str] = []

        async def own_record() -> None:
            await core.append([_record(9)])
            answered.append("append")

        _held_own_write(b, answered)
        b.call(b.broker.replication.release_for_shutdown)
        wait_for(lambda: answered == ["append"], "released by the shutdown")
        # the standby fetches again: acks do not wait for it any more
        _fetch(b, b.call(lambda: core.store.log_end))
        assert not _status(b)["in_sync"]
        b.call(lambda: core.spawn(own_record()))
        wait_for(lambda: answered == ["append", "append"], "answered at once")
        assert _status(b)["waiting"] == 0
    finally:
        b.stop()
