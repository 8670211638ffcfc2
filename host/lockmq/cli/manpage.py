"""``lockmq manpage``: the lockmq(1) manual page, every command and option, as roff.

    lockmq manpage > /usr/local/share/man/man1/lockmq.1 && mandb -q
    man lockmq                       # or, without installing it:
    lockmq manpage | man -l -

Generated from the CLI itself (the same text as ``--help``), so it matches this
installation. docs/operators.md is the manual for running the broker.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from lockmq.cli._tree import Node, nodes, walk


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq manpage``."""
    p = sub.add_parser("manpage", help="print the lockmq(1) manual page (roff)",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=run)


def _roff(text: str) -> str:
    """Plain text made safe for roff: backslashes, leading dots or quotes, and
    non-ASCII characters."""
    out = []
    text = "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]"   # groff's Unicode escape
                   for c in text.replace("\\", "\\e"))
    for line in text.splitlines():
        out.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(out)


def _help(node: Node, action: argparse.Action) -> str:
    """An option's help as ``--help`` shows it (``%(default)s`` filled in)."""
    try:
        return node.parser._get_formatter()._expand_help(action)
    except (TypeError, ValueError, KeyError):
        return action.help or ""


def _options(node: Node) -> list[str]:
    lines = []
    for action in node.parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(action.option_strings) or action.dest
        if action.option_strings and action.nargs != 0:
            names += " " + (action.metavar or action.dest.upper())
        lines += [".TP", f"\\fB{_roff(names)}\\fR", _roff(_help(node, action))]
    return lines


def manpage(root: Node, version: str) -> str:
    """The whole page: NAME, SYNOPSIS, then a section per command."""
    lines = [f'.TH LOCKMQ 1 "" "lockmq {version}" "User Commands"',
             ".SH NAME", "lockmq \\- the smart-lock message broker and its tools",
             ".SH SYNOPSIS", "\\fBlockmq\\fR \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
             ".SH COMMANDS"]
    for node in nodes(root)[1:]:
        lines += [".SS " + _roff(" ".join(["lockmq", *node.path])), _roff(node.help)]
        description = node.parser.description or ""
        if description and description != node.help:
            lines += [".PP", ".nf", _roff(textwrap.dedent(description).strip()), ".fi"]
        lines += _options(node)
    lines += [".SH SEE ALSO", "docs/operators.md, docs/install.md, docs/consumers.md"]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Entry point of ``lockmq manpage``."""
    import lockmq
    from lockmq.cli import build_parser

    sys.stdout.write(manpage(walk(build_parser()), lockmq.__version__))
    return 0
