"""Broker configuration as TOML-shaped tables: merged for tests, written as a file."""

from __future__ import annotations

from typing import Any

Tables = dict[str, dict[str, Any]]


def merge_tables(*layers: Tables) -> Tables:
    """Later layers override earlier ones, key by key inside each table."""
    out: Tables = {}
    for layer in layers:
        for name, table in layer.items():
            out.setdefault(name, {}).update(table)
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)


def to_toml(tables: Tables) -> str:
    """The tables as a TOML document (the value types a broker config uses)."""
    lines = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"
