"""``lockmq certs renew``: a new server certificate under the same CA, so a lock that
trusts the old CA (as DER, the way the firmware holds it) still connects over TLS."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from lockmq.broker.embedded import EmbeddedBroker
from lockmq.client.session import Credentials, Endpoint, open_session
from lockmq.protocol import Role
from lockmq.security import DeviceRegistry, SecurityConfig
from lockmq.security.certs import init_ca_and_server
from lockmq.security.tls import client_context

LOCKMQ = os.path.join(os.path.dirname(sys.executable), "lockmq")


def _cert(path: str) -> x509.Certificate:
    with open(path, "rb") as fh:
        return x509.load_pem_x509_certificate(fh.read())


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def test_renew_keeps_the_ca_and_a_lock_built_against_it_still_connects(tmp_path):
    tls = str(tmp_path / "tls")
    files = init_ca_and_server(tls, ["gw.local"], ["127.0.0.1"])
    lock_ca = _read(files.ca_der)                       # what the lock was flashed with
    ca_before = [_read(p) for p in (files.ca_pem, files.ca_der, files.ca_key)]
    old = _cert(files.server_pem)

    out = subprocess.run([LOCKMQ, "certs", "renew", tls], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "gw.local, 127.0.0.1" in out.stdout and "CA unchanged" in out.stdout

    new = _cert(files.server_pem)
    assert new.serial_number != old.serial_number
    assert new.public_key().public_numbers() != old.public_key().public_numbers()
    assert [_read(p) for p in (files.ca_pem, files.ca_der, files.ca_key)] == ca_before
    assert os.stat(files.server_key).st_mode & 0o077 == 0

    data = str(tmp_path / "data")
    os.makedirs(data)
    registry = DeviceRegistry.open(SecurityConfig(data_dir=data))
    key = registry.add("RENEW-LOCK-1")
    registry.close()
    broker = EmbeddedBroker(data, auth="required", overrides={"security": {
        "tls_cert": files.server_pem, "tls_key": files.server_key, "tls_port": 0}}).start()
    try:
        async def connect_as_lock() -> bytes:
            endpoint = Endpoint("127.0.0.1", broker.port, ssl=client_context(cadata=lock_ca),
                                connect_retry_s=0)
            conn, _ack = await open_session(endpoint, "RENEW-LOCK-1", Role.LOCK,
                                            Credentials.device(key))
            try:   # the certificate the broker served: the renewed one
                return conn.transport.get_extra_info("ssl_object").getpeercert(True)
            finally:
                conn.close()

        served = asyncio.run(connect_as_lock())
    finally:
        broker.stop()
    assert served == new.public_bytes(Encoding.DER)


def test_renew_can_change_the_names_and_refuses_without_the_ca(tmp_path):
    tls = str(tmp_path / "tls")
    files = init_ca_and_server(tls, ["gw.local"], [])
    out = subprocess.run([LOCKMQ, "certs", "renew", tls, "--host", "gw2.local", "--ip",
                          "10.0.0.2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    sans = _cert(files.server_pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["gw2.local"]

    os.remove(files.ca_key)
    out = subprocess.run([LOCKMQ, "certs", "renew", tls], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and f"{files.ca_key} is missing" in out.stderr
