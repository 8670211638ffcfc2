"""``lockmq firmware image``: a MicroPython firmware ``.bin`` for the ESP32 with the lock
app frozen in, built by the MicroPython checkout's ESP32 port under ESP-IDF.

It needs what MicroPython's own ESP32 build needs, and says exactly what is missing
before starting (:func:`missing`): a MicroPython checkout with the ESP32 port
(``ports/esp32``) and its submodules, ESP-IDF (``$IDF_PATH`` with ``tools/idf.py``,
its environment exported by ``export.sh``: ``idf.py`` and the Xtensa compiler on
``PATH``), ``make`` and ``cmake``. Then it writes the manifest (:mod:`.frozen`) and runs::

    make -C <checkout>/ports/esp32 BOARD=<board> FROZEN_MANIFEST=<manifest dir>/esp32_manifest.py

and copies ``build-<board>/firmware.bin`` (bootloader, partition table and app, to be
written at 0x1000 by ``lockmq firmware flash``) to ``--out``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .build import BuildError
from .frozen import ESP32_MANIFEST, write_manifest

#: MicroPython's generic ESP32 board (4 MiB flash, partitions-4MiB.csv).
DEFAULT_BOARD = "ESP32_GENERIC"
#: The Xtensa compiler ESP-IDF's export.sh puts on PATH for an ESP32.
XTENSA_GCC = "xtensa-esp32-elf-gcc"


def missing(mpy_src: str | os.PathLike[str] | None, board: str = DEFAULT_BOARD,
            env: dict[str, str] | None = None) -> list[str]:
    """What the image build lacks here, each with how to get it (empty: all there)."""
    env = dict(os.environ if env is None else env)
    out = []
    if mpy_src is None:
        out.append("a MicroPython checkout: give --micropython-src DIR (git clone "
                   "https://github.com/micropython/micropython)")
    else:
        tree = Path(mpy_src)
        port = tree / "ports" / "esp32"
        if not (tree / "py" / "mpconfig.h").is_file():
            out.append(f"{tree} is not a MicroPython checkout (no py/mpconfig.h)")
        elif not (port / "Makefile").is_file():
            out.append(f"{tree} has no ESP32 port (ports/esp32/Makefile); the checkout is "
                       "partial (the unix-only source tarball has none): use a full git clone")
        else:
            if not (port / "boards" / board).is_dir():
                out.append(f"{port}/boards has no board {board!r}")
            if not any((tree / "lib" / "berkeley-db-1.xx").glob("*")):
                out.append(f"the checkout's submodules are missing: make -C {port} submodules")
    idf = env.get("IDF_PATH")
    if not idf:
        out.append("ESP-IDF: IDF_PATH is not set (install ESP-IDF v5.x, then `. $IDF_PATH/export.sh`)")
    elif not (Path(idf) / "tools" / "idf.py").is_file():
        out.append(f"ESP-IDF: IDF_PATH={idf} holds no tools/idf.py")
    path = env.get("PATH", "")
    if idf and not shutil.which("idf.py", path=path):
        out.append("ESP-IDF's environment is not exported: `. $IDF_PATH/export.sh` (idf.py is not on PATH)")
    if idf and not shutil.which(XTENSA_GCC, path=path):
        out.append(f"the ESP32 compiler {XTENSA_GCC} is not on PATH (`$IDF_PATH/install.sh esp32`, "
                   "then `. $IDF_PATH/export.sh`)")
    for tool in ("make", "cmake"):
        if not shutil.which(tool, path=path):
            out.append(f"{tool} is not installed")
    return out


def build_image(out: str | os.PathLike[str], mpy_src: str | os.PathLike[str] | None,
                manifest_dir: str | os.PathLike[str], board: str = DEFAULT_BOARD,
                jobs: int | None = None) -> Path:
    """Build the image (module docstring); returns ``out``. :class:`BuildError` lists
    what is missing, or carries the end of the failed build's output."""
    lacking = missing(mpy_src, board)
    if lacking:
        raise BuildError("cannot build the ESP32 image here; missing:\n  - " + "\n  - ".join(lacking))
    assert mpy_src is not None
    write_manifest(manifest_dir)
    port = Path(mpy_src) / "ports" / "esp32"
    manifest = (Path(manifest_dir) / ESP32_MANIFEST).resolve()
    proc = subprocess.run(["make", "-C", str(port), f"-j{jobs or os.cpu_count() or 2}",
                           f"BOARD={board}", f"FROZEN_MANIFEST={manifest}"],
                          capture_output=True, text=True, errors="replace")
    if proc.returncode != 0:
        raise BuildError(f"the ESP32 build failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    built = port / f"build-{board}" / "firmware.bin"
    if not built.is_file():
        raise BuildError(f"the build finished but {built} is not there")
    dst = Path(out)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built, dst)
    return dst
