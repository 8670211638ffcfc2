"""Options shared by ``lockmq devices``, ``lockmq tokens`` (where the registry is)."""

from __future__ import annotations

import argparse
import datetime as dt

from lockmq.security import SecurityConfig


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
