"""The DUT and the virtual board, driven with a small MicroPython script (no firmware).

Real unix-port MicroPython on a real pty: expect and its timeout report, writes
to stdin, the raw REPL (exec, put_file, get_file), soft reboots, reset and power
cut (SIGKILL: no clean-up runs, files written before survive).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from lockmq.hil import Dut, DutExecError, DutTimeout, VirtualBoard
from lockmq.hil.virtual import find_micropython

pytestmark = pytest.mark.skipif(find_micropython() is None, reason="MicroPython unix port not installed")

# A tiny "app": counts boots in a file, echoes stdin lines, prints ticks.
APP = textwrap.dedent(
    """
    import sys, select, time
    try:
        n = int(open('boots.txt').read())
    except OSError:
        n = 0
    n += 1
    f = open('boots.txt', 'w'); f.write(str(n)); f.close()
    print('app boot', n)
    poll = select.poll(); poll.register(sys.stdin, select.POLLIN)
    t = 0
    try:
        while True:
            if poll.poll(50):
                line = sys.stdin.readline().strip()
                if line == 'reboot-me':
                    sys.exit(3)
                if line == 'crash':
                    raise ValueError('asked to crash')
                print('got', line)
            t += 1
            if t % 4 == 0:
                print('tick', t // 4)
    finally:
        print('clean shutdown')
    """
)

MakeDut = Callable[..., Dut]


@pytest.fixture
def make_dut(tmp_path: Path) -> MakeDut:
    duts: list[Dut] = []

    def make(name: str = "app", script: str = APP) -> Dut:
        flash = tmp_path / name
        flash.mkdir()
        (flash / "main.py").write_text(script)
        dut = Dut(VirtualBoard(flash, heapsize="64K", name=name), log_path=tmp_path / f"{name}.log")
        duts.append(dut)
        return dut

    yield make
    for d in duts:
        d.close()


def test_expect_reads_output_in_order(make_dut: MakeDut) -> None:
    dut = make_dut()
    assert dut.expect(r"app boot (\d+)").group(1) == b"1"
    first = int(dut.expect(r"tick (\d+)").group(1))
    second = int(dut.expect(r"tick (\d+)").group(1))
    assert second == first + 1
    assert dut.expect_exact("tick").group(0) == b"tick"


def test_expect_timeout_raises_with_the_output_so_far(make_dut: MakeDut) -> None:
    dut = make_dut()
    dut.expect("tick 1")
    with pytest.raises(DutTimeout) as info:
        dut.expect("this never appears", timeout=0.5)
    text = str(info.value)
    assert "this never appears" in text
    assert "app boot 1" in text and "tick 1" in text  # the log is attached
    assert info.value.dut_name == "app"
    assert isinstance(info.value, AssertionError)  # pytest shows it as a failure


def test_write_reaches_the_apps_stdin_without_echo(make_dut: MakeDut) -> None:
    dut = make_dut()
    dut.expect("app boot")
    dut.writeline("card 0A1B2C3D")
    dut.expect_exact("got card 0A1B2C3D")
    assert "\ncard 0A1B2C3D" not in dut.log_text()  # no tty echo in the log


def test_exec_runs_code_in_the_raw_repl(make_dut: MakeDut) -> None:
    dut = make_dut()
    dut.expect("tick 1")
    assert dut.exec("print(6 * 7)\nprint('x' * 3)") == "42\nxxx\n"
    with pytest.raises(DutExecError) as info:
        dut.exec("1 / 0")
    assert "ZeroDivisionError" in info.value.stderr
    # The REPL state persists between execs, as on a board.
    dut.exec("keep = 5")
    assert dut.exec("print(keep + 1)") == "6\n"


def test_back_to_back_execs_keep_one_interpreter(make_dut: MakeDut) -> None:
    # Each exec ends with Ctrl-B and the next starts with Ctrl-C at once. The unix
    # port leaves the raw REPL through cooked tty mode, where a Ctrl-C is SIGINT at
    # its default action: the board must hold it until the prompt, or the
    # interpreter dies and the state is lost (a race: many execs to catch it).
    dut = make_dut()
    dut.expect("tick 1")
    dut.exec("n = 0")
    boots = dut.board.boots
    for i in range(1, 301):
        assert dut.exec("n += 1\nprint(n)") == f"{i}\n"
    assert dut.board.boots == boots


def test_put_file_and_get_file_round_trip(make_dut: MakeDut, tmp_path: Path) -> None:
    dut = make_dut()
    dut.expect("app boot")
    blob = bytes(range(256)) * 13 + b"\x00\x04\x03tail"  # control bytes, several chunks
    dut.put_file(blob, "lib/deep/blob.bin")
    assert (tmp_path / "app" / "lib" / "deep" / "blob.bin").read_bytes() == blob
    assert dut.get_file("lib/deep/blob.bin") == blob
    src = tmp_path / "local.txt"
    src.write_text("from the host\n")
    dut.put_file(src, "local.txt")
    assert dut.exec("print(open('local.txt').read(), end='')") == "from the host\n"


def test_reset_restarts_the_app(make_dut: MakeDut) -> None:
    dut = make_dut()
    dut.expect("app boot 1")
    dut.reset()
    dut.expect("app boot 2")
    dut.expect("tick 1")


def test_power_cut_kills_without_cleanup_and_keeps_files(make_dut: MakeDut) -> None:
    dut = make_dut()
    dut.expect("app boot 1")
    dut.expect("tick 2")
    dut.power_cut(off_s=0.1)
    dut.expect("app boot 2")  # boots.txt survived the cut
    assert "clean shutdown" not in dut.log_text()  # no finally: the power just went
    assert dut.board.boots == 2  # type: ignore[attr-defined]


def test_crash_drops_to_the_repl_and_ctrl_d_soft_reboots(make_dut: MakeDut) -> None:
    dut = make_dut()
    dut.expect("app boot 1")
    dut.writeline("crash")
    dut.expect("ValueError: asked to crash")
    dut.expect(">>> ")  # the REPL takes over, like a board after main.py fails
    assert dut.exec("print('alive')") == "alive\n"
    dut.expect(">>> ")
    dut.write(b"\x04")  # Ctrl-D at the friendly REPL: soft reboot
    dut.expect_exact("MPY: soft reboot")
    dut.expect("app boot 2")  # main.py runs again, as on a board
    dut.writeline("reboot-me")
    dut.expect_exact("MPY: soft reboot")  # sys.exit(n) asks for a reboot
    dut.expect("app boot 3")


def test_main_returning_leaves_the_repl_without_respawning(make_dut: MakeDut) -> None:
    dut = make_dut(script="print('one shot')\n")
    dut.expect("one shot")
    dut.expect(">>> ")
    assert dut.exec("print(2 + 2)") == "4\n"
    assert dut.board.boots == 2  # type: ignore[attr-defined]  # main.py + the REPL, no loop
    assert dut.log_text().count("one shot") == 1


def test_several_duts_at_once(make_dut: MakeDut) -> None:
    duts = [make_dut(f"b{i}") for i in range(3)]
    for i, d in enumerate(duts):
        d.writeline(f"hello {i}")
    for i, d in enumerate(duts):
        d.expect_exact(f"got hello {i}")
        assert not re.search(rf"got hello (?!{i})", d.log_text())
