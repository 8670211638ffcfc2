"""The serial path (pyserial ``serial_for_url``) against a board served by vboard.

The "board" is the unix port behind :mod:`lockmq.hil.vboard`, in its own process,
on a pty (opened like /dev/ttyUSB0), on ``socket://`` and on ``rfc2217://`` (RTS
wired to the board's reset, as on an ESP32 dev board): the same bytes a real
board's UART carries. Also checks that unmodified mpremote drives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from lockmq.hil import Dut, SerialBoard
from lockmq.hil.virtual import find_micropython

pytestmark = [
    pytest.mark.skipif(find_micropython() is None, reason="MicroPython unix port not installed"),
    pytest.mark.filterwarnings("ignore:.*(setDaemon|setName).*:DeprecationWarning"),  # pyserial's rfc2217
]

APP = textwrap.dedent(
    """
    import time
    try:
        n = int(open('boots.txt').read())
    except OSError:
        n = 0
    f = open('boots.txt', 'w'); f.write(str(n + 1)); f.close()
    print('served boot', n + 1)
    while True:
        print('beat')
        time.sleep(0.2)
    """
)


class Served:
    """A vboard process; ``url`` is what pyserial opens."""

    def __init__(self, flash: Path, how: list[str], heapsize: str = "64K") -> None:
        self.flash = flash
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lockmq.hil.vboard", str(flash), *how, "--heapsize", heapsize],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "vboard ready <where> pid=<n>"
        assert line.startswith("vboard ready"), line
        self.url = line.split()[2]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(params=["pty", "tcp", "rfc2217"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "main.py").write_text(APP)
    how = {"pty": ["--pty", str(tmp_path / "board.tty")], "tcp": ["--tcp", "0"],
           "rfc2217": ["--rfc2217", "0"]}[request.param]
    s = Served(flash, how)
    yield s
    s.stop()


def test_serial_dut_exec_put_file_reset_and_power_cut(served: Served, tmp_path: Path) -> None:
    rfc2217 = served.url.startswith("rfc2217://")
    # RFC 2217 carries RTS, wired to EN: reset and power cut go through it. A pty or
    # a raw socket has no modem lines: soft reset through the REPL, and a power cut
    # by command (what a relay/uhubctl command does to a real board).
    cmd = None if rfc2217 else f"kill -USR1 {served.proc.pid}"
    board = SerialBoard(served.url, power_cut_cmd=cmd)
    assert board.reset_mode == ("rts" if rfc2217 else "repl")
    with Dut(board, log_path=tmp_path / "serial.log") as dut:
        dut.expect("beat")
        assert dut.exec("import sys\nprint(sys.implementation.name)") == "micropython\n"
        dut.put_file(b"\x00\x01binary\xff" * 300, "lib/x.bin")
        assert (served.flash / "lib" / "x.bin").read_bytes() == b"\x00\x01binary\xff" * 300
        dut.reset()  # soft reboot through the REPL reruns main.py
        dut.expect(r"served boot \d+")
        dut.expect("beat")
        before = int((served.flash / "boots.txt").read_text())
        dut.power_cut()
        dut.expect(f"served boot {before + 1}")


def test_mpremote_works_unmodified(served: Served, tmp_path: Path) -> None:
    mpremote = Path(sys.executable).with_name("mpremote")
    if not mpremote.exists():
        pytest.skip("mpremote not installed")
    src = tmp_path / "hello.py"
    src.write_text("print('hello from a copied file')\n")
    env = {**os.environ, "HOME": str(tmp_path)}
    run = lambda *a: subprocess.run([str(mpremote), "connect", served.url, *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60, env=env)
    cp = run("fs", "cp", str(src), ":hello.py")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert (served.flash / "hello.py").read_text() == src.read_text()
    ex = run("exec", "import hello")
    assert ex.returncode == 0 and "hello from a copied file" in ex.stdout, ex.stdout + ex.stderr


def test_lock_firmware_deployed_and_online_over_the_serial_path(tmp_path: Path, firmware_template: Path) -> None:
    """The --hil-target serial path end to end: deploy through the raw REPL, boot, connect."""
    from lockmq.hil.broker import BrokerProcess, broker_available
    from lockmq.hil.firmware import firmware_available, make_flash
    from lockmq.hil.lock import Lock

    why = firmware_available() or broker_available()
    if why:
        pytest.skip(why)
    empty = tmp_path / "board-flash"
    empty.mkdir()
    served = Served(empty, ["--tcp", "0"], heapsize="128K")  # a board with nothing on it yet
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        key = broker.provision(["SER0001"])["SER0001"]
        # the served board is the 64-bit port with nothing frozen in: it needs the .mpy
        # layout even when this run's first interpreter is mpy32-frozen (no lib/)
        template = firmware_template
        if not (template / "lib").exists():
            from lockmq.hil.firmware import build
            template = build(tmp_path / "template")
        flash = make_flash(template, tmp_path / "SER0001", "SER0001", key,
                           [broker.address], backoff_max_ms=2000, io_timeout_ms=3000)
        with Dut(SerialBoard(served.url), log_path=tmp_path / "serial.log", default_timeout=30) as dut:
            lock = Lock(dut, "SER0001", key, None)
            lock.deploy(flash, fresh=True)
            lock.wait_ready()
            lock.wait_online()
            lock.events("unlock", 3)
            lock.wait_drained(timeout=60)
        assert (empty / "lib" / "lockapp").is_dir()  # the code really went over the wire
        broker.stop()
        assert [r.seq for r in broker.records("lock.events", "SER0001")] == lock.queued_seqs()
    finally:
        broker.stop()
        served.stop()
