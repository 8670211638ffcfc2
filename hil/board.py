"""The interface every target implements: a byte stream plus reset and power.

A :class:`Board` is what sits behind a :class:`~lockmq.hil.dut.Dut`: the virtual
board (the unix port on a pty), a real board on a serial port, or an emulator.
The DUT owns the captured output; the board only moves bytes and controls power.
"""

from __future__ import annotations

import abc
from typing import Callable

Sink = Callable[[bytes], None]


class Board(abc.ABC):
    """A board's UART and its power/reset lines."""

    #: A short label used in logs and failure reports, e.g. ``virtual:lock-0001``.
    name: str = "board"

    #: What this target can do; scenarios skip when a capability is missing.
    can_power_cut: bool = True

    @abc.abstractmethod
    def attach(self, sink: Sink) -> None:
        """Power on / open the port and deliver every byte the board prints to ``sink``."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Send bytes to the board's UART (its stdin)."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Hard-reset the board; the app starts again from ``main.py``."""

    @abc.abstractmethod
    def power_cut(self, off_s: float = 0.0) -> None:
        """Cut power at this instant (nothing is flushed), stay off ``off_s``, power on."""

    @abc.abstractmethod
    def close(self) -> None:
        """Power off / close the port for good."""
