"""The lock's copies of the protocol numbers equal protocol/_constants.py.

Both are generated from protocol/table.py (scripts/gen_protocol.py; test_table.py
holds every generated file to the table); this checks the result from the other side:
the values a lock folds are the ones the host uses.

On a lock the protocol modules and the app declare the numbers they use as
``_NAME = const(value)`` (MicroPython folds them: no heap) instead of importing the
constant classes, whose dicts took ~2.5 KiB of a 32-bit lock's heap. This holds every
such copy, in every protocol and firmware module, to the one table the host uses: a
changed opcode or error code that misses a copy fails here, and so does a const()
whose name says nothing about which constant it copies.
"""
from __future__ import annotations

import ast
import struct
from pathlib import Path

import pytest

from lockmq.protocol import _constants as C
from lockmq.protocol import _event, _frame
from lockmq.testing.micropython import PROTOCOL

FIRMWARE = Path(__file__).resolve().parents[2] / "firmware" / "lockapp"

#: name prefix -> the _constants class it copies from
PREFIXES = {"_OP_": C.Op, "_FLAG_": C.Flag, "_ROLE_": C.Role, "_AUTH_": C.AuthMethod,
            "_E_": C.ErrorCode, "_EV_": C.EventType, "_M_": C.Method, "_R_": C.Result,
            "_K_": C.CommandKind, "_S_": C.CommandStatus}


def const_copies() -> list[tuple[str, str, int]]:
    """(file, name, value) of every module-level ``NAME = const(int)``."""
    out = []
    for path in sorted(PROTOCOL.glob("*.py")) + sorted(FIRMWARE.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", None) == "const"):
                name = node.targets[0].id  # type: ignore[attr-defined]
                out.append((path.name, name, ast.literal_eval(node.value.args[0])))
    return out


def expected(name: str) -> int:
    """The _constants value a const() copy of that name must have."""
    for prefix, cls in PREFIXES.items():
        if name.startswith(prefix):
            return getattr(cls, name[len(prefix):])
    if name == "EVENT_HEADER_SIZE":       # the lock event's fixed part (protocol/table.py)
        return struct.calcsize(_event._EVT)
    return getattr(C, name.lstrip("_"))   # module-level numbers: VERSION, NO_SEQ, ...


COPIES = const_copies()


def test_there_are_copies_in_the_protocol_and_the_app() -> None:
    files = {f for f, _, _ in COPIES}
    assert {"_frame.py", "_session.py", "_errors.py", "link.py", "commands.py"} <= files


@pytest.mark.parametrize(("path", "name", "value"), COPIES, ids=[f"{f}:{n}" for f, n, _ in COPIES])
def test_each_const_copy_equals_the_constants_table(path: str, name: str, value: int) -> None:
    try:
        want = expected(name)
    except AttributeError:
        pytest.fail(f"{path}: {name} names no constant of protocol/_constants.py "
                    f"(prefixes: {', '.join(PREFIXES)}, or a module-level name)")
    assert value == want, f"{path}: {name} = {value}, _constants says {want}"


def test_the_locks_known_opcodes_are_every_opcode() -> None:
    # the lock's decoder skips (UnknownOpcode) what is not in its constant tuple
    assert sorted(_frame._LOCK_KNOWN) == sorted(C.OP_NAMES)
