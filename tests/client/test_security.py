"""The client against a broker with ``auth = "required"``: tokens, device keys, refusals."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from lockmq.client import (
    Admin,
    AdminError,
    AsyncConsumer,
    AsyncProducer,
    AuthError,
    CommandError,
    ForbiddenError,
)
from lockmq.client.session import Credentials, Endpoint, open_session
from lockmq.protocol import CommandKind, Role
from lockmq.sim import SimConfig, SimStats, register_locks, run_sim
from lockmq.testing import BrokerThread


@pytest.fixture
def secured(tmp_path):
    from lockmq.security.config import SecurityConfig
    from lockmq.security.principal import Permissions
    from lockmq.security.tokens import TokenStore

    data = str(tmp_path / "data")
    os.makedirs(data)
    cfg = SimConfig(locks=2, events_per_lock=5, rate_per_lock=0, stay_connected=True)
    cfg.keys = register_locks(cfg, data)
    store = TokenStore(SecurityConfig(data_dir=data).registry_path)
    svc, _ = store.create("billing-service", Permissions(
        publish=("orders",), consume=("orders:billing", "lock.events:billing"),
        command=("SIM-000001",)))
    store.close()
    b = BrokerThread(data, auth="required").start()
    try:
        yield b, cfg, svc
    finally:
        b.stop()


def test_token_device_keys_and_permissions(secured):
    b, cfg, svc = secured

    async def main():
        # no token, or a wrong device key: refused at the handshake
        with pytest.raises(AuthError):
            await AsyncProducer(b.address, reconnect=False).connect()
        with pytest.raises(AuthError):
            await open_session(Endpoint("127.0.0.1", b.port), "SIM-000001", Role.LOCK,
                               Credentials.device(b"\x00" * 32))
        got = []

        async def handler(msg):
            got.append(msg.id)

        async with AsyncProducer(b.address, token=svc) as p:
            await p.send("orders", b"paid")
            with pytest.raises(ForbiddenError):
                await p.send("secret-topic", b"nope")
            stats = SimStats()
            stop = asyncio.Event()
            sim = asyncio.ensure_future(run_sim(cfg, Endpoint("127.0.0.1", b.port),
                                                stop=stop, stats=stats))
            while stats.acked < 10:
                await asyncio.sleep(0.02)
            out = await p.command("SIM-000001", CommandKind.UNLOCK, b"\x00\x03",
                                  expires_in_s=10)
            with pytest.raises(CommandError) as denied:
                await p.command("SIM-000002", CommandKind.UNLOCK, b"\x00\x03",
                                expires_in_s=10)
            stop.set()
            await sim
        c = AsyncConsumer(b.address, topic="orders", cluster="billing", handler=handler,
                          token=svc)
        await c.start()
        while not got:
            await asyncio.sleep(0.02)
        await c.stop()
        with pytest.raises(ForbiddenError):
            await AsyncConsumer(b.address, topic="orders", cluster="someone-else",
                                handler=handler, token=svc, reconnect=False).start()
        return out, denied.value, stats, got

    out, denied, stats, got = asyncio.run(main())
    assert out.ok and "3 s" in out.detail            # the lock checked the broker's MAC
    assert denied.reason == "forbidden"
    assert stats.acked == 10 and stats.errors == 0
    assert len(got) == 1


def test_tls_connection_with_a_token(tmp_path):
    trustme = pytest.importorskip("trustme")
    import ssl

    from lockmq.security.config import SecurityConfig
    from lockmq.security.principal import Permissions
    from lockmq.security.tokens import TokenStore

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_pem, key_pem = tmp_path / "server.pem", tmp_path / "server.key"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_pem))
    cert.private_key_pem.write_to_path(str(key_pem))
    data = str(tmp_path / "data")
    os.makedirs(data)
    store = TokenStore(SecurityConfig(data_dir=data).registry_path)
    token, _ = store.create("tls-service", Permissions(publish=("secure",),
                                                       consume=("secure:readers",)))
    store.close()
    b = BrokerThread(data, auth="required", security={
        "tls_cert": str(cert_pem), "tls_key": str(key_pem), "tls_port": 0}).start()
    try:
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        ep = Endpoint("127.0.0.1", b.port, ssl=ctx)

        async def main():
            got = []

            async def handler(msg):
                got.append(msg.payload)

            async with AsyncProducer(ep, token=token) as p:
                await p.send("secure", b"over tls")
            c = AsyncConsumer(ep, topic="secure", cluster="readers", handler=handler,
                              token=token)
            await c.start()
            while not got:
                await asyncio.sleep(0.02)
            await c.stop()
            return got

        assert asyncio.run(asyncio.wait_for(main(), 30)) == [b"over tls"]
    finally:
        b.stop()


def test_pool_scales_without_admin_rights(secured):
    """A service token may not read the cluster's backlog (admin op): the consumer
    sizes its pool from what its PULLs return instead."""
    b, _cfg, svc = secured

    async def main():
        async with AsyncProducer(b.address, token=svc) as p:
            await asyncio.gather(*[p.send_async("orders", b"o%d" % i) for i in range(300)])
        done = []
        peak = 0

        async def handler(msg):
            await asyncio.sleep(0.01)
            done.append(msg.id)

        c = AsyncConsumer(b.address, topic="orders", cluster="billing", handler=handler,
                          token=svc, min_workers=1, max_workers=6, target_per_worker=10,
                          batch=8)
        await c.start()
        while len(done) < 300:
            peak = max(peak, c.workers)
            await asyncio.sleep(0.02)
        forbidden = c._backlog_forbidden
        await c.stop()
        return peak, forbidden

    peak, forbidden = asyncio.run(main())
    assert forbidden
    assert peak == 6


def test_no_token_is_said_and_not_retried(secured):
    b, _, _ = secured

    async def main() -> AsyncProducer:
        p = AsyncProducer(Endpoint("127.0.0.1", b.port, connect_retry_s=60), token="")
        with pytest.raises(AuthError, match="no token was given"):
            await p.connect()
        return p

    assert asyncio.run(main()).connect_attempts == 1   # refused credentials: no retry
    lockmq = os.path.join(os.path.dirname(sys.executable), "lockmq")
    cli = subprocess.run([lockmq, "produce", "--broker", b.address, "orders", "x"],
                         capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "LOCKMQ_TOKEN"})
    assert cli.returncode == 1 and "no token was given" in cli.stderr
    assert "--token" in cli.stderr


def test_a_missing_right_is_named(secured):
    b, _, token = secured

    async def main() -> tuple[str, str]:
        async with AsyncProducer(b.address, token=token) as p:
            await p.send("orders", b"paid")
            with pytest.raises(ForbiddenError) as publish:
                await p.send("payroll", b"nope")
        with pytest.raises(ForbiddenError) as consume:
            await AsyncConsumer(b.address, topic="orders", cluster="audit",
                                handler=lambda m: None, token=token, reconnect=False).start()
        return str(publish.value), str(consume.value)

    publish, consume = asyncio.run(main())
    assert "'payroll' needs the publish right" in publish and "--publish" in publish
    assert "as cluster 'audit' needs the consume right" in consume and "--consume" in consume
    with Admin(b.address, token=token) as admin:
        with pytest.raises(AdminError, match="needs a token with the admin right"):
            admin.request("topics")


@pytest.mark.parametrize("client_id", ["$broker", "ops tool", "a:1", "ops\n"])
def test_an_invalid_client_id_is_refused_before_connecting(client_id):
    """The library raises its own error (a LockmqError and a ValueError), naming the
    rule, without opening a socket: port 9 on loopback has no listener, and a
    connect attempt would raise ConnectionLost instead."""
    from lockmq.client import InvalidIdentityError, LockmqError
    from lockmq.protocol import ErrorCode

    with pytest.raises(InvalidIdentityError) as info:
        asyncio.run(open_session(Endpoint("127.0.0.1", 9), client_id, Role.SERVICE,
                                 Credentials.token("t")))
    assert isinstance(info.value, LockmqError) and isinstance(info.value, ValueError)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT and "client id" in str(info.value)
