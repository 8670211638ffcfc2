#!/usr/bin/env python3
"""Write every file that carries the protocol table's facts (protocol/table.py).

    python scripts/gen_protocol.py           # rewrite what differs, list what it wrote
    python scripts/gen_protocol.py --check   # write nothing; exit 1 naming what differs

It writes:

- ``protocol/_constants.py``: the host's constant classes (Op, ErrorCode, ...), whole;
- in each lock-side module (``protocol/_*.py``, ``firmware/lockapp/*.py``) that has the
  marker comments, the ``NAME = const(value)`` lines between them: one for every
  protocol name the module uses (``_OP_COMMAND``, ``_E_BUSY``, ``_K_UNLOCK``,
  ``_EV_TAMPER``, ``_NO_SEQ`` ...: see ``PREFIXES``), so a handler that starts using
  ``_K_NEW`` gets its line from here; public names already there are kept;
- ``host/rust/src/consts.rs``: the compiled core's constants, whole;
- the tables of ``protocol/SPEC.md`` between ``<!-- generated: NAME -->`` and
  ``<!-- end generated: NAME -->``.

``tests/protocol/test_table.py`` runs :func:`generate` and fails on any difference.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python scripts/gen_protocol.py"

#: the marker comments around a module's generated const() lines
BEGIN = "# -- protocol numbers: generated from protocol/table.py (%s) --" % COMMAND
END = "# -- end of generated protocol numbers --"
#: const() name prefix -> the table's class whose row it names
PREFIXES = {"_OP_": "Op", "_FLAG_": "Flag", "_ROLE_": "Role", "_AUTH_": "AuthMethod",
            "_E_": "ErrorCode", "_EV_": "EventType", "_M_": "Method", "_R_": "Result",
            "_K_": "CommandKind", "_S_": "CommandStatus"}
#: struct codes of the event record's fixed fields
_STRUCT = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q"}
#: which numbers are written in hex
_HEX_CLASSES = ("Op",)
_HEX_NUMBERS = ("NO_SEQ",)


def load_table(path: Path = ROOT / "protocol" / "table.py") -> ModuleType:
    """The table module at ``path``, loaded on its own (not through the package, whose
    generated modules may be the stale ones being rewritten)."""
    spec = importlib.util.spec_from_file_location("_protocol_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- values by name ------------------------------------------------------------------------
def _classes(table: ModuleType) -> dict[str, dict[str, int]]:
    return {cls: {row[0]: row[1] for row in rows} for cls, rows, _doc in table.CLASSES}


def _event_format(table: ModuleType) -> str:
    """The struct format of the event record's fixed fields (``>BBBHQ``)."""
    return ">" + "".join(_STRUCT[t] for _f, t in table.EVENT_RECORD if t in _STRUCT)


def _wrapped_tuple(items: list[str], indent: int, width: int = 96) -> str:
    """``(a, b, ...)`` over lines of at most ``width`` columns, continued at ``indent``."""
    lines, line = [], ""
    for item in items:
        if line and indent + len(line) + len(item) + 2 > width:
            lines.append(line.rstrip())
            line = ""
        line += item + ", "
    lines.append(line[:-2])
    return "(" + ("\n" + " " * indent).join(lines) + ")"


def derived(table: ModuleType) -> dict[str, str]:
    """Values a lock module may declare that are computed from the table (source text)."""
    fmt = _event_format(table)
    size = sum({"B": 1, "H": 2, "I": 4, "Q": 8}[c] for c in fmt[1:])
    return {"_LOCK_KNOWN": _wrapped_tuple(["0x%02X" % row[1] for row in table.OPCODES],
                                          len("_LOCK_KNOWN = (")),
            "_EVT": '"%s"' % fmt,
            "EVENT_HEADER_SIZE": "const(%d)" % size}


def lock_value(table: ModuleType, name: str) -> str | None:
    """The right-hand side of a lock module's line for ``name``; None if it names nothing
    of the table."""
    extra = derived(table)
    if name in extra:
        return extra[name]
    classes = _classes(table)
    for prefix, cls in PREFIXES.items():
        if name.startswith(prefix):
            value = classes[cls].get(name[len(prefix):])
            if value is None:
                return None
            return "const(%s)" % ("0x%02X" % value if cls in _HEX_CLASSES else value)
    numbers = {row[0]: row[1] for row in table.NUMBERS}
    value = numbers.get(name.lstrip("_"))
    if value is None:
        return None
    return "const(%s)" % ("0x%X" % value if name.lstrip("_") in _HEX_NUMBERS else value)


# -- protocol/_constants.py ----------------------------------------------------------------
def _with_note(line: str, note: str, width: int = 100) -> str:
    """``line`` with ``note`` as a comment at column 32, when it fits in ``width``."""
    full = "%-30s  # %s" % (line, note)
    return full if len(full) <= width else line


def render_constants(table: ModuleType) -> str:
    out = ["# Constants of the lockmq wire format: version, limits, opcodes, flags, error codes,",
           "# event and command kinds. GENERATED from protocol/table.py by `%s`:" % COMMAND,
           "# edit the table, not this file (tests/protocol/test_table.py checks it).",
           "# Plain classes of ints so the same file runs under MicroPython and CPython.",
           ""]
    for name, value, what in table.NUMBERS:
        text = "0x%X" % value if name in _HEX_NUMBERS else str(value)
        out.append(_with_note("%s = %s" % (name, text), what))
    for cls, rows, doc in table.CLASSES:
        out += ["", "", "class %s:" % cls, '    """%s"""' % doc]
        for row in rows:
            text = "0x%02X" % row[1] if cls in _HEX_CLASSES else str(row[1])
            line = "    %s = %s" % (row[0], text)
            if cls == "Op":
                note = "%s: %s" % (row[2], row[3])
            elif cls == "CommandKind":
                note = '"%s": %s' % (row[2], row[3])
            else:
                note = row[2]
            out.append(_with_note(line, note))
        if cls == "Op":
            out += ["", "", "OP_NAMES = {", *('    Op.%s: "%s",' % (r[0], r[0]) for r in rows), "}",
                    "", "", "def op_name(opcode):",
                    '    """The name of an opcode, or its hex value when unknown."""',
                    '    return OP_NAMES.get(opcode, "0x%04x" % opcode)']
    return "\n".join(out) + "\n"


# -- the lock modules' const() lines --------------------------------------------------------
def render_lock_module(text: str, table: ModuleType, where: str) -> str:
    """``text`` with its generated block rewritten (unchanged when it has none)."""
    lines = text.split("\n")
    if BEGIN not in lines:
        return text
    start = lines.index(BEGIN)
    try:
        end = lines.index(END, start)
    except ValueError:
        raise SystemExit("%s: %r has no %r after it" % (where, BEGIN, END)) from None
    block = lines[start + 1:end]
    rest = "\n".join(lines[:start] + lines[end + 1:])
    tree = ast.parse(rest)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    defined = {t.id for node in tree.body if isinstance(node, ast.Assign)
               for t in node.targets if isinstance(t, ast.Name)}
    defined |= {a.asname or a.name for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    kept = []
    for line in block:
        name = line.split("=")[0].strip()
        if not name or line[:1].isspace():      # (a tuple's continuation line)
            continue
        if lock_value(table, name) is None:
            raise SystemExit("%s: %s names nothing of protocol/table.py (prefixes: %s, or a "
                             "number)" % (where, name, ", ".join(PREFIXES)))
        if not name.startswith("_") or name in used:
            kept.append(name)
    # a name the module imports must not get a line too: the line would win (ota.py
    # once logged the protocol's version 1 instead of the app's VERSION it imports)
    imported = {a.asname or a.name for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    clash = sorted(n for n in kept if n in imported)
    if clash:
        raise SystemExit("%s: %s imported and in the generated block too: remove the "
                         "block's line" % (where, ", ".join(clash)))
    # a private name the module uses and does not define gets its line; a public one
    # (``VERSION`` in _frame.py, for its importers) is there because it was put there
    names = set(kept) | {n for n in used - defined
                         if n.startswith("_") and lock_value(table, n) is not None}
    numbers = [row[0] for row in table.NUMBERS]
    public = [n for n in numbers if n in names] + sorted(
        n for n in names if not n.startswith("_") and n not in numbers)
    extra = derived(table)
    private = sorted(n for n in names if n.startswith("_") and n not in extra)
    tail = sorted(n for n in names if n.startswith("_") and n in extra)
    body = ["%s = %s" % (n, lock_value(table, n)) for n in public + private + tail]
    return "\n".join(lines[:start + 1] + body + lines[end:])


def lock_modules(root: Path) -> list[Path]:
    """Every lock-side module that may carry a generated block."""
    return sorted((root / "protocol").glob("_*.py")) + sorted((root / "firmware").rglob("*.py"))


# -- host/rust/src/consts.rs ---------------------------------------------------------------
_RUST_TYPES = {"Op": "u16", "Flag": "u8", "ErrorCode": "u16"}
_RUST_PREFIX = {"Op": "OP_", "Flag": "FLAG_", "ErrorCode": "ERR_"}
_RUST_NUMBERS = {"VERSION": "u8", "HEADER_SIZE": "usize", "SUBHEADER_SIZE": "usize",
                 "CRC_SIZE": "usize", "MIN_FRAME": "usize", "MAX_SN": "usize",
                 "TAG_SIZE": "usize", "TO_BROKER": "u8", "TO_CLIENT": "u8"}


def _outside_the_table() -> list[tuple[str, str, str, int, str]]:
    """The core's constants whose source is another module: (rust name, type, CONSTANTS
    name, value, source)."""
    sys.path.insert(0, str(ROOT / "host"))
    try:
        from lockmq.protocol._bodies import PublishAck
        from lockmq.protocol._consume import _MSG_SIZE
        from lockmq.store import records
    finally:
        sys.path.pop(0)
    return [
        ("ACK_STORED", "u8", "PublishAck.STORED", PublishAck.STORED, "protocol/_bodies.py PublishAck"),
        ("ACK_DUPLICATE", "u8", "PublishAck.DUPLICATE", PublishAck.DUPLICATE, ""),
        ("MSG_FIXED", "usize", "MSG_FIXED", _MSG_SIZE,
         "protocol/_consume.py: queue_offset u64, delivery u16, seq u32, lock_ts_ms u64, "
         "broker_ts_us u64"),
        ("RECORD_HEADER", "usize", "records.HEADER_SIZE", records.HEADER_SIZE,
         "host/lockmq/store/records.py"),
        ("FORMAT_VERSION", "u8", "records.FORMAT_VERSION", records.FORMAT_VERSION, ""),
        ("FLAG_SYSTEM", "u8", "records.FLAG_SYSTEM", records.FLAG_SYSTEM, ""),
        ("MAX_SN_LEN", "usize", "records.MAX_SN_LEN", records.MAX_SN_LEN, ""),
        ("MAX_SEQ", "u64", "records.MAX_SEQ", records.MAX_SEQ, ""),
    ]


def _rust_int(value: int) -> str:
    return "0x%X" % value if value > 0xFFFF else str(value)


def render_rust(table: ModuleType) -> str:
    out = ["//! The wire's and the commit log's layout constants. GENERATED by `%s`" % COMMAND,
           "//! from protocol/table.py (and, for the store's and the bodies' numbers, their",
           "//! Python modules): edit those, not this file. `lockmq._core.CONSTANTS` exports",
           "//! them (`ALL`), and tests/protocol/test_core_constants.py holds the built core",
           "//! equal to its Python sources, so a stale build fails the suite.",
           "", "// protocol/table.py NUMBERS"]
    exported: list[tuple[str, str]] = []
    for name, value, what in table.NUMBERS:
        if name in _RUST_NUMBERS:
            out += ["/// %s" % what, "pub const %s: %s = %s;" % (name, _RUST_NUMBERS[name],
                                                             _rust_int(value))]
            exported.append((name, name))
    classes = {cls: rows for cls, rows, _doc in table.CLASSES}
    for cls, kind in _RUST_TYPES.items():
        out += ["", "// protocol/table.py %s" % cls]
        for row in classes[cls]:
            rust = _RUST_PREFIX[cls] + row[0]
            out.append("pub const %s: %s = 0x%02X;" % (rust, kind, row[1]))
            exported.append((rust, "%s.%s" % (cls, row[0])))
    for rust, kind, py, value, source in _outside_the_table():
        if source:
            out += ["", "// " + source]
        out.append("pub const %s: %s = %s;" % (rust, kind, _rust_int(value)))
        exported.append((rust, py))
    out += ["", "// derived",
            "/// a PUBLISH_ACK with no SN: header, subheader, status u8, offset u64, crc",
            "pub const ACK_FRAME_LEN: usize = MIN_FRAME + 9;",
            "pub const SEALED_ACK_LEN: usize = ACK_FRAME_LEN + TAG_SIZE;",
            "", "/// Every constant above (but the derived) by the name its Python source gives it.",
            "pub const ALL: &[(&str, u64)] = &["]
    out += ['    ("%s", %s as u64),' % (py, rust) for rust, py in exported]
    out.append("];")
    return "\n".join(out) + "\n"


# -- protocol/SPEC.md ----------------------------------------------------------------------
def _md(header: list[str], rows: list[list[str]]) -> list[str]:
    def line(cells: list[str]) -> str:
        return "|" + "|".join(" %s " % c if c else " " for c in cells) + "|"

    return [line(header), "|" + "---|" * len(header)] + [line(r) for r in rows]


def spec_tables(table: ModuleType) -> dict[str, list[str]]:
    ops = [(row[1], ["0x%04X" % row[1], row[0], row[2], row[3]]) for row in table.OPCODES]
    ops += [(first, ["0x%04X–0x%04X" % (first, last), why, "", ""])
            for first, last, why in table.RESERVED_OPCODES]
    events = []
    cols = (table.EVENT_TYPES, table.METHODS, table.RESULTS)
    for i in range(max(len(c) for c in cols)):
        row = []
        for c in cols:
            if i >= len(c):
                row += ["", ""]
            elif c is table.EVENT_TYPES:      # the one name, then what it means
                row += [str(c[i][1]), "`%s`: %s" % (table.event_name(c[i][0]), c[i][2])]
            else:
                row += [str(c[i][1]), c[i][2]]
        events.append(row)
    record = " | ".join("%s %s" % f for f in table.EVENT_RECORD)
    return {
        "opcodes": _md(["code", "name", "direction", "answer"],
                       [r for _c, r in sorted(ops, key=lambda x: x[0])]),
        "event-record": ["```", record, "```"],
        "events": _md(["event_type", "", "method", "", "result", ""], events),
        "commands": _md(["kind", "name", "args", "what it does"],
                        [[str(k[1]), "%s (`%s`)" % (k[0], k[2]), k[3], k[4]]
                         for k in table.COMMAND_KINDS]),
        "command-status": _md(["status", "name", "meaning"],
                              [[str(s[1]), s[0], s[2]] for s in table.COMMAND_STATUS]),
        "errors": _md(["code", "name", "meaning, and what the peer should do"],
                      [[str(e[1]), e[0], e[2]] for e in table.ERROR_CODES]),
    }


_SPEC_BLOCK = re.compile(r"(<!-- generated: ([a-z-]+) -->\n)(.*?)(<!-- end generated: \2 -->)",
                         re.S)


def render_spec(text: str, table: ModuleType) -> str:
    tables = spec_tables(table)

    def fill(m: re.Match) -> str:
        if m.group(2) not in tables:
            raise SystemExit("protocol/SPEC.md: no table %r (tables: %s)"
                             % (m.group(2), ", ".join(tables)))
        return m.group(1) + "\n".join(tables[m.group(2)]) + "\n" + m.group(4)

    return _SPEC_BLOCK.sub(fill, text)


# -- all of it -----------------------------------------------------------------------------
def generate(root: Path = ROOT, table: ModuleType | None = None) -> dict[str, str]:
    """``{path relative to root: the text it must have}`` for every generated file."""
    table = table or load_table()
    out = {"protocol/_constants.py": render_constants(table),
           "host/rust/src/consts.rs": render_rust(table)}
    spec = root / "protocol" / "SPEC.md"
    out["protocol/SPEC.md"] = render_spec(spec.read_text(), table)
    for path in lock_modules(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        new = render_lock_module(text, table, rel)
        if new != text or BEGIN in text:
            out[rel] = new
    return out


def differences(root: Path = ROOT, table: ModuleType | None = None) -> list[str]:
    """The generated files whose checked-in text is not what the table gives."""
    return [rel for rel, text in generate(root, table).items()
            if not (root / rel).exists() or (root / rel).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    args = p.parse_args(argv)
    stale = differences()
    if args.check:
        for rel in stale:
            print("%s: differs from protocol/table.py; run `%s`" % (rel, COMMAND))
        return 1 if stale else 0
    for rel, text in generate().items():
        if rel in stale:
            (ROOT / rel).write_text(text)
            print("wrote", rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
