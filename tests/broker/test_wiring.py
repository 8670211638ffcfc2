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
        yield Guard.open()
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


# -- the import graph (issue 37, "the layering holds by design") ---------------------

LOCKMQ_DIR = BROKER_DIR.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(LOCKMQ_DIR.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(LOCKMQ_DIR.rglob("*.py"))}


def _import_edges(name: str) -> list[tuple[str, bool, int]]:
    """``(imported lockmq module, inside a function?, line)`` for every import of module
    ``name`` -- at module level and inside functions alike (what a function imports
    is imported the first time it runs), type-checking-only imports left out. ``from
    pkg import sub`` of submodules is an edge to each submodule alone (and to the
    packages above it that run first)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    in_function = {id(n) for node in ast.walk(tree)
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(node) if n is not node}
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES]
            targets = subs if len(subs) == len(node.names) else [mod] + subs
        else:
            continue
        for t in targets:
            while t not in MODULES and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in MODULES and t != name and t.startswith("lockmq"):
                out.append((t, id(node) in in_function, node.lineno))
                # importing a.b.c runs a/__init__ and a/b/__init__ first (those not
                # already running around this module): edges too
                for parent in _parents(t) - _parents(name) - {name}:
                    out.append((parent, id(node) in in_function, node.lineno))
    return out


def _parents(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))} & set(MODULES)


EDGES = {name: _import_edges(name) for name in MODULES}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _shown(circle: list[str], graph_edges: dict[str, list[tuple[str, bool, int]]],
           key=lambda m: m) -> str:
    members = set(circle)
    return "\n".join(f"  {m}:{line} imports {t}{' (in a function)' if fn else ''}"
                     for m in sorted(graph_edges) if key(m) in members
                     for t, fn, line in graph_edges[m]
                     if key(t) in members and key(t) != key(m))


def test_no_import_circle_among_broker_modules() -> None:
    graph = {m: {t for t, _fn, _l in EDGES[m] if t.startswith("lockmq.broker.")}
             for m in MODULES if m.startswith("lockmq.broker.")}
    circles = _circles(graph)
    assert not circles, "\n".join(_shown(c, EDGES) for c in circles)


#: module circles that are someone else's to break (each named; the test fails once
#: one is gone, so the list only shrinks): the firmware image builder and its frozen
#: modules (issue 39's)
KNOWN_MODULE_CIRCLES = [
    ["lockmq.firmware_tools.build", "lockmq.firmware_tools.frozen"],
]


def test_no_import_inside_a_function_closes_a_circle() -> None:
    """With every import counted, function-level ones too, no two lockmq modules
    import each other (directly or around a loop): an import moved into a function
    to dodge a circle fails here."""
    graph = {m: {t for t, _fn, _l in EDGES[m]} for m in MODULES}
    circles = _circles(graph)
    assert [c for c in circles if c not in KNOWN_MODULE_CIRCLES] == [], \
        "\n".join(_shown(c, EDGES) for c in circles if c not in KNOWN_MODULE_CIRCLES)
    assert [c for c in KNOWN_MODULE_CIRCLES if c not in circles] == [], \
        "a known circle is gone: take it off KNOWN_MODULE_CIRCLES"


def _package(module: str) -> str:
    """The top-level part of lockmq a module belongs to (``lockmq.broker``,
    ``lockmq.config``)."""
    return ".".join(module.split(".")[:2])


#: imports between top-level parts of lockmq that still close a circle of packages
#: (from, to): the debt, named so that it only shrinks -- a new circle fails the
#: test below, and so does an entry that no longer exists (take it off).
KNOWN_PACKAGE_EDGES: set[tuple[str, str]] = set()


def test_no_import_circle_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for m in MODULES:
        for t, _fn, _l in EDGES[m]:
            a, b = _package(m), _package(t)
            if a != b and (a, b) not in KNOWN_PACKAGE_EDGES:
                graph.setdefault(a, set()).add(b)
    circles = _circles(graph)
    assert not circles, "\n".join(_shown(c, EDGES, _package) for c in circles)
    present = {(_package(m), _package(t)) for m in MODULES for t, _fn, _l in EDGES[m]}
    assert KNOWN_PACKAGE_EDGES <= present, KNOWN_PACKAGE_EDGES - present


def test_the_broker_package_imports_nothing() -> None:
    """Importing one broker module (its log, its admin errors) runs
    ``lockmq/broker/__init__.py`` first: were the server imported there, every such
    import would build the broker and close a circle through what it wires in."""
    assert EDGES["lockmq.broker"] == []


def test_only_the_server_imports_the_connection() -> None:
    """Features talk to a ``peer.Peer``; the connection class is built by the server
    alone (and nothing imports it for its types)."""
    users = {m for m in MODULES if any(t == "lockmq.broker.connection"
                                        for t, _fn, _l in EDGES[m])}
    assert users == {"lockmq.broker.server"}
    for m, path in MODULES.items():
        if m != "lockmq.broker.server":
            assert ".connection import" not in path.read_text() \
                or m.startswith("lockmq.mqtt"), m


def test_the_client_library_does_not_import_the_broker() -> None:
    for m in MODULES:
        if m.startswith("lockmq.client"):
            assert not [t for t, _fn, _l in EDGES[m] if t.startswith("lockmq.broker")], m


def _protocol_imports(name: str, path: Path | None = None) -> list[tuple[str, int]]:
    """``(lockmq.protocol name, line)`` for every protocol module or name that module
    ``name`` (host module, or a script at ``path``) imports, anywhere in it (functions
    and type-checking blocks too)."""
    path = MODULES[name] if path is None else path
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:   # (lockmq/protocol is a link into the package: ..protocol)
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([mod] if mod else []))
            out += [(f"{mod}.{a.name}", node.lineno) for a in node.names]
    return [(t, line) for t, line in out if t.startswith("lockmq.protocol.")]


def _private(imports: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The imports of a ``_private`` protocol module or name."""
    return [(t, line) for t, line in imports if any(p.startswith("_") for p in t.split(".")[2:])]


def test_no_host_module_imports_a_private_protocol_module() -> None:
    """The host uses the protocol's public names (``lockmq.protocol``, its public
    modules ``batch``, ``compiled``, ``txn``, ``schedule``, ``table``), never a
    ``_private`` module or name: what a lock runs may change inside the package."""
    assert "lockmq.broker.intake" in MODULES and not any(
        m.startswith("lockmq.protocol") for m in MODULES)   # (the link is not walked)
    private = [f"{m}:{line} imports {t}" for m in sorted(MODULES)
               for t, line in _private(_protocol_imports(m))]
    assert private == []


BENCH_DIR = LOCKMQ_DIR.parents[1] / "bench"


def test_no_bench_script_imports_a_private_protocol_module() -> None:
    """bench/ measures what the host and the lock run through the same public names:
    a benchmark that reaches inside the package breaks when a lock's module changes."""
    scripts = sorted(BENCH_DIR.glob("*.py"))
    assert BENCH_DIR / "loadgen.py" in scripts
    private = [f"bench/{s.name}:{line} imports {t}" for s in scripts
               for t, line in _private(_protocol_imports(s.stem, s))]
    assert private == []


def _core_uses(name: str) -> list[tuple[str, bool, int]]:
    """``(function, inside a function?, line)`` for every ``accel.speedups.<function>``
    host module ``name`` reads (``speedups.<function>`` in lockmq.accel itself)."""
    tree = ast.parse(MODULES[name].read_text())
    in_function = {id(n) for node in ast.walk(tree)
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                   for n in ast.walk(node) if n is not node}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            v = node.value
            if (isinstance(v, ast.Attribute) and v.attr == "speedups"
                    and isinstance(v.value, ast.Name) and v.value.id == "accel") or \
                    (name == "lockmq.accel" and isinstance(v, ast.Name) and v.id == "speedups"):
                out.append((node.attr, id(node) in in_function, node.lineno))
    return out


def test_the_core_is_chosen_once_and_required_whole() -> None:
    """Each host module takes what it calls of the compiled core at import, from the
    process's one choice (``lockmq.accel``), never per call; and ``accel.REQUIRED`` --
    what a build must carry to be used at all -- is exactly what the host calls."""
    from lockmq import accel

    uses = {m: _core_uses(m) for m in MODULES}
    per_call = [f"{m}:{line} reads speedups.{f} in a function"
                for m, got in uses.items() for f, fn, line in got if fn]
    assert per_call == []
    called = {f for got in uses.values() for f, _fn, _l in got}
    assert called == set(accel.REQUIRED), (sorted(called - set(accel.REQUIRED)),
                                           sorted(set(accel.REQUIRED) - called))
    # ... and only lockmq.accel loads the core (no module makes a choice of its own)
    loads = [m for m in MODULES if m != "lockmq.accel"
             for node in ast.walk(ast.parse(MODULES[m].read_text()))
             if isinstance(node, ast.ImportFrom) and node.module == "lockmq"
             and any(a.name == "_core" for a in node.names)
             or isinstance(node, ast.Import) and any(a.name == "lockmq._core" for a in node.names)]
    assert loads == []


def test_every_opcode_served_after_the_handshake_has_one_handler(broker) -> None:
    """The one dispatch table holds a handler for every opcode a session in
    ESTABLISHED may send (a feature that forgets to register fails here)."""
    from lockmq.protocol import Op

    handlers = broker.broker.handlers
    for op in (Op.PUBLISH, Op.HEARTBEAT, Op.DISCONNECT, Op.SUBSCRIBE, Op.UNSUBSCRIBE,
               Op.PULL, Op.ACK, Op.NACK, Op.COMMAND, Op.COMMAND_RESULT, Op.ADMIN_REQUEST,
               Op.PUBLISH_AT, Op.COMMAND_AT, Op.SCHEDULE_CANCEL, Op.TXN_PUBLISH,
               Op.TXN_END, Op.TXN_CHECK_ANSWER, Op.TXN_JOIN, Op.FW_FETCH):
        assert op in handlers, op
    assert broker.broker.services.handlers is handlers


def test_a_connection_takes_no_attribute_beyond_its_slots() -> None:
    assert not hasattr(Connection, "__dict__") or "__dict__" not in Connection.__slots__
    conn = Connection.__new__(Connection)
    with pytest.raises(AttributeError):
        conn.txn_groups = set()   # what transactions.py used to add


def test_extension_points_are_declared_when_the_broker_is_built(broker) -> None:
    """Replication and the registry announcer get narrow collaborators, never the
    broker, and nothing is patched onto a running one: the admin ops are declared
    once each, the durability gate once and before the core opens."""
    from lockmq.registry.announce import broker_announcer
    from lockmq.replication.primary import primary_source

    for hook in (primary_source, broker_announcer):
        assert "broker" not in inspect.signature(hook).parameters, hook.__name__
    for path in LOCKMQ_DIR.rglob("*.py"):
        if path.name != "core.py":
            src = path.read_text()
            assert not re.search(r"\.after_durable\s*=[^=]", src), path
            assert not re.search(r"admin\.ops\[[^]]+\]\s*=[^=]|admin\.ops\.update", src), path
    b = broker.broker
    assert {"replica.fetch", "replica.status", "scheduled.list", "txn.list"} <= set(b.admin.ops)
    with pytest.raises(ValueError, match="declared twice"):
        b.admin.declare({"ping": lambda args: {"ok": True}})
    with pytest.raises(RuntimeError, match="declared once"):
        b.core.gate_acks(lambda end, released: released(None))


def test_the_connection_is_a_peer() -> None:
    """Every member the ``Peer`` interface declares, the connection has (an
    attribute in its slots, or a method/property with the same parameters)."""
    from lockmq.broker.peer import Peer

    slots = {s for cls in Connection.__mro__ for s in getattr(cls, "__slots__", ())}
    for name in Peer.__annotations__:
        assert name in slots or hasattr(Connection, name), name
    for name, want in vars(Peer).items():
        if name.startswith("_") or not (callable(want) or isinstance(want, property)):
            continue
        got = getattr(Connection, name)
        if isinstance(want, property):
            assert isinstance(got, property), name
            continue
        assert [p.name for p in inspect.signature(got).parameters.values()] == \
            [p.name for p in inspect.signature(want).parameters.values()], name
