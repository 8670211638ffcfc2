"""What ``lockmq devices``, ``lockmq tokens`` and ``lockmq certs`` share: where the
registry is, and how a listing is printed."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any, Callable, Sequence

from lockmq.security import SecurityConfig


def print_rows(rows: Sequence[Any], as_json: bool, header: str, line: Callable[[Any], str],
               noun: str) -> int:
    """A listing: one JSON object a line (``to_dict()``), or a table with a count."""
    if as_json:
        for row in rows:
            print(json.dumps(row.to_dict()))
        return 0
    print(header)
    for row in rows:
        print(line(row))
    print(f"{len(rows)} {noun}(s)")
    return 0


def add_registry_options(parser: argparse.ArgumentParser) -> None:
    """``--config`` (the broker's TOML) and ``--data-dir`` (overrides it)."""
    parser.add_argument("--config", metavar="FILE",
                        help="broker config (TOML); its [broker] data_dir and [security] "
                             "table say where the registry and master key are")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="the broker's data directory (default ./data)")


def security_config(args: argparse.Namespace) -> SecurityConfig:
    """The SecurityConfig the broker would use with the same config/data dir."""
    from lockmq.config import load_config

    overrides = {"broker": {"data_dir": args.data_dir}} if args.data_dir else None
    return SecurityConfig.from_broker_config(load_config(args.config, overrides))


def when(ts: float | None) -> str:
    """A Unix time as ``YYYY-MM-DD HH:MM`` UTC (``-`` for None)."""
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
