"""Copy a flash folder onto a board already running MicroPython, with mpremote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .build import BuildError

#: Files the app writes at run time: never overwritten by a deploy.
STATE_FILES = ("queue.dat", "seq.dat", "seq.dat.bak", "cmd.dat", "cards.bin")

# Removes /lib on the board (old modules must not linger), tolerating its absence.
_RM_LIB = (
    "import os\n"
    "def _rm(p):\n"
    " try:\n"
    "  m=os.stat(p)[0]\n"
    " except OSError:\n"
    "  return\n"
    " if m&0x4000:\n"
    "  for n in os.listdir(p):\n"
    "   _rm(p+'/'+n)\n"
    "  os.rmdir(p)\n"
    " else:\n"
    "  os.remove(p)\n"
    "_rm('lib')\n"
)


def mpremote_argv(port: str, folder: str | Path, *, config: bool = True,
                  reset: str = "hard") -> list[str]:
    """One mpremote invocation (commands chained with ``+``) that installs ``folder``."""
    root = Path(folder)
    if not (root / "main.py").is_file() or not (root / "lib").is_dir():
        raise BuildError(f"{root} is not a flash folder (no main.py / lib/): run `lockmq firmware build`")
    if reset not in ("hard", "soft", "none"):
        raise BuildError("--reset must be hard, soft or none")
    argv = [sys.executable, "-m", "mpremote", "connect", port, "exec", _RM_LIB,
            "+", "fs", "cp", "-r", str(root / "lib"), ":lib",
            "+", "fs", "cp", str(root / "main.py"), ":main.py"]
    if config and (root / "config.json").is_file():
        argv += ["+", "fs", "cp", str(root / "config.json"), ":config.json"]
    if reset == "hard":
        argv += ["+", "reset"]
    elif reset == "soft":
        argv += ["+", "soft-reset"]
    return argv


def deploy(port: str, folder: str | Path, **kw) -> int:
    """Run mpremote; returns its exit status."""
    return subprocess.call(mpremote_argv(port, folder, **kw))
