"""The pytest side of the rig: options, fixtures, and board logs on every failure.

Registered as the pytest plugin ``lockmq-hil`` through lockmq's ``pytest11`` entry
point, so any pytest run where lockmq is installed has these options and fixtures
(``-p no:lockmq-hil`` turns it off). It loads without the firmware extra: targets
that need a missing tool skip and name it. Options::

    --hil-target virtual | serial:PORT | qemu
    --hil-qemu-path PATH  --hil-qemu-machine esp32|microbit  --hil-qemu-firmware FILE
    --hil-interpreter mpy64,mpy32-frozen  --hil-mpy-src DIR
    --hil-heapsize 160K  --hil-baud 115200  --hil-power-cut-cmd CMD  --hil-board-broker-host HOST

Fixtures: ``hil_target`` (the :class:`TargetSpec`), ``board_factory`` (make DUTs
on the chosen target; they are closed after the test and their output is attached
to the report of a failing test), ``fault_proxy_factory``, and for the scenarios
``firmware_template`` (one ``lockmq firmware build`` per session), ``broker`` (a
``lockmq broker`` process) and ``lock_factory`` (a provisioned lock running the
firmware on the chosen target). Missing pieces skip with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from .broker import BrokerProcess, broker_available
from .dut import Dut
from lockmq.testing.micropython import (INTERPRETERS, Interpreter, get_interpreter,
                                        interpreter_unavailable)

from .firmware import TEMPLATE_KEY, TEMPLATE_SN, build, firmware_available, make_flash
from .lock import Lock
from .ports import PortRange
from .proxy import FaultProxy
from .target import TargetSpec, TargetUnavailable

_DUTS_KEY = pytest.StashKey[list]()
_BROKERS_KEY = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("hil", "lockmq hardware-in-the-loop rig")
    g.addoption("--hil-target", default="virtual",
                help="virtual (default), serial:PORT (pyserial URL: /dev/ttyUSB0, socket://h:p, "
                     "rfc2217://h:p) or qemu")
    g.addoption("--hil-qemu-path", default=None, help="QEMU binary (Espressif's qemu-system-xtensa for esp32)")
    g.addoption("--hil-qemu-machine", default="esp32", choices=["esp32", "microbit"],
                help="QEMU machine: esp32 (Espressif's fork) or microbit (Debian's qemu-system-arm)")
    g.addoption("--hil-qemu-firmware", default=None,
                help="esp32: MicroPython firmware .bin merged into the flash image; microbit: .hex")
    g.addoption("--hil-heapsize", default="160K",
                help="virtual boards: micropython -X heapsize= (the scenarios test behaviour; the app's heap figure is measured by bench/bench_firmware.py)")
    g.addoption("--hil-baud", type=int, default=115200, help="serial target baud rate")
    g.addoption("--hil-power-cut-cmd", default=None,
                help="serial target: shell command that cuts power and restores it "
                     "({off} = seconds off), e.g. a uhubctl or relay command")
    g.addoption("--hil-flash-template", default=None,
                help="use this flash folder (from `lockmq firmware build`) instead of building one")
    g.addoption("--hil-interpreter", default=",".join(INTERPRETERS),
                help="virtual boards: the interpreters the lock tests run on, comma-separated: "
                     "mpy64 (64-bit unix port, app as .mpy in lib/, --hil-heapsize) and mpy32-frozen "
                     "(32-bit, app frozen in as on an ESP32 image, 64K heap; built once and cached). "
                     "Default: both")
    g.addoption("--hil-mpy-src", default=None, metavar="DIR",
                help="build the mpy32-frozen interpreter from this MicroPython source tree "
                     "(default: the shared toolchain's build-micropython32.sh)")
    g.addoption("--hil-ports", default=None, metavar="LO-HI",
                help="listen only on ports from this range (the rig's broker, its status page, "
                     "fault proxies); default: any free port")
    g.addoption("--hil-board-broker-host", default="127.0.0.1",
                help="address the board uses to reach the rig's broker (a LAN address for a real board)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hil: hardware-in-the-loop test (runs on the --hil-target board)")
    # pyserial's rfc2217 client still calls Thread.setDaemon/setName.
    config.addinivalue_line("filterwarnings", "ignore:.*(setDaemon|setName).*:DeprecationWarning")
    config.addinivalue_line("markers", "virtual_only: needs many boards or host access to the flash; "
                                       "skipped on serial and qemu targets")


def pytest_report_header(config: pytest.Config) -> str:
    target = config.getoption("--hil-target")
    if target != "virtual":
        return f"hil target: {target}"
    return f"hil target: virtual ({config.getoption('--hil-interpreter')})"


def _interpreter_names(config: pytest.Config) -> list[str]:
    names = [n.strip() for n in config.getoption("--hil-interpreter").split(",") if n.strip()]
    bad = [n for n in names if n not in INTERPRETERS]
    if bad or not names:
        raise pytest.UsageError(f"--hil-interpreter: {', '.join(bad) or 'empty'}; "
                                f"choose from {', '.join(INTERPRETERS)}")
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """On the virtual target, every test with a lock runs once per ``--hil-interpreter``."""
    # (the rig's lock_factory, not another folder's fixture of the same name)
    names = metafunc.fixturenames
    if "lock_factory" in names and "hil_interpreter" in names \
            and metafunc.config.getoption("--hil-target") == "virtual":
        metafunc.parametrize("hil_interpreter", _interpreter_names(metafunc.config),
                             indirect=True, scope="session")


@pytest.fixture(scope="session")
def hil_interpreter(request: pytest.FixtureRequest, hil_target: TargetSpec) -> Interpreter | None:
    """The interpreter of this test's virtual boards (skips with the reason when it
    cannot be built here); None on other targets. Tests without a lock get the first
    ``--hil-interpreter``."""
    if hil_target.kind != "virtual":
        return None
    name = getattr(request, "param", None) or _interpreter_names(request.config)[0]
    mpy_src = request.config.getoption("--hil-mpy-src")
    why = interpreter_unavailable(name, mpy_src)
    if why:
        pytest.skip(f"{name}: {why}")
    return get_interpreter(name, mpy_src)


@pytest.fixture(scope="session")
def hil_target(pytestconfig: pytest.Config) -> TargetSpec:
    """The target this run drives."""
    opt = pytestconfig.getoption
    return TargetSpec.parse(
        opt("--hil-target"),
        baudrate=opt("--hil-baud"),
        power_cut_cmd=opt("--hil-power-cut-cmd"),
        qemu_path=opt("--hil-qemu-path"),
        qemu_machine=opt("--hil-qemu-machine"),
        qemu_firmware=opt("--hil-qemu-firmware"),
        heapsize=opt("--hil-heapsize"),
        board_broker_host=opt("--hil-board-broker-host"),
    )


@pytest.fixture(autouse=True)
def _virtual_only(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("virtual_only") and request.config.getoption("--hil-target") != "virtual":
        pytest.skip(f"needs the virtual target (running on {request.config.getoption('--hil-target')})")


BoardFactory = Callable[..., Dut]


@pytest.fixture
def board_factory(request: pytest.FixtureRequest, hil_target: TargetSpec, tmp_path: Path) -> Iterator[BoardFactory]:
    """``make(name, flash_dir=None, heapsize=None, micropython=None) -> Dut`` on the
    chosen target (``micropython``: a virtual board's interpreter).

    Skips the test (with the reason) when the target cannot run here or when the
    test wants more boards than the target has.
    """
    duts: list[Dut] = []
    request.node.stash[_DUTS_KEY] = duts

    def make(name: str, flash_dir: Path | None = None, heapsize: str | None = None,
             default_timeout: float = 10.0, micropython: str | None = None) -> Dut:
        if len(duts) >= hil_target.max_boards:
            pytest.skip(f"{hil_target.label} has {hil_target.max_boards} board(s); this test needs more")
        try:
            board = hil_target.make_board(name, flash_dir, heapsize, micropython, index=len(duts))
        except TargetUnavailable as exc:
            pytest.skip(str(exc))
        dut = Dut(board, name=name, log_path=tmp_path / f"{name}.log", default_timeout=default_timeout)
        duts.append(dut)
        return dut

    yield make
    for dut in reversed(duts):
        try:
            dut.close()
        except Exception:  # a board that will not close must not hide the test's result
            pass


@pytest.fixture
def fault_proxy_factory(hil_ports: PortRange) -> Iterator[Callable[[tuple[str, int]], FaultProxy]]:
    """``make((host, port)) -> FaultProxy`` (started; closed after the test)."""
    proxies: list[FaultProxy] = []

    def make(upstream: tuple[str, int]) -> FaultProxy:
        p = FaultProxy(upstream, port=hil_ports.take() if hil_ports.bounds else 0).start()
        proxies.append(p)
        return p

    yield make
    for p in proxies:
        p.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach every board's captured output to the report of a failed phase."""
    outcome = yield
    report = outcome.get_result()
    if report.passed or report.skipped:
        return
    for dut in item.stash.get(_DUTS_KEY, []):
        where = f" (full log: {dut.log_path})" if dut.log_path else ""
        report.sections.append((f"board {dut.name} output{where}", dut.log_tail()))
    for b in item.stash.get(_BROKERS_KEY, []):
        report.sections.append((f"broker log ({b.log_path})", b.log_tail()))


#: Settings every scenario lock gets (bounded waits; the defaults suit the field).
TEST_SETTINGS: dict[str, object] = {
    "backoff_min_ms": 100,
    "backoff_max_ms": 2000,
    "io_timeout_ms": 3000,
    "heartbeat_s": 5,
}


@pytest.fixture(scope="session")
def firmware_template(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config,
                      hil_interpreter: Interpreter | None) -> Path:
    """One flash folder built with ``lockmq firmware build`` (copied for every lock);
    ``--frozen`` (no lib/) for an interpreter with the app frozen in."""
    given = pytestconfig.getoption("--hil-flash-template")
    if given:
        return Path(given)
    why = firmware_available()
    if why:
        pytest.skip(why)
    work = tmp_path_factory.mktemp("firmware")
    if hil_interpreter is not None and hil_interpreter.frozen:
        return build(work / "template", TEMPLATE_SN, TEMPLATE_KEY, None,
                     "--frozen", "--manifest-dir", str(work / "manifest"))
    return build(work / "template")


@pytest.fixture(scope="session")
def hil_ports(pytestconfig: pytest.Config) -> PortRange:
    """Where the rig listens (``--hil-ports``)."""
    try:
        return PortRange(pytestconfig.getoption("--hil-ports"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


@pytest.fixture
def broker(request: pytest.FixtureRequest, tmp_path: Path, hil_target: TargetSpec,
           hil_ports: PortRange) -> Iterator[BrokerProcess]:
    """A running ``lockmq broker`` (auth required, durable acks) for this test;
    its log is attached to the report when the test fails."""
    why = broker_available()
    if why:
        pytest.skip(why)
    host = hil_target.board_broker_host
    ports = hil_ports
    b = BrokerProcess(tmp_path / "broker", port=ports.take(host), host=host,
                      tables={"broker": {"status_port": ports.take("127.0.0.1")}}
                      if ports.bounds else None)
    request.node.stash.setdefault(_BROKERS_KEY, []).append(b)
    b.start()
    try:
        yield b
    finally:
        b.stop()
        # kept in tmp_path for a post-mortem: b.log_path


LockFactory = Callable[..., Lock]


#: a lock's log line when it refused a frame's MAC tag and dropped the session: with
#: no one on the path altering bytes, the broker sealed a frame with the wrong counter
MAC_REFUSED = "net down err=mac"


@pytest.fixture
def lock_factory(board_factory: BoardFactory, hil_target: TargetSpec, firmware_template: Path,
                 tmp_path: Path, hil_interpreter: Interpreter | None) -> Iterator[LockFactory]:
    """``make(sn, key, brokers, heapsize=None, **settings) -> Lock``: a fresh lock board.

    ``brokers``: the addresses the lock dials (the broker's, or a fault proxy's).
    ``settings`` go into config.json on top of :data:`TEST_SETTINGS`.

    After the test, a lock that refused a broker frame's tag (:data:`MAC_REFUSED`)
    fails it: the lock reconnects and the scenario may still pass, which would hide a
    broker that tags a frame with the wrong counter.
    """
    if not hil_target.runs_firmware:
        pytest.skip(f"{hil_target.label} cannot run the lock firmware (no file system or network); "
                    "only the rig's own tests run there")

    def make(sn: str, key: str, brokers: list[tuple[str, int]], heapsize: str | None = None,
             **settings: object) -> Lock:
        flash = make_flash(firmware_template, tmp_path / "boards" / sn, sn, key, brokers,
                           **{**TEST_SETTINGS, **settings})
        if hil_interpreter is not None:  # the virtual target
            # the 64-bit port at --hil-heapsize; the frozen 32-bit one at its ESP32-like heap
            heap = heapsize or (hil_interpreter.heap if hil_interpreter.frozen else None)
            return Lock(board_factory(sn, flash, heap, micropython=hil_interpreter.exe), sn, key, flash)
        if hil_target.kind == "qemu":
            return Lock(board_factory(sn, flash, heapsize, default_timeout=30.0), sn, key, None, flash)
        lock = Lock(board_factory(sn, None, heapsize, default_timeout=20.0), sn, key, None, flash)
        lock.deploy(flash, fresh=True)
        return lock

    def made(sn: str, key: str, brokers: list[tuple[str, int]], heapsize: str | None = None,
             **settings: object) -> Lock:
        lock = make(sn, key, brokers, heapsize, **settings)
        locks.append(lock)
        return lock

    locks: list[Lock] = []
    yield made
    refused = [lock.sn for lock in locks if MAC_REFUSED in lock.full_log()]
    assert not refused, f"locks {refused} refused a broker frame's MAC tag ({MAC_REFUSED!r})"
