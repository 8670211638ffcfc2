"""The ports of a broker the harness starts: the broker binds every listener the
harness leaves open (main, status page, TLS) itself and logs the numbers; the harness
reads them from ``broker_started``. No number is picked first and handed over, so none
can be taken in between -- by another process, or by this broker's own port-0
listener (an item-12 test failed so under load, when the harness still picked them)."""

from __future__ import annotations

import socket
import threading
import urllib.request

from lockmq.security import Permissions
from lockmq.security.tls import client_context
from lockmq.testing import BrokerProcess, Peer, SecureBroker, raises


def _status_title(port: int, token: str = "") -> str:
    """The title of the status page on ``port`` (``lockmq broker :<main port>``); with
    auth required its views need an admin token (docs/security.md, "The three lows")."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/summary",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode().split("  uptime")[0]


def test_brokers_started_at_once_each_get_and_report_their_own_ports(tmp_path):
    plain = [BrokerProcess(tmp_path / f"b{i}" / "data", {"broker": {"auth": "off"}},
                           start=False) for i in range(3)]
    secure = [SecureBroker(tmp_path / f"s{i}", tls=True, tokens={"ops": Permissions(admin=True)})
              for i in range(2)]
    errors: list[BaseException] = []

    def start(fn) -> None:
        try:
            fn()
        except BaseException as exc:   # noqa: BLE001 -- reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(fn,))
               for fn in [b.start for b in plain] + [s.start for s in secure]]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        brokers = plain + [s.broker for s in secure]
        ports = [b.port for b in brokers] + [b.status_port for b in brokers] \
            + [s.tls_port for s in secure]
        assert all(p and p > 0 for p in ports) and len(set(ports)) == len(ports), ports
        tokens = [""] * len(plain) + [s.tok["ops"] for s in secure]
        for b, tok in zip(brokers, tokens):   # each status page is its broker's (title: port)
            assert _status_title(b.status_port, tok).endswith(f":{b.port}")
        for s in secure:    # each TLS port serves TLS, with this broker's tokens
            tls = client_context(cadata=open(s.certs.ca_der, "rb").read())
            with Peer(s.tls_port, "", tls=tls, server_hostname="gw.local") as svc:
                svc.auth_token(s.tok["ops"])
                assert "topics" in svc.admin("topics")
    finally:
        for b in plain:
            b.stop()
        for s in secure:
            s.close()


def test_a_restart_keeps_the_main_and_tls_ports_and_finds_the_status_page(tmp_path):
    env = SecureBroker(tmp_path, tls=True, tokens={"ops": Permissions(admin=True)})
    try:
        broker = env.start()
        port, tls_port = broker.port, env.tls_port
        broker.restart()
        assert (broker.port, env.tls_port) == (port, tls_port)
        assert _status_title(broker.status_port, env.tok["ops"]).endswith(f":{port}")
        assert "lockmq_" in "".join(broker.metrics())
        broker.stop()                     # a new process from SecureBroker: the same ports
        again = env.start()
        assert again is not broker and (again.port, env.tls_port) == (port, tls_port)
    finally:
        env.close()


def test_status_port_0_still_means_no_status_page(tmp_path):
    broker = BrokerProcess(tmp_path / "data", {"broker": {"auth": "off", "status_port": 0}})
    try:
        line = broker.wait_log(r"event=broker_started")
        assert "status_port=" not in line and broker.status_port == 0
    finally:
        broker.stop()


def test_a_taken_status_port_the_caller_chose_fails_the_start(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        broker = BrokerProcess(tmp_path / "data",
                               {"broker": {"auth": "off", "status_port": port}}, start=False)
        err = raises(AssertionError, broker.start)
        assert "address already in use" in str(err) and broker.starts == 1
