"""TLS over a real socket on 127.0.0.1 with the certificates ``lockmq certs`` makes."""

from __future__ import annotations

import socket
import ssl
import threading

import pytest

from lockmq.security import SecurityConfig
from lockmq.security.certs import init_ca_and_server
from lockmq.security.tls import (client_context, describe_listeners, server_context,
                                 server_context_from_config)


def _serve_once(ctx: ssl.SSLContext, srv: socket.socket, box: dict) -> None:
    conn, _ = srv.accept()
    conn.settimeout(10)
    try:
        with ctx.wrap_socket(conn, server_side=True) as tls:
            box["version"] = tls.version()
            tls.sendall(tls.recv(64).upper())
    except (ssl.SSLError, OSError) as exc:
        box["error"] = exc


def _handshake(files, client_ctx: ssl.SSLContext, server_hostname: str) -> tuple[bytes, dict]:
    sctx = server_context(files.server_pem, files.server_key)
    box: dict = {}
    with socket.create_server(("127.0.0.1", 0)) as srv:
        t = threading.Thread(target=_serve_once, args=(sctx, srv, box), daemon=True)
        t.start()
        try:
            with socket.create_connection(srv.getsockname(), timeout=10) as raw:
                with client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
                    tls.sendall(b"hello")
                    reply = tls.recv(64)
        finally:
            t.join(10)
    return reply, box


def test_client_verifies_the_gateway_certificate(tmp_path):
    files = init_ca_and_server(str(tmp_path), ["gw.local"], ["127.0.0.1"])
    reply, box = _handshake(files, client_context(files.ca_pem), "127.0.0.1")
    assert reply == b"HELLO" and box["version"] in ("TLSv1.2", "TLSv1.3")
    # The lock's CA is the same certificate as DER.
    der = open(files.ca_der, "rb").read()
    reply, _ = _handshake(files, client_context(cadata=der), "gw.local")
    assert reply == b"HELLO"


def test_wrong_ca_and_wrong_name_are_refused(tmp_path):
    files = init_ca_and_server(str(tmp_path / "a"), ["gw.local"], ["127.0.0.1"])
    other = init_ca_and_server(str(tmp_path / "b"), ["gw.local"], ["127.0.0.1"])
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(files, client_context(other.ca_pem), "127.0.0.1")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(files, client_context(files.ca_pem), "evil.example")


def test_listeners_from_config(tmp_path):
    files = init_ca_and_server(str(tmp_path), [], ["127.0.0.1"])
    plain = SecurityConfig(data_dir=str(tmp_path))
    assert describe_listeners(plain, 6800) == [{"port": 6800, "tls": False}]
    assert server_context_from_config(plain) is None
    both = SecurityConfig(data_dir=str(tmp_path), tls_cert=files.server_pem,
                          tls_key=files.server_key)
    assert describe_listeners(both, 6800) == [{"port": 6800, "tls": False},
                                              {"port": 6843, "tls": True}]
    assert isinstance(server_context_from_config(both), ssl.SSLContext)
    only = SecurityConfig(data_dir=str(tmp_path), tls_cert=files.server_pem,
                          tls_key=files.server_key, tls_port=0)
    assert describe_listeners(only, 6800) == [{"port": 6800, "tls": True}]
    with pytest.raises(ValueError):
        SecurityConfig(data_dir=str(tmp_path), tls_cert=files.server_pem).validate()
