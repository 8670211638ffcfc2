"""Running the ``lockmq`` command in this process."""

from __future__ import annotations


def run_cli(*argv: str) -> int:
    """Run ``lockmq ARGV...`` (its ``main``) here; returns the exit status."""
    from lockmq.cli import main

    return main(list(argv))
