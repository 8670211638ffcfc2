"""The `lockmq` command line: one sub-command group per module in this package.

Each module listed in ``GROUPS`` exposes ``register(subparsers)``, which adds its
parser(s) and sets ``func`` (called with the parsed ``argparse.Namespace``; its
return value is the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import lockmq

# Order is the order shown in `lockmq --help`.
GROUPS: list[str] = [
    "demo",
    "firmware",
    "produce",
    "consume",
    "topics",
    "clusters",
    "dlq",
    "txn",
    "command",
    "scheduled",
    "sim",
    "store",
    "broker",
    "standby",
    "devices",
    "offline",
    "tokens",
    "certs",
    "systemd",
    "export",
    "spark",
    "registry",
    "completion",
    "manpage",
]


def build_parser() -> argparse.ArgumentParser:
    """Build the full `lockmq` argument parser."""
    parser = argparse.ArgumentParser(
        prog="lockmq",
        description="lockmq: durable messaging for smart-lock fleets.",
    )
    from lockmq import accel   # (says which hot path runs: compiled or pure Python)
    parser.add_argument("--version", action="version",
                        version=f"lockmq {lockmq.__version__} (hot path: {accel.DESCRIPTION})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in GROUPS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ImportError as exc:
            # A group whose optional dependency is not installed must not break the
            # other commands (e.g. `lockmq demo` after `pip install -e '.[fast]'`).
            _unavailable(sub, name, exc)
            continue
        module.register(sub)
    return parser


def _unavailable(sub: argparse._SubParsersAction, name: str, exc: ImportError) -> None:
    """Register ``name`` as a command that explains what is missing."""
    p = sub.add_parser(name, help=f"(unavailable: {exc.name or exc} is not installed)")

    def explain(args: argparse.Namespace) -> int:
        print(f"lockmq {name}: needs {exc.name or exc}, which is not installed "
              f"({exc}); install the matching extra, e.g. pip install -e '.[all]'",
              file=sys.stderr)
        return 2

    p.set_defaults(func=explain)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `lockmq` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `lockmq ... | head`: the reader left; what is left to print goes nowhere
        # (and Python's own flush at exit must not raise again)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141   # 128 + SIGPIPE, as a shell reports a command killed by it


if __name__ == "__main__":
    sys.exit(main())
