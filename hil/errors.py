"""Rig errors: every one carries the board's captured output, for the failure report."""

from __future__ import annotations


class DutError(AssertionError):
    """A device-under-test did not do what the test expected.

    Subclasses ``AssertionError`` so pytest reports it as a test failure (not an
    error in the rig). ``log`` holds the board output captured so far.
    """

    def __init__(self, message: str, dut_name: str = "", log: str = "") -> None:
        self.dut_name = dut_name
        self.log = log
        text = message
        if log:
            text += f"\n---- output of {dut_name or 'the board'} (last {len(log)} chars) ----\n{log}\n---- end of output ----"
        super().__init__(text)


class DutTimeout(DutError):
    """``expect()`` waited ``timeout`` seconds without seeing the pattern."""


class DutExecError(DutError):
    """Code run through the raw REPL raised on the board (``stderr`` holds the traceback)."""

    def __init__(self, message: str, stderr: str, dut_name: str = "", log: str = "") -> None:
        self.stderr = stderr
        super().__init__(f"{message}\n{stderr}", dut_name, log)
