"""Every CLI time option reads a naive ISO time the same way, as UTC, through one
argparse type (``cliargs.time_arg``): checked through the ``lockmq`` command's own
parser (``lockmq.cli.build_parser``), so the test follows the options the product has."""

from __future__ import annotations

import time

import pytest

from lockmq.cli import build_parser
from lockmq.testing import run_cli

#: 2026-11-24T08:00:00Z in epoch milliseconds
EIGHT_UTC_MS = 1795507200000

#: every time option: (the command line before it, the option, its Namespace field);
#: ``produce``/``command --at`` take bare numbers as seconds, the others as milliseconds
AT_OPTIONS = [(["produce", "t", "x"], "--at", "at"), (["command", "LK-1", "reboot"], "--at", "at")]
MS_OPTIONS = [(["store", "dump", "data"], "--since", "since"),
              (["store", "dump", "data"], "--until", "until"),
              (["clusters", "reset", "readers"], "--to-time", "to_time")]


def parsed_time(command: list[str], option: str, field: str, text: str) -> int:
    """What ``lockmq COMMAND OPTION TEXT`` hands its command for the option."""
    return getattr(build_parser().parse_args([*command, option, text]), field)


@pytest.fixture
def far_zone(monkeypatch):
    """The machine in a zone 8 hours off UTC: a naive time read as local would move."""
    monkeypatch.setenv("TZ", "CST-8")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("command, option, field", AT_OPTIONS + MS_OPTIONS)
def test_naive_times_are_utc_in_every_option(command, option, field, far_zone):
    assert parsed_time(command, option, field, "2026-11-24T08:00") == EIGHT_UTC_MS
    assert parsed_time(command, option, field, "2026-11-24T16:00+08:00") == EIGHT_UTC_MS
    assert parsed_time(command, option, field, "2026-11-24T08:00:00Z") == EIGHT_UTC_MS


@pytest.mark.parametrize("command, option, field", AT_OPTIONS)
def test_at_numbers_are_epoch_seconds(command, option, field):
    assert parsed_time(command, option, field, "1795507200") == EIGHT_UTC_MS
    assert parsed_time(command, option, field, "1795507200.5") == EIGHT_UTC_MS + 500


@pytest.mark.parametrize("command, option, field", MS_OPTIONS)
def test_other_numbers_are_epoch_milliseconds(command, option, field):
    assert parsed_time(command, option, field, "1795507200000") == EIGHT_UTC_MS


@pytest.mark.parametrize("text", ["tomorrow", "nan", "inf", ""])
@pytest.mark.parametrize("command, option, field", AT_OPTIONS + MS_OPTIONS)
def test_bad_times_are_usage_errors_naming_the_option(command, option, field, text, capsys):
    with pytest.raises(SystemExit) as exc:
        parsed_time(command, option, field, text)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: " in err and f"{text!r} is neither ISO 8601 nor epoch" in err


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
