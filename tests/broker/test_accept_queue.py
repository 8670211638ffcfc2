"""The kernel's accept queue in front of the broker (``acceptq``): connections the event
loop has not accepted yet show in ``stats`` and ``/metrics``, so an operator can see a
reconnect storm the broker is behind on -- the locks the kernel drops once the queue is
full connect only after their SYN is resent, a second or more later."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from lockmq.broker.acceptq import accept_queue, tcp_ext_counters
from lockmq.testing import BrokerThread, wait_for

from .test_metrics import samples, scrape

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the kernel reports listen queues on Linux")


def test_a_listener_that_does_not_accept_holds_its_connections_in_the_queue():
    listener = socket.socket()
    clients: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(5)
        assert accept_queue([listener]) == (0, 5)
        clients = [socket.create_connection(listener.getsockname(), timeout=5)
                   for _ in range(3)]
        wait_for(lambda: accept_queue([listener]) == (3, 5), "three connections queued")
        listener.accept()[0].close()
        assert accept_queue([listener]) == (2, 5)
        # a socket that does not listen tells nothing
        assert accept_queue([clients[0]]) is None
    finally:
        for c in clients:
            c.close()
        listener.close()


def test_connections_the_busy_loop_has_not_accepted_show_in_stats(broker: BrokerThread):
    admin = broker.broker.admin

    def while_the_loop_is_held() -> tuple[dict, dict]:
        # (on the broker's loop: it accepts nothing until this returns)
        before = admin.stats({})["accept_queue"]
        clients = [socket.create_connection(("127.0.0.1", broker.port), timeout=5)
                   for _ in range(3)]
        try:
            deadline = time.monotonic() + 5
            while admin.stats({})["accept_queue"]["waiting"] < 3 and \
                    time.monotonic() < deadline:
                time.sleep(0.01)
            return before, admin.stats({})["accept_queue"]
        finally:
            for c in clients:
                c.close()

    before, held = broker.call(while_the_loop_is_held)
    somaxconn = int(open("/proc/sys/net/core/somaxconn").read())
    size = min(broker.broker.config.broker.backlog, somaxconn)
    assert before["waiting"] == 0 and before["size"] == size
    assert held["waiting"] == 3 and held["size"] == size
    # once the loop runs again it accepts them (and sees them close)
    wait_for(lambda: broker.call(lambda: admin.stats({})["accept_queue"]["waiting"]) == 0,
             "the loop to accept the queued connections")
    host = tcp_ext_counters(("ListenOverflows",))
    assert host is not None and held["host_listen_overflows"] <= host["ListenOverflows"]


def test_the_accept_queue_is_a_metric(broker: BrokerThread):
    got = samples(scrape(broker.status_page()))
    assert got["lockmq_accept_queue"] == 0
    assert got["lockmq_accept_queue_size"] >= 1
    assert got["lockmq_host_listen_overflows_total"] >= 0
