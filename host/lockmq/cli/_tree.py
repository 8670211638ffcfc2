"""The ``lockmq`` command tree read from its argparse parser (completion, man page)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field


@dataclass
class Node:
    """One command: its name path, help, options and subcommands."""

    path: list[str]
    parser: argparse.ArgumentParser
    help: str = ""
    options: list[str] = field(default_factory=list)
    children: list["Node"] = field(default_factory=list)


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def walk(parser: argparse.ArgumentParser, path: list[str] | None = None,
         help_text: str = "") -> Node:
    """The tree under ``parser``, commands in the order they were added."""
    node = Node(path or [], parser, help_text)
    for action in parser._actions:
        node.options.extend(o for o in action.option_strings if o.startswith("--"))
    sub = _subparsers(parser)
    if sub is not None:
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        for name, child in sub.choices.items():
            node.children.append(walk(child, [*node.path, name], helps.get(name, "")))
    return node


def nodes(root: Node) -> list[Node]:
    """Every node, depth first."""
    out = [root]
    for child in root.children:
        out.extend(nodes(child))
    return out
