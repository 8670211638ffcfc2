"""Smaller CLI fixes against a real broker: ``produce TEXT --count``, ``dlq list`` of a
cluster that does not exist, ``store dump`` showing payloads decoded."""

from __future__ import annotations

import json

from lockmq.cli import main
from lockmq.protocol import EventType, LockEvent, Method, Result


def test_produce_sends_the_given_text_count_times(broker, capsys):
    b = ["--broker", broker.address]
    assert main(["produce", *b, "cli.hello", "hello", "--count", "5", "-q"]) == 0
    assert "sent 5 messages" in capsys.readouterr().err
    assert main(["consume", *b, "cli.hello", "-c", "readers", "-n", "5"]) == 0
    out = capsys.readouterr().out
    assert out.count("hello") == 5


def test_dlq_list_of_an_unknown_cluster_is_an_error(broker, capsys):
    b = ["--broker", broker.address]
    assert main(["produce", *b, "cli.jobs", "job", "-q"]) == 0
    assert main(["consume", *b, "cli.jobs", "-c", "workers", "-n", "1"]) == 0
    capsys.readouterr()
    assert main(["dlq", "list", *b, "workers"]) == 0          # a cluster, no dead letters
    assert "no dead letters for workers" in capsys.readouterr().out
    assert main(["dlq", "list", *b, "wokers"]) == 1
    err = capsys.readouterr().err
    assert "no cluster named 'wokers'" in err and "workers" in err
    assert main(["dlq", "replay", *b, "wokers", "--all"]) == 1


def test_store_dump_decodes_lock_events_json_and_text(broker_factory, tmp_path, capsys):
    broker = broker_factory()
    b = ["--broker", broker.address]
    event = LockEvent(EventType.UNLOCK, 1_767_225_600_000, Method.CARD, Result.OK, 0,
                      b"\xab\xcd").encode()
    assert main(["produce", *b, "lock.events", event.hex(), "--hex", "-q"]) == 0
    assert main(["produce", *b, "orders", '{"order": 7}', "hello door", "-q"]) == 0
    assert main(["produce", *b, "raw", "00ff", "--hex", "-q"]) == 0
    assert main(["sim", *b, "--locks", "1", "--events", "1", "--rate", "0", "-q"]) == 0
    broker.stop()
    capsys.readouterr()
    data = str(tmp_path / "data")

    assert main(["store", "dump", data, "--topic", "lock.events"]) == 0
    line = capsys.readouterr().out
    assert "event=unlock method=card result=ok" in line and "credential=abcd" in line
    assert main(["store", "dump", data, "--topic", "orders"]) == 0
    json_line, text_line = capsys.readouterr().out.splitlines()
    assert json_line.endswith('json={"order": 7}') and text_line.endswith('text="hello door"')
    assert main(["store", "dump", data, "--topic", "raw"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("payload=00ff")
    assert main(["store", "dump", data, "--topic", "orders", "--hex"]) == 0
    assert "json=" not in capsys.readouterr().out
    assert main(["store", "dump", data, "--topic", "$devices"]) == 0   # the broker's records
    assert 'json={"' in capsys.readouterr().out.splitlines()[0]

    assert main(["store", "dump", data, "--topic", "orders", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rows[0]["json"] == {"order": 7} and rows[0]["payload"] == b'{"order": 7}'.hex()
    assert rows[1]["text"] == "hello door"


def test_consume_stops_cleanly_on_sigterm_and_prints_its_totals(broker):
    """The shared signal helper of `lockmq consume` and `lockmq sim`: SIGTERM sets the
    stop event, the consumer leaves its cluster and the totals are printed."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from lockmq.cli import main; sys.exit(main())",
         "consume", "--broker", broker.address, "doors", "--cluster", "sig"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert "consuming 'doors'" in proc.stderr.readline()   # started, handlers set
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "handled 0 in" in err
