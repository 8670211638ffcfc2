"""A client that starts before its broker: the first connect is retried with backoff
for ``Endpoint.connect_retry_s`` (the CLI's ``--connect-retry``), then gives up.
(Refusals of credentials are not retried: tests/client/test_security.py.)"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from lockmq.client import Admin, AsyncProducer, ConnectionLost
from lockmq.client.session import Endpoint
from lockmq.testing import free_port

LOCKMQ = os.path.join(os.path.dirname(sys.executable), "lockmq")


def test_cli_produce_started_before_the_broker_waits_for_it(broker_factory):
    port = free_port()
    proc = subprocess.Popen([LOCKMQ, "produce", "--broker", f"127.0.0.1:{port}",
                             "--connect-retry", "60", "early", "hello"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()        # the condition: it has failed once
        assert "not reachable yet" in first and str(port) in first, first
        broker = broker_factory(port=port)
        # the rest through the same readers: communicate() after readline() would
        # miss what readline() already buffered (docs/design.md, "Test harness")
        proc.wait(60)
        out, err = proc.stdout.read(), first + proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.count(" offset=") == 1
    with Admin(broker.address) as admin:
        topics = {t["topic"]: t for t in admin.request("topics")["topics"]}
    assert topics["early"]["queue_end"] == 1


def test_first_connect_gives_up_after_connect_retry_s():
    port = free_port()

    async def attempts(retry_s: float) -> int:
        p = AsyncProducer(Endpoint("127.0.0.1", port, connect_retry_s=retry_s))
        with pytest.raises(ConnectionLost, match="cannot connect"):
            await p.connect()
        return p.connect_attempts

    assert asyncio.run(attempts(0)) == 1          # 0: one attempt, no retry
    assert asyncio.run(attempts(0.3)) >= 2


@pytest.mark.parametrize("order", ["dead,dead2,live", "dead,live,dead", "dead,dead2,dead,live"])
def test_a_broker_list_is_walked_in_order_to_the_live_broker(broker, order):
    """Each failed connect moves to the next address of the list, wrapping around --
    by its place in the list, so an address listed twice does not send the walk back
    to its first place (which never reached what comes after the second)."""
    dead, dead2 = free_port(), free_port()
    addresses = order.replace("dead2", f"127.0.0.1:{dead2}").replace(
        "dead", f"127.0.0.1:{dead}").replace("live", broker.address)

    async def connect() -> tuple[int, int]:
        p = AsyncProducer(addresses)
        p.backoff.cap_s = 0.05
        try:
            await p.connect()
            return p.connect_attempts, p.endpoint.port
        finally:
            await p.close()

    attempts, port = asyncio.run(connect())
    assert port == broker.port
    assert attempts == order.split(",").index("live") + 1
