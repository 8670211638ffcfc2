"""The campus registry (issue #16): register, lookup, eviction, caps, auth, restarts."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import pytest

from lockmq.client import AdminError, AuthError, Producer
from lockmq.clock import ManualClock
from lockmq.client.registry import registry_request
from lockmq.registry.server import RegistryServer
from lockmq.protocol import FrameDecoder, Op
from lockmq.testing import raises, read_until_closed, signal_until_exit, wait_for, wait_for_async

from .helpers import TOKEN, RegistryProcess, gateway, names, request


def decode_frames(data: bytes) -> list[int]:
    """The opcodes of the whole frames in ``data``."""
    dec = FrameDecoder()
    dec.feed(data)
    return [f.opcode for f in dec.frames()]


def test_a_silent_gateway_is_evicted_after_evict_after_s_and_must_register_again() -> None:
    clock = ManualClock()

    async def scenario() -> None:
        server = RegistryServer(tokens=[TOKEN.encode()], clock=clock, evict_after_s=120,
                                sweep_s=0.02)
        await server.start()
        reg = f"127.0.0.1:{server.port}"

        async def lookup() -> list[str]:
            reply = await registry_request(reg, "registry.lookup", token=TOKEN, topic="t")
            return [g["name"] for g in reply["gateways"]]

        try:
            await registry_request(reg, "registry.register", token=TOKEN, name="gw-a",
                                   addresses=["127.0.0.1:1"], topics=["t"])
            await registry_request(reg, "registry.register", token=TOKEN, name="gw-b",
                                   addresses=["127.0.0.1:2"], topics=["t"])
            clock.advance(100_000)
            await registry_request(reg, "registry.heartbeat", token=TOKEN, name="gw-b")
            clock.advance(21_000)   # gw-a silent 121 s, gw-b 21 s
            await wait_for_async(lambda: server.stats["evicted"] == 1, "gw-a evicted")
            assert await lookup() == ["gw-b"]
            with pytest.raises(AdminError, match="UNKNOWN_GATEWAY"):
                await registry_request(reg, "registry.heartbeat", token=TOKEN, name="gw-a")
            await registry_request(reg, "registry.register", token=TOKEN, name="gw-a",
                                   addresses=["127.0.0.1:1"], topics=["t"])
            assert await lookup() == ["gw-a", "gw-b"]
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_lookup_by_topic_and_building_caps_and_a_bad_token(tmp_path) -> None:
    reg = RegistryProcess(tmp_path / "reg", ["--max-gateways", "2", "--max-topics", "3"])
    with reg:
        addr = reg.address
        request(addr, "registry.register", name="north-1", building="north",
                addresses=["10.0.0.1:6800"], topics=["lock.events", "audit"])
        request(addr, "registry.register", name="south-1", building="south",
                addresses=["10.0.0.2:6800"], topics=["lock.events"], role="standby")
        assert names(addr, topic="lock.events") == ["north-1", "south-1"]
        assert names(addr, topic="audit") == ["north-1"]
        assert names(addr, building="south") == ["south-1"]
        assert names(addr, topic="nothing") == []
        # caps: one gateway too many, one topic too many; the registry keeps serving
        with pytest.raises(AdminError, match="LIMIT_EXCEEDED"):
            request(addr, "registry.register", name="east-1", addresses=["10.0.0.3:6800"])
        with pytest.raises(AdminError, match="LIMIT_EXCEEDED"):
            request(addr, "registry.register", name="north-1", addresses=["10.0.0.1:6800"],
                    topics=["a", "b", "c", "d"])
        with pytest.raises(AdminError, match="INVALID_ARGUMENT"):
            request(addr, "registry.register", name="bad name", addresses=["x:1"])
        # a wrong token or none is refused before any op runs
        raises(AuthError, lambda: request(addr, "registry.list", token="campus.wrong"))
        raises(AuthError, lambda: request(addr, "registry.list", token=None))
        # garbage gets one ERROR and a closed connection; the registry keeps serving
        with socket.create_connection(("127.0.0.1", reg.port)) as junk:
            junk.sendall(b"GET / HTTP/1.0\r\n\r\n" * 4)
            answer = read_until_closed(junk, 10)
        assert Op.ERROR in decode_frames(answer)   # one ERROR, then the registry hangs up
        listed = request(addr, "registry.list")
        assert [g["name"] for g in listed["gateways"]] == ["north-1", "south-1"]
        assert listed["stats"]["auth_failed"] == 2
        assert reg.running()


def test_a_gateway_registers_on_start_and_again_after_the_registry_lost_its_state(tmp_path) -> None:
    reg = RegistryProcess(tmp_path / "reg")
    with reg, gateway(tmp_path / "gw" / "data", reg.address, "gw-north") as gw:
        wait_for(lambda: names(reg.address) == ["gw-north"], "gateway registered")
        [info] = request(reg.address, "registry.list")["gateways"]
        assert info["addresses"] == [gw.address] and info["building"] == "gw-north"
        assert info["role"] == "primary"           # a serving gateway: never "standby"
        with Producer(gw.address) as p:
            p.send_sync("lock.events", b"hello")
        # its topics reach the registry with the next heartbeat
        wait_for(lambda: names(reg.address, topic="lock.events") == ["gw-north"],
                 "topic announced")
        # the registry crashes and comes back with no state at all
        reg.kill()
        gw.wait_log(r"registry_unreachable")
        os.remove(reg.workdir / "registry.json")
        reg.start()
        wait_for(lambda: names(reg.address, topic="lock.events") == ["gw-north"],
                 "gateway registered again")
        # one warning per outage, not one per retry
        assert sum("registry_unreachable" in line for line in gw.lines) == 1
        assert gw.running()


def test_a_live_gateway_the_registry_evicted_registers_again_on_its_next_heartbeat(tmp_path) -> None:
    """The registry's clock jumps past evict_after_s: the gateway's next heartbeat is
    answered UNKNOWN_GATEWAY and it registers again, on the same connection."""
    clock = ManualClock()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = RegistryServer(tokens=[TOKEN.encode()], clock=clock, sweep_s=0.05)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    reg = f"127.0.0.1:{server.port}"
    try:
        with gateway(tmp_path / "gw" / "data", reg, "gw-east") as gw:
            wait_for(lambda: server.stats["registers"] == 1, "registered")
            wait_for(lambda: server.stats["heartbeats"] >= 1, "heartbeating")
            clock.advance(121_000)
            wait_for(lambda: server.stats["evicted"] == 1, "evicted")
            wait_for(lambda: server.stats["registers"] == 2, "registered again")
            assert server.stats["connections"] == 1   # the gateway's one session
            assert names(reg) == ["gw-east"]
            assert not any("registry_unreachable" in line for line in gw.lines)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_a_gateway_with_a_wrong_token_keeps_serving_and_says_why_once(tmp_path) -> None:
    reg = RegistryProcess(tmp_path / "reg")
    with reg, gateway(tmp_path / "gw" / "data", reg.address, "gw-west",
                      token="campus.not-the-token") as gw:
        gw.wait_log(r"registry_refused.*AUTH_FAILED")
        wait_for(lambda: sum("auth_failed" in line for line in reg.lines) >= 2,
                 "the gateway retried")
        assert names(reg.address) == []
        assert sum("registry_refused" in line for line in gw.lines) == 1
        with Producer(gw.address) as p:   # the gateway itself is not affected
            p.send_sync("lock.events", b"still serving")


def test_an_unknown_op_gets_the_same_answer_from_the_registry_and_a_broker(tmp_path) -> None:
    """One answer for an op a server does not have: ``INVALID_ARGUMENT`` (an ErrorCode
    name, as SPEC.md says of every admin error) with "unknown op ...; ops: ..." --
    the registry used to answer ``UNKNOWN_OP``, a code no client knew."""
    from lockmq.client.admin import AsyncAdmin
    from lockmq.testing import BrokerThread

    async def refusals(broker_port: int) -> list[AdminError]:
        server = RegistryServer(tokens=[TOKEN.encode()])
        await server.start()
        got = []
        try:
            with pytest.raises(AdminError) as reg_err:
                await registry_request(f"127.0.0.1:{server.port}", "registry.nope", token=TOKEN)
            got.append(reg_err.value)
            async with AsyncAdmin(f"127.0.0.1:{broker_port}") as admin:
                with pytest.raises(AdminError) as broker_err:
                    await admin.request("nope")
            got.append(broker_err.value)
        finally:
            await server.stop()
        return got

    with BrokerThread(str(tmp_path / "gw")) as broker:
        registry, gateway_ = asyncio.run(refusals(broker.port))
    assert registry.error == gateway_.error == "INVALID_ARGUMENT"
    assert ("unknown op 'registry.nope'; ops: registry.deregister, registry.heartbeat, "
            "registry.list") in str(registry)
    assert "unknown op 'nope'; ops: " in str(gateway_)


def test_more_sigterms_while_the_registry_stops_still_exit_cleanly(tmp_path) -> None:
    """As for the broker: signals during the shutdown do not change the exit status."""
    reg = RegistryProcess(tmp_path / "reg")
    try:
        assert reg.proc is not None
        assert signal_until_exit(reg.proc) == 0, reg.log_tail()
    finally:
        reg.stop()
