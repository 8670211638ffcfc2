"""A lock under test: a DUT running the lock firmware, with its identity and log helpers.

The firmware's contract (firmware/README.md): one log line per event
(``I evt queued seq=17 type=unlock``, ``I evt acked seq=17``, ``I net connected
...``) and line commands on stdin for the simulated hardware (``card 0A1B2C3D``,
``event unlock 100``, ``status`` ...).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from lockmq.firmware_tools.deploy import STATE_FILES, deploy_over

from . import rawrepl
from .dut import Dut
from .errors import DutError

STATUS = re.compile(rb"I sys status q=(\d+) next_seq=(\d+) dropped=(\d+) link=(\w+)")
QUEUED = re.compile(r"I evt queued seq=(\d+) type=(\w+)")
ACKED = re.compile(r"I evt acked seq=(\d+)")
QUEUED_OR_RENUMBERED = re.compile(
    r"I evt queued seq=(\d+) type=\w+|(W sys seq provisional)"
    r"|W sys seq renumbered from=(\d+) to=(\d+) n=(\d+)")


class Lock:
    """The firmware on one board. Unknown attributes go to the :class:`Dut`."""

    def __init__(self, dut: Dut, sn: str, key: str, flash: Path | None,
                 source: Path | None = None) -> None:
        self.dut = dut
        self.sn = sn
        self.key = key
        #: The board's live file system on the host (virtual boards only).
        self.flash = flash
        #: The flash folder this board was made from (code + config), on the host.
        self.source = source or flash

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dut, name)

    def __repr__(self) -> str:
        return f"<Lock {self.sn} on {self.dut.name}>"

    # -- log ------------------------------------------------------------------------
    def full_log(self) -> str:
        """Everything the board printed in this test (from the log file when there is one)."""
        if self.dut.log_path and self.dut.log_path.exists():
            return self.dut.log_path.read_text(errors="replace")
        return self.dut.log_text()

    def queued_seqs(self) -> list[int]:
        """Sequence numbers the lock reported as durably queued, in log order.

        A fresh board numbers provisionally until its first connect, then moves
        those numbers above the broker's last seq (``W sys seq renumbered
        from=<s> to=<b> n=<k>``); the earlier ``queued`` lines are mapped the same way."""
        seqs: list[int] = []
        provisional_from = 0  # index of the first seq numbered provisionally
        for m in QUEUED_OR_RENUMBERED.finditer(self.full_log()):
            if m.group(1) is not None:
                seqs.append(int(m.group(1)))
            elif m.group(2) is not None:
                provisional_from = len(seqs)
            else:
                old, new, n = int(m.group(3)), int(m.group(4)), int(m.group(5))
                seqs[provisional_from:] = [s + (new - old) if old <= s < old + n else s
                                           for s in seqs[provisional_from:]]
        return seqs

    def acked_seqs(self) -> list[int]:
        """Sequence numbers the lock saw acknowledged, in log order."""
        return [int(m.group(1)) for m in ACKED.finditer(self.full_log())]

    def fail(self, message: str) -> DutError:
        """An assertion error carrying this board's output."""
        return DutError(message, self.dut.name, self.dut.log_tail())

    # -- actions --------------------------------------------------------------------
    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until ``I sys ready`` (stdin commands are accepted from then on)."""
        self.dut.expect(r"I sys ready", timeout)

    def wait_online(self, timeout: float = 30.0) -> re.Match[bytes]:
        """Until the next ``I net connected``."""
        return self.dut.expect(rb"I net connected broker=\S+", timeout)

    def command(self, line: str) -> None:
        """Send one simulated-hardware command line."""
        self.dut.writeline(line)

    def events(self, kind: str = "unlock", n: int = 1) -> None:
        """Ask the simulated hardware for ``n`` events of ``kind``."""
        self.command(f"event {kind} {n}")

    def status(self, timeout: float = 10.0) -> dict[str, Any]:
        """``status``: queue length, next sequence, dropped count, link state."""
        self.command("status")
        m = self.dut.expect(STATUS, timeout)
        return {"q": int(m.group(1)), "next_seq": int(m.group(2)),
                "dropped": int(m.group(3)), "link": m.group(4).decode()}

    def wait_drained(self, timeout: float = 60.0, poll_s: float = 0.5) -> dict[str, Any]:
        """Poll ``status`` until the offline queue is empty and the link is up."""
        deadline = time.monotonic() + timeout
        st: dict[str, Any] = {}
        while time.monotonic() < deadline:
            st = self.status()
            if st["q"] == 0 and st["link"] == "up":
                return st
            time.sleep(poll_s)
        raise self.fail(f"{self.sn}: queue not drained within {timeout:g} s (last status {st})")

    def deploy(self, flash: Path, fresh: bool = False) -> None:
        """Install a flash folder's code and config on the board the way ``lockmq
        firmware deploy`` does (:func:`lockmq.firmware_tools.deploy.deploy_over`: copied
        beside the running app, verified, swapped), through this board's DUT; then
        reset it. ``fresh`` first deletes the app's state files (a new board)."""
        if fresh:   # a new board: no state, and the cards its image holds (a deploy keeps both)
            self.dut.exec(f"import os\nfor f in {list(STATE_FILES)!r}:\n try:\n  os.remove(f)\n"
                          " except OSError:\n  pass\n", timeout=30)
            if (flash / "cards.bin").exists():
                self.dut.put_file(flash / "cards.bin", "cards.bin", timeout=30)
        deploy_over(DutLink(self.dut), flash, reset="none", say=lambda _: None)
        self.dut.reset()


class DutLink:
    """A deploy's raw-REPL sessions over a :class:`Dut` (its board's own transport:
    a virtual board's pty, a serial port, QEMU): the rig's
    :class:`lockmq.firmware_tools.deploy.Link`."""

    def __init__(self, dut: Dut) -> None:
        self.dut = dut

    def session(self, steps: list[tuple], timeout: float) -> tuple[int, str, str]:
        """Run ``steps`` at the raw REPL (the Link's contract); ``timeout`` bounds each
        exchange with the board."""
        out: list[str] = []
        rawrepl.enter_raw(self.dut)
        try:
            for step in steps:
                if step[0] == "exec":
                    out.append(rawrepl.exec_raw(self.dut, step[1], timeout))
                    continue
                if step[0] == "mkdir":
                    rawrepl.exec_raw(self.dut, f"import os\nos.mkdir({step[1]!r})", timeout)
                    continue
                local, remote = Path(step[1]), step[2]
                files = [(p, f"{remote}/{p.relative_to(local).as_posix()}")
                         for p in sorted(local.rglob("*")) if p.is_file()] if local.is_dir() \
                    else [(local, remote)]
                for path, board_path in files:
                    rawrepl.put_file(self.dut, path.read_bytes(), board_path, timeout)
        except DutError as exc:
            return 1, "".join(out), str(exc)
        finally:
            rawrepl.exit_raw(self.dut)
        return 0, "".join(out), ""

    def start(self, reset: str, boot_timeout: float) -> str | None:
        """A reset of the board (the caller reads its boot line)."""
        self.dut.reset()
        return None
