"""The MicroPython manifest that freezes the lock app into a board's firmware image.

Frozen modules are compiled into the firmware and run from flash: their bytecode
never takes heap, which on an ESP32 is the difference between the app using most
of the heap and fitting with room (docs/firmware.md, "Memory"). Layout written by
:func:`write_manifest` (``lockmq firmware build --frozen``)::

    DIR/manifest.py                    freezes lockapp and lockmq.protocol (below)
    DIR/esp32_manifest.py              the ESP32 port's own manifest + manifest.py:
                                       make BOARD=ESP32_GENERIC FROZEN_MANIFEST=DIR/esp32_manifest.py
    DIR/modules/lockapp/*.py           the app, with _version.py stamped
    DIR/modules/lockmq/__init__.py     empty
    DIR/modules/lockmq/protocol/*.py   the protocol package as the board imports it

Paths inside a manifest are relative to it, so the folder can be moved or copied
to the machine that has ESP-IDF.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

MANIFEST = "manifest.py"
ESP32_MANIFEST = "esp32_manifest.py"
MODULES = "modules"

_MANIFEST_TEXT = """\
# The lock app and the lockmq protocol, frozen (written by `lockmq firmware build --frozen`).
# Include it from a board manifest, or pass it as FROZEN_MANIFEST where the port's own
# modules (asyncio) are frozen already.
package("lockapp", base_path="modules")
package("lockmq", base_path="modules")
"""

_ESP32_TEXT = """\
# An ESP32 image: MicroPython's own frozen modules (asyncio, ...) plus the lock app.
#   make -C ports/esp32 BOARD=ESP32_GENERIC FROZEN_MANIFEST=$PWD/esp32_manifest.py
include("$(PORT_DIR)/boards/manifest.py")
include("manifest.py")
"""


def write_manifest(folder: str | os.PathLike[str]) -> Path:
    """Write the manifest folder (module docstring); returns the path of ``manifest.py``.

    The modules are copied as ``.py``: the firmware build compiles them with its own
    mpy-cross, so they always match the interpreter's bytecode version.
    """
    from .build import write_modules

    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    if (root / MODULES).exists():
        shutil.rmtree(root / MODULES)  # a module removed from the app must not linger
    write_modules(root / MODULES, source=True)
    (root / ESP32_MANIFEST).write_text(_ESP32_TEXT)
    manifest = root / MANIFEST
    manifest.write_text(_MANIFEST_TEXT)
    return manifest


def manifest_digest(folder: str | os.PathLike[str]) -> str:
    """A hash of everything the manifest freezes (names and bytes): the cache key of
    an interpreter built from it."""
    root = Path(folder)
    h = hashlib.sha256()
    files = [root / MANIFEST] + sorted((root / MODULES).rglob("*.py"))
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]
