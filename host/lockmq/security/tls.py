"""TLS contexts for the broker and the client library.

The broker serves TLS 1.2+ with the certificate and key from ``[security]``
(``tls_cert``, ``tls_key``); clients verify it against the gateway's CA. Locks use
MicroPython's ``ssl`` with the same CA given as DER (``lockmq certs init`` writes
``ca.der``). The certificates are ECDSA P-256: small handshakes, supported by the
ESP32's mbedTLS.
"""

from __future__ import annotations

import ssl
from typing import Any

from .config import SecurityConfig


def server_context(cert_file: str, key_file: str, client_ca: str = "") -> ssl.SSLContext:
    """A server context: TLS >= 1.2, our certificate; client certs required if a CA is given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if client_ca:
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def server_context_from_config(cfg: SecurityConfig) -> ssl.SSLContext | None:
    """The broker's TLS context, or None when no certificate is configured."""
    if not cfg.tls_cert:
        return None
    return server_context(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)


def client_context(ca_file: str | None = None, *, cadata: bytes | str | None = None,
                   check_hostname: bool = True, cert_file: str | None = None,
                   key_file: str | None = None) -> ssl.SSLContext:
    """A client context that verifies the broker against ``ca_file``/``cadata``.

    Without a CA it uses the system trust store. ``ca_file`` may be PEM or DER (the
    ``ca.der`` locks take). Hostname checking stays on unless asked otherwise (locks
    connect by IP to a gateway whose certificate lists it).
    """
    if ca_file and cadata is None:
        with open(ca_file, "rb") as fh:
            raw = fh.read()
        if not raw.lstrip().startswith(b"-----"):   # DER: the ssl module wants bytes
            ca_file, cadata = None, raw
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file, cadata=cadata)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def describe_listeners(cfg: SecurityConfig, port: int) -> list[dict[str, Any]]:
    """What the broker should listen on: ``[{"port", "tls"}]``, for its start-up log.

    With a certificate and ``tls_port`` 0, the main port is TLS and there is no
    plain port. With a certificate and ``tls_port`` > 0, TLS is on ``tls_port`` and
    the main port stays plain TCP if ``plain_port_enabled``; ``tls_port`` -1 is the
    same on any free port (listed as port 0: the kernel picks it at bind).
    """
    if not cfg.tls_cert:
        return [{"port": port, "tls": False}]
    if cfg.tls_port == 0:
        return [{"port": port, "tls": True}]
    out = [{"port": max(cfg.tls_port, 0), "tls": True}]
    if cfg.plain_port_enabled:
        out.insert(0, {"port": port, "tls": False})
    return out
