"""lockmq.hil: the hardware-in-the-loop rig for the lock firmware.

A device under test (:class:`Dut`: ``write``, ``expect``, ``expect_exact``,
``exec``, ``put_file``, ``reset``, ``power_cut``) over a board of the chosen
target: :class:`VirtualBoard` (the firmware in the MicroPython unix port on a
pty), :class:`SerialBoard` (a real board through pyserial's ``serial_for_url``)
or :class:`QemuBoard`; a fault-injecting TCP proxy (:class:`FaultProxy`); pytest
fixtures in :mod:`lockmq.hil.plugin`. How to run it: hil/README.md.
"""

from .board import Board
from .broker import BrokerProcess
from .dut import Dut
from .errors import DutError, DutExecError, DutTimeout
from .lock import Lock
from .proxy import FaultProxy
from .qemu_board import QemuBoard
from .serial_board import SerialBoard
from .target import TargetSpec, TargetUnavailable
from .virtual import VirtualBoard

__all__ = [
    "Board", "BrokerProcess", "Dut", "DutError", "DutExecError", "DutTimeout", "FaultProxy",
    "Lock", "QemuBoard",
    "SerialBoard", "TargetSpec", "TargetUnavailable", "VirtualBoard",
]
