"""Downlink commands through simulated locks, per-lock ordering, BUSY handling."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from lockmq.client import AsyncConsumer, AsyncProducer, CommandError
from lockmq.client.session import Endpoint
from lockmq.protocol import (
    Challenge,
    CommandKind,
    ConnectAck,
    ErrorCode,
    ErrorReply,
    Flag,
    FrameDecoder,
    NO_SEQ,
    Op,
    PublishAck,
    encode_frame,
)
from lockmq.sim import SimConfig, SimStats, run_sim


def test_command_reaches_a_lock_and_offline_lock_expires(broker):
    async def main():
        stats = SimStats()
        stop = asyncio.Event()
        cfg = SimConfig(locks=3, events_per_lock=None, rate_per_lock=2, stay_connected=True)
        sim = asyncio.ensure_future(run_sim(cfg, Endpoint("127.0.0.1", broker.port), stop=stop,
                                            stats=stats))
        while stats.connected < 3:
            await asyncio.sleep(0.01)
        async with AsyncProducer(broker.address, name="door-service") as svc:
            ok = await svc.command("SIM-000002", CommandKind.UNLOCK, (7).to_bytes(2, "big"),
                                   expires_in_s=10)
            with pytest.raises(CommandError) as err:
                await svc.command("GHOST-000001", CommandKind.UNLOCK, b"\x00\x05",
                                  expires_in_s=0.3, timeout_s=15)
        stop.set()
        await sim
        return ok, err.value, stats

    ok, err, stats = asyncio.run(main())
    assert ok.ok and ok.target == "SIM-000002" and "7 s" in ok.detail
    assert err.reason in ("offline", "expired", "lock_offline", "command_expired")
    assert stats.commands == 1


def test_per_lock_ordering_never_runs_two_of_one_lock_at_once(broker):
    # One producer id per "lock": the broker orders by the message's SN.
    async def publish_and_consume():
        for lock in range(5):
            async with AsyncProducer(broker.address, producer_id=f"LOCK-{lock}") as p:
                await asyncio.gather(*[p.send_async("ordered2", b"L%d:%d" % (lock, i))
                                       for i in range(40)])
        active: set[str] = set()
        overlaps: list[str] = []
        order: dict[str, list[int]] = {}

        async def handler(msg):
            if msg.sn in active:
                overlaps.append(msg.id)
            active.add(msg.sn)
            await asyncio.sleep(0.002)
            order.setdefault(msg.sn, []).append(msg.seq)
            active.discard(msg.sn)

        c = AsyncConsumer(broker.address, topic="ordered2", cluster="seq", handler=handler,
                          min_workers=8, max_workers=8, ordered=True)
        await c.start()
        deadline = time.monotonic() + 30
        while sum(len(v) for v in order.values()) < 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await c.stop()
        return overlaps, order

    overlaps, order = asyncio.run(publish_and_consume())
    assert overlaps == []
    assert sorted(order) == [f"LOCK-{i}" for i in range(5)]
    for sn, seqs in order.items():
        assert seqs == list(range(40)), sn


class _BusyOnceServer(asyncio.Protocol):
    """A scripted peer on a real socket: handshake, BUSY for the first publish, then acks."""

    busy_sent = 0

    def connection_made(self, transport):
        self.t = transport
        self.dec = FrameDecoder(1 << 20)

    def data_received(self, data):
        self.dec.feed(data)
        for f in self.dec.frames():
            if f.opcode == Op.CONNECT:
                body = Challenge(os.urandom(16), int(time.time() * 1000)).encode()
                self.t.write(encode_frame(Op.CHALLENGE, "", body, f.opaque, Flag.RESPONSE))
            elif f.opcode == Op.AUTH:
                body = ConnectAck(30, 1 << 20, int(time.time() * 1000), NO_SEQ, 1).encode()
                self.t.write(encode_frame(Op.CONNECT_ACK, "", body, f.opaque, Flag.RESPONSE))
            elif f.opcode == Op.PUBLISH:
                if _BusyOnceServer.busy_sent == 0:
                    _BusyOnceServer.busy_sent += 1
                    body = ErrorReply(ErrorCode.BUSY, "busy, retry", 50).encode()
                    self.t.write(encode_frame(Op.ERROR, "", body, f.opaque, Flag.RESPONSE))
                else:
                    body = PublishAck(0, 7).encode()
                    self.t.write(encode_frame(Op.PUBLISH_ACK, "", body, f.opaque, Flag.RESPONSE))


def test_busy_answer_is_retried_after_the_hint():
    async def main():
        server = await asyncio.get_running_loop().create_server(_BusyOnceServer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with AsyncProducer(f"127.0.0.1:{port}") as p:
            r = await p.send("t", b"x")
        server.close()
        return r, p.stats

    r, stats = asyncio.run(main())
    assert r.offset == 7 and stats["busy_retries"] == 1 and stats["acked"] == 1


def test_command_waiting_for_an_offline_lock_is_delivered_when_it_connects(broker):
    """The broker sends a held command right behind CONNECT_ACK: the lock must not
    lose it in its handshake."""
    from lockmq.client import AsyncAdmin

    async def main():
        async with AsyncProducer(broker.address, name="door-service") as svc:
            cmd = asyncio.ensure_future(svc.command("SIM-000001", CommandKind.UNLOCK,
                                                    b"\x00\x02", expires_in_s=20))
            async with AsyncAdmin(broker.address) as admin:
                for _ in range(500):
                    if (await admin.request("commands")).get("total_queued"):
                        break
                    await asyncio.sleep(0.01)
            stats = SimStats()
            stop = asyncio.Event()
            cfg = SimConfig(locks=1, events_per_lock=None, rate_per_lock=1,
                            stay_connected=True)
            sim = asyncio.ensure_future(run_sim(cfg, Endpoint("127.0.0.1", broker.port),
                                                stop=stop, stats=stats))
            out = await cmd
            stop.set()
            await sim
            return out, stats

    out, stats = asyncio.run(main())
    assert out.ok and "2 s" in out.detail
    assert stats.commands == 1
