"""TLS end to end: a real ``lockmq broker`` with a TLS port made by ``lockmq certs``.

The lock verifies the gateway with the CA as DER (what MicroPython's ssl takes);
the plain port stays open for locks without TLS and is logged as unencrypted; a
token over plain TCP from anywhere but the configured addresses is refused.
"""

from __future__ import annotations

import ssl

import pytest

from lockmq.protocol import ErrorCode
from lockmq.security import Permissions
from lockmq.security.certs import init_ca_and_server
from lockmq.security.tls import client_context
from lockmq.testing import Peer, Refused, SecureBroker


pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tls_env(tmp_path_factory):
    env = SecureBroker(tmp_path_factory.mktemp("tls"), tls=True, locks=["TLS-LOCK"],
                       tokens={"ops": Permissions(admin=True)})
    yield env.start(), env.tls_port, env.certs, env.keys["TLS-LOCK"], env.tok["ops"]
    env.close()


def test_lock_over_tls_verifies_the_gateway_with_a_der_ca(tls_env):
    broker, tls_port, files, key, _ = tls_env
    ctx = client_context(cadata=open(files.ca_der, "rb").read())
    w = Peer(tls_port, "TLS-LOCK", tls=ctx)
    try:
        assert isinstance(w.sock, ssl.SSLSocket) and w.sock.version() in ("TLSv1.2", "TLSv1.3")
        w.auth_lock(key)
        assert w.publish("lock.events", 1) is not None
    finally:
        w.close()
    broker.wait_log(r"auth_ok.*name=TLS-LOCK.*tls=True")


def test_a_client_with_another_ca_cannot_connect(tls_env, tmp_path):
    _, tls_port, _, _, _ = tls_env
    other = init_ca_and_server(str(tmp_path / "other"), ["gw.local"], ["127.0.0.1"])
    with pytest.raises(ssl.SSLCertVerificationError):
        Peer(tls_port, "TLS-LOCK", tls=client_context(other.ca_pem))


def test_plain_port_is_open_and_logged_as_unencrypted(tls_env):
    broker, _, _, key, _ = tls_env
    broker.wait_log(r"listener.*PLAIN-TCP-UNENCRYPTED")
    w = Peer(broker.port, "TLS-LOCK")
    try:
        w.auth_lock(key)
    finally:
        w.close()
    broker.wait_log(r"auth_ok.*name=TLS-LOCK.*tls=False.*transport=PLAIN-TCP")


def test_token_needs_tls_unless_from_an_allowed_address(tls_env):
    broker, tls_port, files, _, token = tls_env
    w = Peer(broker.port, "", source="127.0.0.7")      # plain TCP, not 127.0.0.1
    try:
        with pytest.raises(Refused) as ei:
            w.auth_token(token)
        assert ei.value.code == ErrorCode.AUTH_FAILED
    finally:
        w.close()
    broker.wait_log(r"plain_token_refused")
    w = Peer(tls_port, "", tls=client_context(files.ca_pem), source="127.0.0.7")
    try:
        w.auth_token(token)                                # same token over TLS: fine
    finally:
        w.close()
