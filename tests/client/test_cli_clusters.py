"""``lockmq clusters`` list / describe / reset / delete against a real broker."""

from __future__ import annotations

import pytest

from lockmq.cli import main
from lockmq.client.cliargs import parse_time_ms


def test_cluster_lifecycle_from_the_cli(broker, capsys):
    b = ["--broker", broker.address]
    assert main(["produce", *b, "life.t", "--count", "10", "-q"]) == 0
    assert main(["consume", *b, "life.t", "-c", "readers", "-n", "3"]) == 0
    assert main(["consume", *b, "life.t", "-c", "other", "-n", "1"]) == 0
    capsys.readouterr()

    assert main(["clusters", *b]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("readers"))
    assert "offline" in row and " 7 " in row and "ago" in row     # lag and last activity
    assert "LAST_ACTIVE" in out and "SKIPPED" in out

    assert main(["clusters", *b, "describe", "readers"]) == 0
    out = capsys.readouterr().out
    assert "committed        3" in out and "backlog          7" in out

    assert main(["clusters", *b, "reset", "readers"]) == 1          # no --to-...
    assert "--to-earliest" in capsys.readouterr().err
    assert main(["clusters", *b, "reset", "readers", "--to-earliest"]) == 0
    assert "position 3 -> 0" in capsys.readouterr().out
    assert main(["clusters", *b, "reset", "readers", "--to-latest"]) == 0
    assert "position 0 -> 10" in capsys.readouterr().out
    assert main(["clusters", *b, "reset", "readers", "--to-time", "2000-01-01T00:00:00Z"]) == 0
    assert "position 10 -> 0" in capsys.readouterr().out
    assert main(["clusters", *b, "reset", "readers", "--to-time", str(2**41)]) == 0
    assert "position 0 -> 10" in capsys.readouterr().out
    assert main(["clusters", *b, "reset", "readers", "--to-offset", "4"]) == 0
    assert "position 10 -> 4" in capsys.readouterr().out
    assert main(["clusters", *b, "reset", "readers", "--to-offset", "99"]) == 0  # clamped
    assert "position 4 -> 10" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["clusters", *b, "reset", "readers", "--to-offset", "-1"])
    assert "queue offset" in capsys.readouterr().err

    assert main(["clusters", *b, "delete", "readers"]) == 0
    assert "cluster readers deleted" in capsys.readouterr().out
    assert main(["clusters", *b, "describe", "readers"]) == 1
    assert "no cluster 'readers'" in capsys.readouterr().err
    assert main(["clusters", *b, "other", "--delete"]) == 0        # the old spelling
    assert "cluster other deleted" in capsys.readouterr().out
    assert main(["clusters", *b]) == 0
    assert "no consumer clusters yet" in capsys.readouterr().out


def test_to_time_accepts_iso8601_and_milliseconds():
    assert parse_time_ms("1700000000000") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T22:13:20") == 1_700_000_000_000       # no zone = UTC
    assert parse_time_ms("2023-11-15T00:13:20+02:00") == 1_700_000_000_000
