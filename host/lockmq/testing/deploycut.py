"""Break a board's link in the middle of a deploy's copy, by the copy's progress.

``lockmq firmware deploy`` copies the new app beside the running one (``lib.new/``)
before it swaps anything (:mod:`lockmq.firmware_tools.deploy`). A test of the cut
copy watches that folder on a virtual board (its flash is a folder on the host) and
breaks the link once part of the app is there: the moment depends on the copy's
progress, never on a sleep, so a slow or a fast machine cuts at the same point.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

#: ``.mpy`` files in ``lib.new/`` when the link is cut: about a quarter of the app's.
CUT_AFTER_FILES = 8


def cut_mid_copy(flash: Path, cut: Callable[[], None], alive: Callable[[], bool],
                 after_files: int = CUT_AFTER_FILES, poll_s: float = 0.01) -> threading.Thread:
    """Start (and return) a daemon thread that calls ``cut()`` once, as soon as the
    board whose flash folder is ``flash`` holds ``after_files`` ``.mpy`` files in
    ``lib.new/``; it ends without cutting when ``alive()`` turns false (the board
    stopped). Join it after the deploy."""

    def watch() -> None:
        while alive():
            if len(list((flash / "lib.new").rglob("*.mpy"))) >= after_files:
                cut()
                return
            time.sleep(poll_s)

    thread = threading.Thread(target=watch, name="deploy-cut", daemon=True)
    thread.start()
    return thread
