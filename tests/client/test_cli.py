"""The client commands, run through ``lockmq.cli.main`` against a real broker."""

from __future__ import annotations

import pytest

from lockmq.cli import main
from lockmq.testing import BrokerThread


def test_demo_runs_end_to_end_and_reports_ok(capsys):
    rc = main(["demo", "--locks", "8", "--events", "10", "--rate", "0", "--consumers", "2",
               "--fail-every", "25", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "records published       80, acknowledged 80" in out
    assert "consumed exactly once   80 messages, 80 access-log rows, 80 distinct ids" in out
    assert "SIM-000001 answered" in out
    assert "OK: every acknowledged record was processed once" in out


def test_secure_demo_authenticates_locks_and_service(capsys):
    pytest.importorskip("cryptography")
    rc = main(["demo", "--secure", "--locks", "5", "--events", "4", "--rate", "0", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "auth required" in out and "SIM-000001 answered" in out
    assert "consumed exactly once   20 messages" in out


def test_produce_consume_topics_clusters(broker, capsys):
    b = ["--broker", broker.address]
    assert main(["produce", *b, "cli.t", "alpha", "beta"]) == 0
    assert main(["produce", *b, "cli.t", "--count", "30", "--mode", "async", "-q"]) == 0
    assert main(["produce", *b, "cli.t", "--count", "5", "--mode", "oneway", "-q",
                 "--lock-events"]) == 0
    assert main(["sim", *b, "--locks", "3", "--events", "4", "--rate", "0", "-q"]) == 0
    capsys.readouterr()
    assert main(["consume", *b, "cli.t", "-c", "readers", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "alpha" in out and "beta" in out
    assert main(["topics", *b]) == 0
    out = capsys.readouterr().out
    assert "cli.t" in out and "lock.events" in out
    assert main(["clusters", *b, "readers"]) == 0
    out = capsys.readouterr().out
    assert "readers" in out and "cli.t" in out


def test_a_broker_list_walks_past_a_dead_address(broker, capsys):
    """``--broker dead,live`` (a primary gone, its standby up): the commands connect to
    the next address instead of failing; ``sim`` refuses a list with a clear error."""
    from lockmq.testing import free_port

    b = ["--broker", f"127.0.0.1:{free_port()},{broker.address}", "--connect-retry", "5"]
    assert main(["produce", *b, "cli.list", "via-the-second"]) == 0
    assert main(["consume", *b, "cli.list", "-c", "list-readers", "-n", "1"]) == 0
    assert "via-the-second" in capsys.readouterr().out
    assert main(["topics", *b]) == 0
    assert "cli.list" in capsys.readouterr().out
    assert main(["sim", *b, "--locks", "1", "--events", "1"]) == 2
    assert "one HOST:PORT" in capsys.readouterr().err


def test_standby_status_asks_the_primary_and_reports_errors(broker, capsys):
    """``lockmq standby status`` takes the connection options of every broker command:
    the primary's ``replica.status`` as JSON, and an unreachable broker is an error
    line and exit 1, not a traceback."""
    import json

    from lockmq.testing import free_port

    assert main(["standby", "status", "--broker", broker.address]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["role"] == "primary" and status["sync"] is False
    assert main(["standby", "status", "--broker", f"127.0.0.1:{free_port()}",
                 "--connect-retry", "0"]) == 1
    assert capsys.readouterr().err.startswith("lockmq: ")


def test_dlq_list_and_replay(broker, capsys, tmp_path):
    b = ["--broker", broker.address]
    assert main(["produce", *b, "cli.jobs", "poison", "-q"]) == 0
    # every delivery fails: max_retries = 2 in the test broker, then the dead letter
    assert main(["consume", *b, "cli.jobs", "-c", "w", "--fail-rate", "1",
                 "--duration", "1.5", "--format", "none"]) == 0
    capsys.readouterr()
    assert main(["dlq", "list", *b, "w"]) == 0
    out = capsys.readouterr().out
    assert "failed on purpose" in out and "poison" in out
    assert main(["dlq", "replay", *b, "w", "--all"]) == 0
    assert "replayed 1" in capsys.readouterr().out
    db = str(tmp_path / "seen.db")
    assert main(["consume", *b, "cli.jobs", "-c", "w", "-n", "1", "--idempotency", db]) == 0
    assert "poison" in capsys.readouterr().out


def test_sim_with_keys_provisioned_by_lockmq_devices(tmp_path, capsys):
    pytest.importorskip("cryptography")
    data, prov = str(tmp_path / "data"), str(tmp_path / "prov")
    # --no-mac: the simulated locks speak without frame MACs (devices add provisions
    # for MACs by default since issue 33: without it every sim lock is refused and
    # this run waited forever)
    assert main(["devices", "add", "SIM-000001", "SIM-000002", "--data-dir", data,
                 "--out", prov, "--no-mac"]) == 0
    b = BrokerThread(data, auth="required").start()
    try:
        capsys.readouterr()
        assert main(["sim", "--broker", b.address, "--locks", "2", "--events", "3",
                     "--rate", "0", "--keys", prov, "-q", "--json"]) == 0
        out = capsys.readouterr().out
        assert '"acked": 6' in out
        # a lock the registry does not know is refused (and the sim says so)
        assert main(["sim", "--broker", b.address, "--locks", "1", "--first", "9",
                     "--events", "1", "--rate", "0", "--keys", prov, "-q",
                     "--duration", "2"]) == 1
        err = capsys.readouterr().err
        assert "1 of 1 SNs have no key" in err and "last connect error: SIM-000009" in err
    finally:
        b.stop()
