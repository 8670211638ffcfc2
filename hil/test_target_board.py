"""The chosen target's board itself, without the firmware: REPL and power.

Runs on every target (``--hil-target virtual`` by default, ``serial:PORT``, ``qemu``
including ``--hil-qemu-machine microbit``): it is the first thing to run on a new
bench to see that the rig can reach, drive and power-cycle the board.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lockmq.hil.target import TargetSpec

pytestmark = pytest.mark.hil


def test_board_repl_and_power_cycle(board_factory, hil_target: TargetSpec, tmp_path: Path) -> None:
    flash = tmp_path / "flash"
    flash.mkdir()
    (flash / "main.py").write_text("print('board up')\n")
    dut = board_factory("board", flash_dir=flash, default_timeout=30)
    assert dut.exec("print(6 * 7)") == "42\n"
    assert dut.exec("import sys\nprint(sys.implementation.name)") == "micropython\n"
    if not dut.board.can_power_cut:
        pytest.skip(f"{hil_target.label}: no power control (give --hil-power-cut-cmd)")
    dut.power_cut()
    assert dut.exec("print(1 + 2)") == "3\n"
