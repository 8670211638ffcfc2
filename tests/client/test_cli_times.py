"""Every CLI time option reads a naive ISO time the same way, as UTC, through one
argparse type (``cliargs.time_arg``)."""

from __future__ import annotations

import argparse
import time

import pytest

from lockmq.client.cliargs import parse_time_ms, time_arg
from lockmq.testing import run_cli

#: 2026-11-24T08:00:00Z in epoch milliseconds
EIGHT_UTC_MS = 1795507200000

#: the options' own parsers: ``produce``/``command --at`` (bare numbers are seconds)
#: and ``store dump --since``; both give epoch milliseconds
at_ms = time_arg("--at", numbers="s")
since_ms = time_arg("--since/--until")


@pytest.fixture
def far_zone(monkeypatch):
    """The machine in a zone 8 hours off UTC: a naive time read as local would move."""
    monkeypatch.setenv("TZ", "CST-8")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_naive_times_are_utc_in_every_option(far_zone):
    assert at_ms("2026-11-24T08:00") == EIGHT_UTC_MS                     # produce/command --at
    assert since_ms("2026-11-24T08:00") == EIGHT_UTC_MS                  # store dump --since
    assert parse_time_ms("2026-11-24T08:00", "--to-time") == EIGHT_UTC_MS  # clusters reset


def test_zones_and_numbers_keep_their_meaning(far_zone):
    assert at_ms("2026-11-24T16:00+08:00") == EIGHT_UTC_MS
    assert parse_time_ms("2026-11-24T08:00:00Z") == EIGHT_UTC_MS
    assert at_ms("1795507200") == EIGHT_UTC_MS                           # --at: seconds
    assert at_ms("1795507200.5") == EIGHT_UTC_MS + 500
    assert parse_time_ms("1795507200000") == EIGHT_UTC_MS                # others: ms


@pytest.mark.parametrize("text", ["tomorrow", "nan", "inf", ""])
def test_bad_times_name_the_option(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--at"):
        at_ms(text)
    with pytest.raises(argparse.ArgumentTypeError, match="--since"):
        since_ms(text)


@pytest.mark.parametrize("command", [["produce", "t", "x"], ["command", "LK-1", "reboot"]])
def test_a_bad_at_is_a_usage_error_not_a_traceback(command, capsys):
    # (before: a ValueError traceback out of the command, after it had connected)
    with pytest.raises(SystemExit) as exc:
        run_cli(*command, "--at", "tomorrow", "--broker", "127.0.0.1:1")
    assert exc.value.code == 2
    assert "--at 'tomorrow' is neither ISO 8601 nor epoch seconds" in capsys.readouterr().err


def test_a_bad_to_time_is_a_usage_error_before_connecting(capsys):
    # (before: parsed only after the admin session to the broker was opened)
    with pytest.raises(SystemExit) as exc:
        run_cli("clusters", "reset", "readers", "--to-time", "tomorrow",
                "--broker", "127.0.0.1:1")
    assert exc.value.code == 2
    assert "--to-time 'tomorrow' is neither ISO 8601 nor epoch milliseconds" in \
        capsys.readouterr().err
