"""BrokerProcess's status port: the harness picks a free one (``free_port``), which can
be taken before the broker binds it -- by another process, or by the broker's own
port-0 listener (the kernel hands out the number ``free_port`` just released: an
item-12 test failed so under load). The harness then starts again on another; a
port the caller chose is never changed behind its back."""

from __future__ import annotations

import socket

from lockmq.testing import BrokerProcess, raises


def test_a_taken_status_port_of_the_harness_is_replaced_at_start(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        broker = BrokerProcess(tmp_path / "data", {"broker": {"auth": "off"}}, start=False)
        broker.status_port = broker.tables["broker"]["status_port"] = port   # the race, lost
        try:
            broker.start()
            assert broker.starts == 2 and broker.status_port != port
            broker.wait_log(rf"event=broker_failed .*{port}\): address already in use")
            assert "lockmq_" in "".join(broker.metrics())   # the page answers on the new port
        finally:
            broker.stop()


def test_a_taken_status_port_the_caller_chose_fails_the_start(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        broker = BrokerProcess(tmp_path / "data",
                               {"broker": {"auth": "off", "status_port": port}}, start=False)
        err = raises(AssertionError, broker.start)
        assert "address already in use" in str(err) and broker.starts == 1
