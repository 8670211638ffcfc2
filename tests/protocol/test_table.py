"""Every file that carries the protocol table's facts is what protocol/table.py gives.

``scripts/gen_protocol.py`` writes the host constants, the lock modules' const()
lines, the compiled core's consts.rs and the SPEC tables from the one table; this
regenerates them into a temporary folder and fails on any difference, naming the file
and the command that fixes it. A second part adds a fake command kind to a copy of the
table and checks where the generated files change: the worked example of
CONTRIBUTING.md ("Adding a command kind").
"""
from __future__ import annotations

import ast
import difflib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protocol", ROOT / "scripts" / "gen_protocol.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_protocol", module)
    spec.loader.exec_module(module)
    return module


gen = _gen()
GENERATED = gen.generate()


def test_the_generator_covers_every_kind_of_output() -> None:
    assert {"protocol/_constants.py", "host/rust/src/consts.rs", "protocol/SPEC.md",
            "protocol/_frame.py", "protocol/_session.py", "firmware/lockapp/link.py",
            "firmware/lockapp/commands.py", "firmware/lockapp/app.py"} <= set(GENERATED)


@pytest.mark.parametrize("rel", sorted(GENERATED))
def test_each_generated_file_is_what_the_table_gives(rel: str, tmp_path: Path) -> None:
    fresh = tmp_path / rel
    fresh.parent.mkdir(parents=True, exist_ok=True)
    fresh.write_text(GENERATED[rel])
    have, want = (ROOT / rel).read_text(), fresh.read_text()
    if have != want:
        diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                            rel + " (checked in)", rel + " (from the table)", n=1))
        pytest.fail(f"{rel} differs from what protocol/table.py gives: run "
                    f"`{gen.COMMAND}` (and commit the result)\n{diff[:3000]}")


def test_every_lock_const_naming_a_table_fact_is_in_a_generated_block() -> None:
    # a hand-written `_OP_X = const(...)` outside the markers would not be kept equal
    stray, table = [], gen.load_table()
    for path in gen.lock_modules(ROOT):
        inside = False
        for n, line in enumerate(path.read_text().split("\n"), 1):
            inside = (inside or line == gen.BEGIN) and line != gen.END
            name = line.split("=")[0].strip()
            if not inside and " = const(" in line and gen.lock_value(table, name):
                stray.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not stray, "protocol numbers outside a generated block:\n" + "\n".join(stray)


# -- the worked example: a new command kind ------------------------------------------------
BEEP = '    ("BEEP", 6, "beep", "ms u16", "sound the buzzer"),\n'


def _table_with_beep(tmp_path: Path) -> ModuleType:
    text = (ROOT / "protocol" / "table.py").read_text()
    anchor = "COMMAND_KINDS = (\n"
    assert anchor in text
    copy = tmp_path / "table.py"
    copy.write_text(text.replace(anchor, anchor + BEEP, 1))
    return gen.load_table(copy)


def test_a_new_command_kind_changes_the_constants_and_the_spec_only(tmp_path: Path) -> None:
    changed = {rel for rel, text in gen.generate(ROOT, _table_with_beep(tmp_path)).items()
               if text != GENERATED[rel]}
    # no lock module uses _K_BEEP yet, the core carries no command kinds
    assert changed == {"protocol/_constants.py", "protocol/SPEC.md"}
    out = gen.generate(ROOT, _table_with_beep(tmp_path))
    assert "    BEEP = 6" in out["protocol/_constants.py"]
    assert "| 6 | BEEP (`beep`) | ms u16 | sound the buzzer |" in out["protocol/SPEC.md"]


def test_the_handler_that_uses_a_new_kind_gets_its_const_line(tmp_path: Path) -> None:
    table = _table_with_beep(tmp_path)
    rel = "firmware/lockapp/commands.py"
    handler = (ROOT / rel).read_text() + "\n\ndef _beep(k):\n    return k == _K_BEEP\n"
    out = gen.render_lock_module(handler, table, rel)
    block = out.split(gen.BEGIN)[1].split(gen.END)[0]
    assert "_K_BEEP = const(6)\n" in block
    # ... and only that line is new
    added = set(out.split("\n")) - set(handler.split("\n"))
    assert added == {"_K_BEEP = const(6)"}


def test_a_const_that_names_nothing_of_the_table_is_refused(tmp_path: Path) -> None:
    rel = "firmware/lockapp/commands.py"
    text = (ROOT / rel).read_text().replace(gen.END, "_K_NOSUCH = const(9)\n" + gen.END)
    with pytest.raises(SystemExit, match="_K_NOSUCH names nothing of protocol/table.py"):
        gen.render_lock_module(text, gen.load_table(), rel)


# -- one vocabulary ------------------------------------------------------------------------
def _dict_literal(rel: str, name: str) -> dict:
    """The module-level dict literal ``name`` of a firmware module: {key node: value node}."""
    for node in ast.parse((ROOT / rel).read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return dict(zip(node.value.keys, node.value.values))  # type: ignore[attr-defined]
    raise AssertionError(f"{rel} has no {name}")


def _code(table: ModuleType, node: ast.AST) -> int:
    return int(gen.lock_value(table, node.id)[len("const("):-1], 0)  # type: ignore[attr-defined]


def test_the_lock_logs_events_by_the_tables_names() -> None:
    table = gen.load_table()
    names = table.names(table.EVENT_TYPES)
    lock = {k.value: _code(table, v) for k, v in _dict_literal("firmware/lockapp/events.py", "TYPES").items()}
    assert lock and all(names[code] == word for word, code in lock.items()), lock


def test_the_lock_logs_commands_by_the_tables_names() -> None:
    table = gen.load_table()
    names = table.names(table.COMMAND_KINDS)
    lock = {_code(table, k): v.value for k, v in _dict_literal("firmware/lockapp/commands.py", "NAMES").items()}
    assert lock == names
