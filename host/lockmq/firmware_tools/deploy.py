"""Install a flash folder on a board already running MicroPython, so that no instant
of the copy can leave it without a working app.

Three sessions at the board's raw REPL, then the app is started. A :class:`Link`
carries them: mpremote runs (:class:`MpremoteLink`, ``lockmq firmware deploy``) or the
HIL rig's DUT (``lockmq.hil.lock.DutLink``, ``Lock.deploy``): one deploy for both.

1. **copy** the new code beside the running one (``lib.new/``, ``main.py.new``,
   ``config.json.new``) and **verify** it: the board hashes every file it received
   (SHA-256) and the digests must equal the folder's. Any failure removes the copy
   and restarts the old app, untouched;
2. **swap**: ``lockboot`` and ``main.py.new`` over their old files (atomic renames on
   LittleFS; ``lockboot`` first: the new ``main.py`` imports it), then
   ``lib`` -> ``lib.old``, ``lib.new`` -> ``lib``, then ``lib.old`` removed. A power
   cut between the two ``lib`` renames leaves ``lib.old`` and no ``lib``: the boot
   module (``firmware/lockboot.py``) renames it back and boots the old app;
3. **start**: ``hard`` runs ``machine.reset()``; ``soft`` (and a board that is still at
   its REPL after the reset, like the unix port, which has no ``machine.reset``) leaves
   the raw REPL (Ctrl-B) and soft-reboots at the friendly REPL (Ctrl-D), which runs
   ``main.py``. Then the board's log must show ``I sys boot fw=...`` within
   ``boot_timeout`` seconds, or the deploy fails saying so.

The app's state files (queue, sequence numbers, command ids, cards) are never copied
or touched: queued events survive an update.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Protocol

from .build import BuildError, firmware_src

#: Files the app writes at run time: never overwritten by a deploy.
STATE_FILES = ("queue.dat", "seq.dat", "seq.dat.bak", "cmd.dat", "cards.bin", "fatal.dat")

RESETS = ("hard", "soft", "none")

def _boot_helpers() -> str:
    """``_has`` and ``rm`` of the board's boot module (``firmware/lockboot.py``), as
    source for the scripts below: one copy of the file helpers for the boot, the update
    over the air (``lockapp/ota.py`` imports them) and this deploy, which runs them over
    the raw REPL before the board's own ``lockboot`` is known to be whole."""
    src = (firmware_src() / "lockboot.py").read_text()
    funcs = [ast.get_source_segment(src, n) for n in ast.parse(src).body
             if isinstance(n, ast.FunctionDef) and n.name in ("_has", "rm")]
    return "import os\n" + "".join(f + "\n" for f in funcs if f)


_HELPERS = _boot_helpers()

# A copy left by an earlier, interrupted deploy is removed first.
_CLEAN = _HELPERS + ("for p in ('lib.new','main.py.new','config.json.new','lockboot.mpy.new',"
                      "'lockboot.py.new'):\n rm(p)\nprint('CLEAN')\n")

# Prints one line: DIGESTS {relative path: sha256 hex} of what the board received.
_VERIFY = _HELPERS + (
    "import hashlib,binascii\n"
    "_d={}\n"
    "def _h(p):\n"
    " h=hashlib.sha256()\n"
    " f=open(p,'rb')\n"
    " while True:\n"
    "  b=f.read(512)\n"
    "  if not b:\n"
    "   break\n"
    "  h.update(b)\n"
    " f.close()\n"
    " return binascii.hexlify(h.digest()).decode()\n"
    "def _walk(p):\n"
    " for n in os.listdir(p):\n"
    "  q=p+'/'+n\n"
    "  if os.stat(q)[0]&0x4000:\n"
    "   _walk(q)\n"
    "  else:\n"
    "   _d[q]=_h(q)\n"
    "_walk('lib.new')\n"
    "for p in ('main.py.new','config.json.new','lockboot.mpy.new','lockboot.py.new'):\n"
    " if _has(p):\n"
    "  _d[p]=_h(p)\n"
    "print('DIGESTS',_d)\n"
)

# The swap (module docstring). An update under way over the air is abandoned: the
# app it would install is replaced by this one.
_SWAP = _HELPERS + (
    "for p in ('ota.dat','ota.bin'):\n"
    " rm(p)\n"
    "rm('lib.old')\n"
    "for p in ('lockboot.mpy','lockboot.py','main.py','config.json'):\n"
    " if _has(p+'.new'):\n"
    "  os.rename(p+'.new',p)\n"
    "if _has('lib'):\n"
    " os.rename('lib','lib.old')\n"
    "os.rename('lib.new','lib')\n"
    "rm('lib.old')\n"
    "print('SWAPPED')\n"
)

_BOOT_LINE = re.compile(rb"I sys boot fw=(\S+)")

# mpremote with TCP_NODELAY on a ``socket://`` port (ser2net, an ESP-Link, the rig's
# virtual board): a UART sends each byte as it comes, while Nagle holds every small
# write of the raw REPL's request/answer exchange for the peer's delayed ACK (an app's
# copy took ~2.5 times as long). pyserial sets it for rfc2217:// only.
_RUN_MPREMOTE = (
    "import socket, sys\n"
    "_connect = socket.create_connection\n"
    "def _nodelay(*a, **k):\n"
    "    s = _connect(*a, **k)\n"
    "    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
    "    return s\n"
    "socket.create_connection = _nodelay\n"
    "from mpremote.main import main\n"
    "sys.exit(main())\n"
)


def mpremote_argv(port: str, *args: str) -> list[str]:
    """``mpremote connect PORT ARGS...`` run by this interpreter (see ``_RUN_MPREMOTE``)."""
    return [sys.executable, "-c", _RUN_MPREMOTE, "connect", port, *args]


class DeployError(Exception):
    """The deploy failed; the message says at which step and what the board runs."""


def local_digests(folder: str | Path, config: bool = True) -> dict[str, str]:
    """What the board must hold after the copy: ``{board path: sha256 hex}``."""
    root = Path(folder)
    out = {}
    lib = root / "lib"   # (none in a --frozen build: its app is the image's)
    for p in sorted(lib.rglob("*")) if lib.is_dir() else []:
        if p.is_file():
            out["lib.new/" + p.relative_to(root / "lib").as_posix()] = _sha(p)
    out["main.py.new"] = _sha(root / "main.py")
    for boot in root.glob("lockboot.*"):
        out[boot.name + ".new"] = _sha(boot)
    if config and (root / "config.json").is_file():
        out["config.json.new"] = _sha(root / "config.json")
    return out


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def check_folder(folder: str | Path, reset: str = "hard") -> Path:
    """The flash folder, or :class:`BuildError` saying why it cannot be deployed."""
    root = Path(folder)
    # (no lib/: a --frozen build, whose app is the image's; the board gets an empty lib/)
    if not (root / "main.py").is_file():
        raise BuildError(f"{root} is not a flash folder (no main.py): run `lockmq firmware build`")
    if reset not in RESETS:
        raise BuildError("--reset must be hard, soft or none")
    return root


#: One step of a raw-REPL session: ``("exec", script)``, ``("mkdir", board path)`` or
#: ``("cp", local, board path)`` (a local folder is copied with everything below it).
Step = tuple


class Link(Protocol):
    """How a deploy reaches the board's raw REPL: :class:`MpremoteLink` (``lockmq
    firmware deploy``, any port mpremote opens) or the HIL rig's DUT
    (``lockmq.hil.lock.DutLink``): one deploy, whatever carries its bytes."""

    def session(self, steps: list[Step], timeout: float) -> tuple[int, str, str]:
        """Run ``steps`` in one raw-REPL session, in order, stopping at the first that
        fails: ``(status, output, error text)``, status 0 when all ran."""
        ...

    def start(self, reset: str, boot_timeout: float) -> str | None:
        """Start the app (:data:`RESETS`; module docstring, step 3); the version of its
        boot line, None when the link does not read it. Raises :class:`DeployError`."""
        ...


class MpremoteLink:
    """A board on ``port`` (a serial device, ``socket://``, ``rfc2217://``), through
    mpremote: each session is one ``mpremote connect PORT step + step ...`` run."""

    def __init__(self, port: str, baud: int = 115200) -> None:
        self.port = port
        self.baud = baud

    def argv(self, steps: list[Step]) -> list[str]:
        """The mpremote command line of a session."""
        args: list[str] = []
        for step in steps:
            if args:
                args.append("+")
            if step[0] == "exec":
                args += ["exec", step[1]]
            elif step[0] == "mkdir":
                args += ["fs", "mkdir", ":" + step[1]]
            else:
                local, remote = Path(step[1]), step[2]
                args += ["fs", "cp", *(["-r"] if local.is_dir() else []), str(local), ":" + remote]
        return mpremote_argv(self.port, *args)

    def session(self, steps: list[Step], timeout: float) -> tuple[int, str, str]:
        proc = _mpremote(self.argv(steps), timeout)
        return proc.returncode, proc.stdout, (proc.stderr or proc.stdout).strip()

    def start(self, reset: str, boot_timeout: float) -> str | None:
        return start_app(self.port, reset, boot_timeout, self.baud)


def copy_steps(stage: Path, config: bool) -> list[Step]:
    """Step 1's session: clean, copy beside the running app, print the digests."""
    # an empty lib.new/ (a --frozen build) is made, not copied: `fs cp -r` skips it
    lib = ("cp", stage / "lib.new", "lib.new") if any((stage / "lib.new").iterdir()) \
        else ("mkdir", "lib.new")
    steps: list[Step] = [("exec", _CLEAN), lib, ("cp", stage / "main.py", "main.py.new")]
    steps += [("cp", boot, f"{boot.name}.new") for boot in sorted(stage.glob("lockboot.*"))]
    if config:
        steps.append(("cp", stage / "config.json", "config.json.new"))
    return steps + [("exec", _VERIFY)]


def board_digests(output: str) -> dict[str, str] | None:
    """The ``DIGESTS {...}`` line of step 1's output, or None."""
    for line in output.splitlines():
        if line.startswith("DIGESTS "):
            text = line[len("DIGESTS "):].replace("'", '"')
            try:
                return json.loads(text)
            except ValueError:
                return None
    return None


def _mpremote(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(argv, 124, e.stdout or "", (e.stderr or "") + " (timed out)")


def start_app(port: str, reset: str, boot_timeout: float, baud: int = 115200) -> str:
    """Start the app after the swap (module docstring, step 3); returns the version in
    its boot line. Raises :class:`DeployError` when the board does not boot it."""
    import serial

    ser = serial.serial_for_url(port, baudrate=baud, timeout=0.2, do_not_open=True)
    try:
        ser.dtr = ser.rts = False      # opening must not hold a dev board in reset
    except (OSError, ValueError):
        pass                           # (a pty or socket:// has no such lines)
    ser.open()
    buf = b""
    try:
        if reset == "hard":
            ser.write(b"\r\x03\x03\x02import machine\r\nmachine.reset()\r\n")
            nudge = time.monotonic() + 3.0     # still at the REPL then: no machine.reset
        else:
            ser.write(b"\r\x03\x03\x02\x04")
            nudge = None
        end = time.monotonic() + boot_timeout
        while time.monotonic() < end:
            buf += ser.read(4096)
            m = _BOOT_LINE.search(buf)
            if m:
                return m.group(1).decode(errors="replace")
            if nudge is not None and (time.monotonic() > nudge or b"Error" in buf):
                ser.write(b"\x02\x04")        # friendly REPL, soft reboot: runs main.py
                nudge = None
            buf = buf[-4096:]
    finally:
        ser.close()
    raise DeployError(f"the app did not start: no 'I sys boot' line within {boot_timeout:g} s "
                      f"(last output: {buf[-300:].decode(errors='replace')!r})")


def deploy(port: str, folder: str | Path, *, config: bool = True, reset: str = "hard",
           boot_timeout: float = 30.0, step_timeout: float = 300.0,
           say: Callable[[str], None] = print) -> str | None:
    """Install ``folder`` on the board at ``port`` (module docstring) with mpremote:
    :func:`deploy_over` an :class:`MpremoteLink`."""
    return deploy_over(MpremoteLink(port), folder, config=config, reset=reset,
                       boot_timeout=boot_timeout, step_timeout=step_timeout, say=say)


def deploy_over(link: Link, folder: str | Path, *, config: bool = True, reset: str = "hard",
                boot_timeout: float = 30.0, step_timeout: float = 300.0,
                say: Callable[[str], None] = print) -> str | None:
    """Install ``folder`` on the board that ``link`` reaches (module docstring).
    Returns the version the board booted (None with ``reset="none"``: not started,
    or when the link does not read it). Raises :class:`DeployError`; after a failed
    copy the old app has been restarted."""
    root = check_folder(folder, reset)
    config = config and (root / "config.json").is_file()
    want = local_digests(root, config)
    with tempfile.TemporaryDirectory(prefix="lockmq-deploy-") as tmp:
        stage = Path(tmp)
        if (root / "lib").is_dir():
            shutil.copytree(root / "lib", stage / "lib.new")
        else:
            (stage / "lib.new").mkdir()
        shutil.copyfile(root / "main.py", stage / "main.py")
        for boot in root.glob("lockboot.*"):
            shutil.copyfile(boot, stage / boot.name)
        if config:
            shutil.copyfile(root / "config.json", stage / "config.json")
        status, out, err = link.session(copy_steps(stage, config), step_timeout)
    got = board_digests(out)
    if status != 0 or got != want:
        if status != 0:
            why = f"the copy exited {status}: {err[-300:]}"
        elif got is None:
            why = "the board printed no digests"
        else:
            bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
            why = f"{len(bad)} file(s) differ on the board: {', '.join(bad[:5])}"
        status, out, err = link.session([("exec", _CLEAN)], 60)
        if status != 0 or "CLEAN" not in out:
            why += ("; the partial copy was not removed (the next deploy removes it: "
                    f"{err[-200:]})")
        try:
            fw = link.start("soft", boot_timeout)
            state = "the old app runs again" + (f" (fw={fw})" if fw else "")
        except Exception as e:  # noqa: BLE001 -- the board may be unreachable
            state = f"the old app is in place but was not restarted ({e})"
        raise DeployError(f"copy failed, nothing swapped: {why}; {state}")
    say(f"copied and verified {len(want)} files")
    status, out, err = link.session([("exec", _SWAP)], 120)
    if status != 0 or "SWAPPED" not in out:
        raise DeployError(f"the swap did not finish ({err[-300:]}); "
                          "at its next boot the board runs the old app or the new one, whole")
    say("swapped")
    if reset == "none":
        say("not started (--reset none): the board is at its REPL; Ctrl-D there runs main.py")
        return None
    fw = link.start(reset, boot_timeout)
    say("app started" + (f": fw={fw}" if fw else ""))
    return fw
