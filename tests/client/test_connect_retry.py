"""A client that starts before its broker, and refusals that say what is missing.

The first connect is retried with backoff for ``Endpoint.connect_retry_s`` (the CLI's
``--connect-retry``); a refusal of the credentials is not retried and, when no token
was given, says so; a missing right is named by the broker.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import pytest

from lockmq.client import Admin, AdminError, AsyncConsumer, AsyncProducer, AuthError, \
    ConnectionLost, ForbiddenError
from lockmq.client.embedded import EmbeddedBroker
from lockmq.client.session import Endpoint

LOCKMQ = os.path.join(os.path.dirname(sys.executable), "lockmq")


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_produce_started_before_the_broker_waits_for_it(broker_factory):
    port = _unused_port()
    proc = subprocess.Popen([LOCKMQ, "produce", "--broker", f"127.0.0.1:{port}",
                             "--connect-retry", "60", "early", "hello"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()        # the condition: it has failed once
        assert "not reachable yet" in first and str(port) in first, first
        broker = broker_factory(port=port)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.count(" offset=") == 1
    with Admin(broker.address) as admin:
        topics = {t["topic"]: t for t in admin.request("topics")["topics"]}
    assert topics["early"]["queue_end"] == 1


def test_first_connect_gives_up_after_connect_retry_s():
    port = _unused_port()

    async def attempts(retry_s: float) -> int:
        p = AsyncProducer(Endpoint("127.0.0.1", port, connect_retry_s=retry_s))
        with pytest.raises(ConnectionLost, match="cannot connect"):
            await p.connect()
        return p.connect_attempts

    assert asyncio.run(attempts(0)) == 1          # 0: one attempt, no retry
    assert asyncio.run(attempts(0.3)) >= 2


@pytest.fixture
def secured(tmp_path):
    """A broker with ``auth = "required"`` and one service token with a few rights."""
    from lockmq.security.config import SecurityConfig
    from lockmq.security.principal import Permissions
    from lockmq.security.tokens import TokenStore

    data = str(tmp_path / "data")
    os.makedirs(data)
    store = TokenStore(SecurityConfig(data_dir=data).registry_path)
    token, _ = store.create("door-service", Permissions(publish=("orders",),
                                                         consume=("orders:billing",)))
    store.close()
    b = EmbeddedBroker(data, auth="required").start()
    try:
        yield b, token
    finally:
        b.stop()


def test_no_token_is_said_and_not_retried(secured):
    b, _ = secured

    async def main() -> AsyncProducer:
        p = AsyncProducer(Endpoint("127.0.0.1", b.port, connect_retry_s=60), token="")
        with pytest.raises(AuthError, match="no token was given"):
            await p.connect()
        return p

    assert asyncio.run(main()).connect_attempts == 1   # refused credentials: no retry
    cli = subprocess.run([LOCKMQ, "produce", "--broker", b.address, "orders", "x"],
                         capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "LOCKMQ_TOKEN"})
    assert cli.returncode == 1 and "no token was given" in cli.stderr
    assert "--token" in cli.stderr


def test_a_missing_right_is_named(secured):
    b, token = secured

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
