"""The virtual board: the real firmware in the MicroPython unix port, on a pty.

A board's file system is a *flash folder* (``main.py``, ``lib/``, ``config.json``,
and whatever the app writes at run time). Powering the board on runs::

    MICROPYPATH=lib:.frozen micropython -X heapsize=<N> main.py

in that folder, with ``HOME`` set to a private temporary folder.

The unix port *exits* where a board carries on; this wrapper respawns it so the
board behaves like one:

* exit from the raw REPL (Ctrl-D at an empty prompt: mpremote's soft reset) ->
  ``MPY: soft reboot``, back in the raw REPL, ``main.py`` not run;
* exit from the friendly REPL (Ctrl-D) -> ``MPY: soft reboot``, ``main.py`` runs;
* ``main.py`` returns, raises (status 1) or is interrupted by Ctrl-C (130) -> the
  REPL takes over (a fresh interpreter at ``>>>``), as on a board;
* ``main.py`` exits with another status (``sys.exit(n)``) -> ``MPY: soft reboot``
  and ``main.py`` runs again.

A board's UART buffers what the host sends and the REPL reads it in order; a
Ctrl-C that reaches the REPL while it is not running code is just a byte. The
unix port on a pty differs: whenever it switches its terminal between modes
(Ctrl-A entering the raw REPL, Ctrl-B leaving it, and while it starts) the pty
is briefly in cooked mode with SIGINT at its default action, and a Ctrl-C that
the pty processes in that moment kills the interpreter (status -2: the REPL
state is lost, and the kernel flushes the output it had not yet delivered). So
input written after such a byte is held until the prompt that shows the switch
is done, as it is after the Ctrl-C that ends ``main.py``.

A power cut is SIGKILL of the interpreter (nothing flushed, no ``finally``) and
a restart in the same folder: the files the app left are all that survives.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from .board import Board, Sink
from .pty_process import PtyProcess

RAW_BANNER = b"raw REPL; CTRL-B to exit"
SOFT_REBOOT = b"MPY: soft reboot\r\n"
PROMPTS = (b">>> ", RAW_BANNER)
#: Exit statuses of main.py after which the REPL takes over: it returned or called
#: sys.exit(0) (0), raised (1), was interrupted (130). Any other status (sys.exit(n))
#: is a request to reboot.
APP_TO_REPL = (0, 1, 130)
#: Longest time input is held waiting for a prompt (the app may catch
#: KeyboardInterrupt and carry on; then the input goes to it).
HOLD_MAX_S = 3.0
#: Bytes that may change what reads the board's input (see ``VirtualBoard._admit``).
_SWITCH_BYTES = re.compile(rb"[\x01\x02\x03]")


def find_micropython() -> str | None:
    """The unix-port interpreter: next to this Python (the venv) or on PATH."""
    import sys

    here = Path(sys.executable).with_name("micropython")
    if here.exists():
        return str(here)
    return shutil.which("micropython")


class VirtualBoard(Board):
    """The firmware in the unix port, its flash a folder, its UART a pty."""

    def __init__(
        self,
        flash_dir: str | os.PathLike[str],
        heapsize: str = "128K",
        name: str | None = None,
        micropython: str | None = None,
        script: str = "main.py",
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.flash_dir = Path(flash_dir)
        self.heapsize = heapsize
        self.name = name or f"virtual:{self.flash_dir.name}"
        self.script = script
        mp = micropython or find_micropython()
        if mp is None:
            raise FileNotFoundError("micropython (the unix port) is not installed")
        self.micropython = mp
        self._home = tempfile.mkdtemp(prefix="hil-home-")
        self._env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self._home,
            "MICROPYPATH": "lib:.frozen",
            **(extra_env or {}),
        }
        self._sink: Sink | None = None
        self._lock = threading.RLock()
        self._proc: PtyProcess | None = None
        self._generation = 0  # bumps on every spawn; stale exits are ignored
        self._raw = False
        self._want_raw_entry = False
        self._tail = b""
        self._closed = False
        self._app_running = False
        self._holding = False
        self._held = bytearray()
        self._hold_until: tuple[bytes, ...] = PROMPTS
        self._hold_id = 0  # a timer releases only the hold it was started for
        self._hold_timer: threading.Timer | None = None
        #: How many interpreters this board has started (boots + soft reboots).
        self.boots = 0

    # -- Board ------------------------------------------------------------------
    def attach(self, sink: Sink) -> None:
        self._sink = sink
        self._power_on()

    def write(self, data: bytes) -> None:
        with self._lock:
            if b"\x02" in data:
                self._raw = False
            data = self._admit(data)
            proc = self._proc
        if data and proc is not None:
            proc.write(data)

    def _admit(self, data: bytes) -> bytes:
        """The part of ``data`` the interpreter may get now; hold the rest (lock held).

        Input is cut after a byte that makes the interpreter change, and held
        until the prompt that shows the change is done:

        * Ctrl-C while ``main.py`` runs ends it; the REPL comes in a new
          interpreter (bytes sent meanwhile would go to the dying one) -> any prompt;
        * Ctrl-A at the friendly REPL -> the raw REPL's banner;
        * Ctrl-B (leaving the raw REPL) -> the friendly ``>>> ``.

        The last two switch the pty through cooked mode, where a Ctrl-C would
        kill the interpreter instead of reaching its REPL.
        """
        if self._holding:
            self._held += data
            return b""
        for m in _SWITCH_BYTES.finditer(data):
            byte = m.group()
            if byte == b"\x03" and self._app_running:
                until = PROMPTS
            elif byte == b"\x02" and not self._app_running:
                until = (b">>> ",)
            elif byte == b"\x01" and not self._app_running and not self._raw:
                until = (RAW_BANNER,)
            else:
                continue
            self._hold(until)
            self._held += data[m.end() :]
            return data[: m.end()]
        return data

    def _hold(self, until: tuple[bytes, ...]) -> None:
        """Hold input until the interpreter prints one of ``until`` (lock held)."""
        self._holding = True
        self._hold_until = until
        self._hold_id += 1
        if self._hold_timer is not None:
            self._hold_timer.cancel()
        timer = threading.Timer(HOLD_MAX_S, self._release_held, args=(self._hold_id,))
        timer.daemon = True
        timer.start()
        self._hold_timer = timer

    def _end_hold(self) -> bytes:
        """Stop holding (lock held); return the bytes that were held."""
        held, self._held, self._holding = bytes(self._held), bytearray(), False
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        return held

    def _release_held(self, hold_id: int) -> None:
        with self._lock:
            if not self._holding or hold_id != self._hold_id:
                return  # released already (a stale timer) or a later hold
            held = self._end_hold()
            data = self._admit(held)  # may hold again, after the next switch byte
            proc = self._proc
            if data and proc is not None:
                # Under the lock, so a write() racing this release cannot overtake
                # the bytes that were sent before it.
                proc.write(data)

    def reset(self) -> None:
        self.power_cut(0.0)

    def power_cut(self, off_s: float = 0.0) -> None:
        self._kill()
        if off_s > 0:
            time.sleep(off_s)
        with self._lock:
            if not self._closed:
                self._power_on()

    def power_off(self) -> None:
        """Cut power and stay off until :meth:`power_on` (a board held in reset)."""
        self._kill()

    def power_on(self) -> None:
        """Power on (no-op if running)."""
        with self._lock:
            if self._proc is None and not self._closed:
                self._power_on()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._kill()
        shutil.rmtree(self._home, ignore_errors=True)

    # -- helpers ----------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """Process id of the running interpreter, if any."""
        proc = self._proc
        return proc.pid if proc is not None and proc.alive() else None

    def _argv(self, run_main: bool) -> list[str]:
        argv = [self.micropython, "-X", f"heapsize={self.heapsize}"]
        if run_main:
            argv.append(self.script)
        return argv

    def _power_on(self) -> None:
        with self._lock:
            self._spawn(run_main=self._has_main())

    def _has_main(self) -> bool:
        # A board without main.py boots to the REPL (and must not respawn in a loop).
        return (self.flash_dir / self.script).exists()

    def _spawn(self, run_main: bool, enter_raw: bool = False) -> None:
        self._generation += 1
        gen = self._generation
        self._raw = False
        self._tail = b""
        self._want_raw_entry = enter_raw
        self._app_running = run_main
        if not run_main:
            # The new interpreter starts in cooked mode: keep input (a Ctrl-C above
            # all) from it until it is at its REPL, where the board puts it.
            self._hold((RAW_BANNER,) if enter_raw else PROMPTS)
        self.boots += 1
        self._proc = PtyProcess(
            self._argv(run_main),
            cwd=str(self.flash_dir),
            env=self._env,
            sink=lambda data, gen=gen: self._on_output(gen, data),
            on_exit=lambda rc, gen=gen: self._on_exit(gen, rc),
        )

    def _kill(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            self._generation += 1  # the dying process's exit is not a soft reboot
            # Input held for the old interpreter's next prompt never reaches it:
            # the board that boots next does not wait for that prompt.
            self._end_hold()
        if proc is not None:
            proc.kill(signal.SIGKILL)
            try:
                proc.wait(10)
            except Exception:  # pragma: no cover - a process that ignores SIGKILL
                pass

    def _on_output(self, gen: int, data: bytes) -> None:
        if gen != self._generation:
            # A killed interpreter's last bytes: they were sent before the power
            # went, so they arrive (the kill waits for them before power-on).
            if self._sink is not None:
                self._sink(data)
            return
        # Look only at new bytes (plus enough old ones for a match split across
        # reads): a prompt seen in an earlier read is not a new prompt.
        old = self._tail[-(len(RAW_BANNER) - 1) :]
        tail = old + data

        def new(pattern: bytes) -> bool:
            return tail.find(pattern, max(0, len(old) - len(pattern) + 1)) >= 0

        if new(RAW_BANNER):
            self._raw = True
        at_prompt = any(new(p) for p in PROMPTS)
        if at_prompt:
            self._app_running = False
        if self._want_raw_entry and new(b">>> "):
            # A soft reboot from the raw REPL comes back in the raw REPL.
            self._want_raw_entry = False
            # (under the lock: _spawn holds it until self._proc is this interpreter; an
            # interpreter that starts fast prints its prompt before the assignment, and
            # the Ctrl-A went to the one that had exited: mpremote's "could not enter
            # raw repl" after its soft reset, 1 session in 4 on the frozen 32-bit port)
            with self._lock:
                proc = self._proc if gen == self._generation else None
            if proc is not None:
                proc.write(b"\x01")
        self._tail = tail[-64:]
        if self._sink is not None:
            self._sink(data)
        with self._lock:
            release = self._holding and any(new(p) for p in self._hold_until)
            hold_id = self._hold_id
        if release:
            self._release_held(hold_id)

    def _on_exit(self, gen: int, rc: int) -> None:
        with self._lock:
            if gen != self._generation or self._closed:
                return  # killed on purpose (power cut) or closed
            if self._app_running and rc in APP_TO_REPL:
                self._spawn(run_main=False)  # main.py ended or failed: the REPL takes over
                return
            if self._sink is not None:
                self._sink(SOFT_REBOOT)
            self._spawn(run_main=not self._raw and self._has_main(), enter_raw=self._raw)
