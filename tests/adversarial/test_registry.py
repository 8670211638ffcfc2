"""Trust round 2, item 4: the campus registry proves who is who, over real TCP (and TLS
to the gateways) on 127.0.0.1.

Seen live: the registry had no authentication by default and no owner per gateway
name; re-registering the real gateway's name without a credential moved a
``CampusConsumer`` to an attacker's broker, which fed it a forged LOCK-0001 record,
and a made-up gateway name was sent the consumer's token. Now: tokens are required,
a name belongs to its first (or provisioned) credential, and a campus consumer
verifies each gateway's certificate for its registered name before it sends a token.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from lockmq.client.campus import AsyncCampusConsumer
from lockmq.client.errors import AdminError, AuthError
from lockmq.client.registry import registry_request
from lockmq.registry.server import RegistryServer
from lockmq.security import Permissions
from lockmq.testing import Peer, SecureBroker, run_cli

pytestmark = pytest.mark.timeout(120)

GW_TOKEN = "gw.local.registry-secret"          # provisioned for the name gw.local only
CAMPUS_TOKEN = "campus.member-secret"          # another campus member (a malicious one)
OTHER = "campus.third-member-secret"


class FakeGateway:
    """An attacker's listener: records every byte any client sends it."""

    def __init__(self) -> None:
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.accepted = 0
        self.received = b""
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.accepted += 1
            c.settimeout(2)
            try:
                while data := c.recv(65536):
                    self.received += data
            except OSError:
                pass
            c.close()

    def close(self) -> None:
        self.srv.close()


def test_registry_needs_credentials_and_names_have_owners(tmp_path):
    assert run_cli("registry", "--port", "0") != 0      # no --tokens, no --no-auth: refused
    with pytest.raises(ValueError):
        RegistryServer()

    async def main() -> None:
        server = RegistryServer(tokens={GW_TOKEN.encode(): ("gw.local",),
                                        CAMPUS_TOKEN.encode(): (), OTHER.encode(): ()},
                                state_file=str(tmp_path / "registry.json"))
        await server.start()
        reg = f"127.0.0.1:{server.port}"
        try:
            # legitimate: the gateway registers its provisioned name
            await registry_request(reg, "registry.register", token=GW_TOKEN, name="gw.local",
                                   addresses=["127.0.0.1:6800"], topics=["lock.events"])
            # no credential: refused before any op
            with pytest.raises(AuthError):
                await registry_request(reg, "registry.register", token=None, name="gw.local",
                                       addresses=["127.0.0.1:9"], topics=["lock.events"])
            # another credential cannot take (or keep alive) the name ...
            for op in ("registry.register", "registry.heartbeat"):
                with pytest.raises(AdminError, match="FORBIDDEN"):
                    await registry_request(reg, op, token=CAMPUS_TOKEN, name="gw.local",
                                           addresses=["127.0.0.1:9"], topics=["lock.events"])
            # ... nor can the provisioned token register other names
            with pytest.raises(AdminError, match="FORBIDDEN"):
                await registry_request(reg, "registry.register", token=GW_TOKEN,
                                       name="gw-other", addresses=["127.0.0.1:9"])
            # a name first registered by one member stays its own, evicted or not
            await registry_request(reg, "registry.register", token=CAMPUS_TOKEN,
                                   name="gw-annex", addresses=["127.0.0.1:7000"])
            server.table.gateways.pop("gw-annex")          # (as an eviction does)
            with pytest.raises(AdminError, match="FORBIDDEN"):
                await registry_request(reg, "registry.register", token=OTHER,
                                       name="gw-annex", addresses=["127.0.0.1:9"])
            got = await registry_request(reg, "registry.lookup", token=CAMPUS_TOKEN,
                                         topic="lock.events")
            assert [(g["name"], g["addresses"]) for g in got["gateways"]] == \
                [("gw.local", ["127.0.0.1:6800"])]
            assert server.stats["names_refused"] >= 3
        finally:
            await server.stop()
        # the owners survive a restart (the state file)
        other = OTHER
        again = RegistryServer(tokens=[GW_TOKEN.encode(), CAMPUS_TOKEN.encode(), other.encode()],
                               state_file=str(tmp_path / "registry.json"))
        await again.start()
        try:
            with pytest.raises(AdminError, match="FORBIDDEN"):
                await registry_request(f"127.0.0.1:{again.port}", "registry.register",
                                       token=other, name="gw-annex", addresses=["127.0.0.1:9"])
            # its owner still may
            await registry_request(f"127.0.0.1:{again.port}", "registry.register",
                                   token=CAMPUS_TOKEN, name="gw-annex", addresses=["127.0.0.1:9"])
        finally:
            await again.stop()

    asyncio.run(main())


def test_a_campus_consumer_verifies_each_gateway_before_it_sends_its_token(tmp_path):
    gw = SecureBroker(tmp_path / "gw", tls=True,
                      tokens={"reader": Permissions(consume=("lock.*",))})
    key = gw.add_locks("LOCK-0001")["LOCK-0001"]
    broker = gw.start()
    fake = FakeGateway()
    try:
        with Peer(broker.port, "LOCK-0001") as lock:      # a real record on the real gateway
            lock.auth_lock(key)
            assert lock.publish("lock.events", 1).status == 0
        reader = gw.tok["reader"]

        async def main() -> None:
            server = RegistryServer(tokens={GW_TOKEN.encode(): ("gw.local",),
                                            CAMPUS_TOKEN.encode(): ()})
            await server.start()
            reg = f"127.0.0.1:{server.port}"
            try:
                await registry_request(reg, "registry.register", token=GW_TOKEN,
                                       name="gw.local", addresses=[f"127.0.0.1:{broker.port}"],
                                       tls_port=gw.tls_port, topics=["lock.events"])
                # a malicious member announces a made-up gateway at its own listener
                await registry_request(reg, "registry.register", token=CAMPUS_TOKEN,
                                       name="gw-evil", addresses=[f"127.0.0.1:{fake.port}"],
                                       tls_port=fake.port, topics=["lock.events"])
                got: list = []

                async def handler(msg) -> None:
                    got.append(msg)

                # Without a way to verify gateways, a consumer holding a token joins none.
                blind = AsyncCampusConsumer(reg, topic="lock.events", cluster="audit",
                                            handler=handler, token=reader,
                                            registry_token=CAMPUS_TOKEN, lookup_every_s=60)
                await blind.start()
                assert blind.gateways == [] and blind.unverified == 2
                await blind.stop()
                assert fake.accepted == 0

                # With the campus CA: the real gateway (its certificate names gw.local)
                # is joined and read; gw-evil cannot show a certificate for its name.
                campus = AsyncCampusConsumer(reg, topic="lock.events", cluster="audit",
                                             handler=handler, token=reader,
                                             registry_token=CAMPUS_TOKEN, lookup_every_s=60,
                                             gateway_tls_ca=gw.certs.ca_pem)
                await campus.start()
                try:
                    assert campus.gateways == ["gw.local"]
                    for _ in range(200):
                        if got:
                            break
                        await asyncio.sleep(0.05)
                    assert [(m.sn, m.seq) for m in got] == [("LOCK-0001", 1)]
                finally:
                    await campus.stop()
            finally:
                await server.stop()

        asyncio.run(main())
        # the attacker saw at most a TLS ClientHello: never the token
        assert reader.encode() not in fake.received
    finally:
        fake.close()
        gw.close()


def test_a_registry_over_tls_never_sees_a_token_in_clear(tmp_path):
    import ssl

    from lockmq.security.certs import init_ca_and_server

    files = init_ca_and_server(str(tmp_path / "certs"), ["reg.local"], ["127.0.0.1"])
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(files.server_pem, files.server_key)

    async def main() -> None:
        server = RegistryServer(tokens=[CAMPUS_TOKEN.encode()], ssl=ctx)
        await server.start()
        reg = f"127.0.0.1:{server.port}"
        try:
            got = await registry_request(reg, "registry.list", token=CAMPUS_TOKEN,
                                         tls_ca=files.ca_pem)
            assert got["ok"] is True
            with pytest.raises(Exception):        # plain TCP to a TLS registry: no answer
                await registry_request(reg, "registry.list", token=CAMPUS_TOKEN,
                                       timeout_s=3)
        finally:
            await server.stop()

    asyncio.run(main())
