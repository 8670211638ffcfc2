"""How the broker is wired: one typed guard interface, narrow collaborators, a data
path that reads one way, and one timer helper (issue 11, "a broker wired explicitly").

The first tests read the code's structure (signatures and imports), so that a
component taking the whole ``Broker`` again, or a module reaching back up the data
path, fails here rather than in review."""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from pathlib import Path

import pytest

import lockmq.broker
from lockmq.broker.admin import Admin
from lockmq.broker.auth import OpenGuard
from lockmq.broker.commands import Commands
from lockmq.broker.connection import Connection
from lockmq.broker.services import Services
from lockmq.broker.devices import Devices
from lockmq.broker.periodic import start_periodic, stop_task
from lockmq.broker.publish import PublishPath
from lockmq.broker.status import StatusPage
from lockmq.security import BrokerGuard, Guard, SecurityConfig

BROKER_DIR = Path(lockmq.broker.__file__).parent


def _protocol_members() -> list[str]:
    return [n for n in vars(BrokerGuard) if not n.startswith("_")] + \
        list(BrokerGuard.__annotations__)


@pytest.fixture(params=["open", "required"])
def guard(request, tmp_path):
    if request.param == "open":
        yield OpenGuard()
        return
    g = Guard(SecurityConfig(data_dir=str(tmp_path)))
    yield g
    g.close()


def test_both_guards_implement_the_broker_guard_protocol(guard) -> None:
    assert isinstance(guard, BrokerGuard)
    for name in _protocol_members():
        want = getattr(BrokerGuard, name, None)
        if not callable(want) or isinstance(want, property):
            continue   # an attribute or a property: isinstance checked it is there
        got = inspect.signature(getattr(guard, name))
        expected = inspect.signature(want)
        params = list(expected.parameters.values())[1:]   # without self
        assert [(p.name, p.kind) for p in got.parameters.values()] == \
            [(p.name, p.kind) for p in params], f"{type(guard).__name__}.{name}{got}"
    assert isinstance(guard.preauth_max_frame, int)
    assert isinstance(guard.lock_frames_need_mac, bool)
    assert guard.auth_mode in ("off", "required")


@pytest.mark.parametrize("component", [Connection, Devices, Commands, Admin, PublishPath,
                                       StatusPage])
def test_no_component_receives_the_whole_broker(component) -> None:
    whole = re.compile(r"\bBroker\b")
    for p in list(inspect.signature(component.__init__).parameters.values())[1:]:
        assert p.name != "broker" and not whole.search(str(p.annotation)), \
            f"{component.__name__}({p.name}: {p.annotation})"
    for f in Services.__dataclass_fields__.values():
        assert not whole.search(str(f.type)), f.name


def _imports(module: str) -> set[str]:
    """The broker modules ``module`` imports (``from .x import`` / ``lockmq.broker.x``),
    type-checking-only imports left out."""
    tree = ast.parse((BROKER_DIR / f"{module}.py").read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and id(node) not in typing_only:
            if node.level == 1 and node.module:
                out.add(node.module)
            elif (node.module or "").startswith("lockmq.broker."):
                out.add(node.module.split(".")[2])
    return out


# The data path, top to bottom: socket -> decoder -> session -> connection -> core /
# publish path -> store -> clusters (dispatcher) -> the consumer (a member callback).
# A module may import what is below it, never what is above.
ABOVE = {
    "core": {"server", "connection", "publish", "admin", "devices", "commands", "status"},
    "clusters": {"server", "connection", "publish", "core", "admin", "devices", "commands",
                 "status"},
    "publish": {"server", "connection", "core", "admin", "devices", "commands", "status"},
    "readcache": {"server", "connection", "core", "clusters", "publish"},
    "devices": {"server", "connection", "admin", "status"},
    "commands": {"server", "connection", "admin", "status"},
    "admin": {"server", "connection", "status"},
    "connection": {"server", "status"},
    "periodic": {"server", "connection", "core"},
}


@pytest.mark.parametrize("module", sorted(ABOVE))
def test_no_module_reaches_back_up_the_data_path(module) -> None:
    assert not _imports(module) & ABOVE[module]


def test_the_broker_has_no_codec_of_its_own() -> None:
    assert not (BROKER_DIR / "wire.py").exists()
    for path in BROKER_DIR.glob("*.py"):
        src = path.read_text()
        assert "struct.Struct(" not in src and "import struct" not in src, path.name


def test_a_failing_timer_run_is_logged_and_the_timer_keeps_going() -> None:
    lines: list[tuple[str, dict]] = []
    runs: list[int] = []

    async def sweep() -> None:          # async functions are awaited too
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("first run fails")

    async def main() -> None:
        task = start_periodic("t", 0.001, sweep, lambda event, **f: lines.append((event, f)))
        while len(runs) < 3:
            await asyncio.sleep(0.001)
        await stop_task(task)
        assert task.cancelled()

    asyncio.run(main())
    assert lines[0][0] == "periodic_failed" and lines[0][1]["task"] == "t"
    assert "first run fails" in lines[0][1]["error"]
    assert len(lines) == 1
