"""The QEMU plumbing, on Debian's qemu-system-arm micro:bit running MicroPython 1.9.2.

Skips cleanly when ``qemu-system-arm`` or ``firmware-microbit-micropython`` is not
installed. The emulated UART is reached through the serial path (a pty that QEMU
opens), exactly as Espressif's QEMU will be.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lockmq.hil import Dut, QemuBoard
from lockmq.hil.qemu_board import MICROBIT_HEX, qemu_argv

QEMU = shutil.which("qemu-system-arm")
pytestmark = pytest.mark.skipif(
    QEMU is None or not os.path.exists(MICROBIT_HEX),
    reason="needs Debian packages qemu-system-arm and firmware-microbit-micropython",
)


def test_qemu_microbit_boots_micropython_and_runs_the_raw_repl(tmp_path: Path) -> None:
    assert QEMU is not None
    with Dut(QemuBoard(QEMU, "microbit", MICROBIT_HEX), log_path=tmp_path / "qemu.log",
             default_timeout=30) as dut:
        assert dut.exec("import sys\nprint(sys.implementation.name, 6 * 7)") == "micropython 42\n"
        out = dut.exec("for i in range(3):\n    print('line', i)")
        assert out.splitlines() == ["line 0", "line 1", "line 2"]
        dut.power_cut()  # kill QEMU and boot it again
        dut.expect("MicroPython v1", timeout=30)
        assert dut.exec("print(1 + 2)") == "3\n"


def test_esp32_command_line_matches_pytest_embedded() -> None:
    argv = qemu_argv("qemu-system-xtensa", "esp32", "flash.bin")
    assert argv[:2] == ["qemu-system-xtensa", "-nographic"]
    assert "-machine" in argv and argv[argv.index("-machine") + 1] == "esp32"
    assert "file=flash.bin,if=mtd,format=raw" in argv
