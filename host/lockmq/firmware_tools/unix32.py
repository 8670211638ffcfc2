"""A 32-bit MicroPython unix port with the lock app frozen in, as on an ESP32 image.

Objects and pointers have an ESP32's sizes and the app's bytecode lives in the
executable (as in a board's flash), so its heap figures are the board's, measured
on this machine. Built the way the shared toolchain's ``build-micropython32.sh``
does (from its MicroPython 1.28 source tarball, or from a MicroPython source tree
given by the user; needs Debian's ``gcc-multilib``, ~30 s) but with the REPL's line
editor on (``MICROPY_USE_READLINE=1``): without it the unix port has no raw REPL,
which the HIL rig's deploy uses as on a board. Cached under
``~/.cache/lockmq/mpy32/<hash of the frozen code>/micropython``: built once, rebuilt
when the app or the protocol changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .frozen import manifest_digest, write_manifest

#: Where the shared toolchain's script is looked for, next to the checkout's parents.
TOOLCHAIN_SCRIPT = Path("shared/toolchain/build-micropython32.sh")


class Unix32Unavailable(Exception):
    """The 32-bit interpreter cannot be built here; the message says why."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lockmq" / "mpy32"


def find_toolchain() -> Path | None:
    """``build-micropython32.sh``: ``$LOCKMQ_MPY32_TOOLCHAIN`` (the script or its folder),
    else ``shared/toolchain/`` beside a parent folder of this checkout."""
    given = os.environ.get("LOCKMQ_MPY32_TOOLCHAIN")
    if given:
        p = Path(given)
        p = p / TOOLCHAIN_SCRIPT.name if p.is_dir() else p
        return p if p.exists() else None
    for parent in Path(__file__).resolve().parents:
        if (parent / TOOLCHAIN_SCRIPT).exists():
            return parent / TOOLCHAIN_SCRIPT
    return None


def missing_gcc_m32() -> str | None:
    """None when ``gcc -m32`` links a program, else the reason."""
    if shutil.which("gcc") is None:
        return "gcc is not installed"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(["gcc", "-m32", "-x", "c", "-", "-o", os.path.join(tmp, "a")],
                              input="#include <stdio.h>\nint main(void){return 0;}\n",
                              capture_output=True, text=True)
    if proc.returncode != 0:
        return "gcc cannot build 32-bit programs (Debian: apt-get install gcc-multilib)"
    return None


def unavailable(mpy_src: str | os.PathLike[str] | None = None) -> str | None:
    """None when the interpreter can be built, else the reason (tests skip with it)."""
    if mpy_src is None and find_toolchain() is None:
        return ("the 32-bit MicroPython toolchain (shared/toolchain/build-micropython32.sh) is "
                "not found; set LOCKMQ_MPY32_TOOLCHAIN or give a MicroPython source tree")
    if mpy_src is not None and not (Path(mpy_src) / "ports" / "unix").is_dir():
        return f"{mpy_src} is not a MicroPython source tree (no ports/unix)"
    return missing_gcc_m32()


def _unpack_toolchain(out: Path) -> Path:
    """The shared toolchain's MicroPython source tarball, unpacked in ``out``."""
    script = find_toolchain()
    assert script is not None
    tarballs = sorted(script.parent.glob("micropython-*-src.tar.gz"))
    if not tarballs:
        raise Unix32Unavailable(f"no micropython-*-src.tar.gz beside {script}")
    subprocess.run(["tar", "xzf", str(tarballs[-1]), "-C", str(out)], check=True, capture_output=True)
    for ports in out.glob("*/ports/unix"):
        return ports.parent.parent
    raise Unix32Unavailable(f"{tarballs[-1]} holds no MicroPython source tree")


def _make_from_tree(tree: Path, out: Path, manifest: Path) -> None:
    """build-micropython32.sh's recipe (asyncio and ``manifest`` frozen, 32-bit, no
    ssl/ffi/btree), with the REPL line editor on (module docstring)."""
    top = out / "manifest.py"
    top.write_text(f'include("$(MPY_DIR)/extmod/asyncio")\ninclude("{manifest}")\n')
    jobs = f"-j{os.cpu_count() or 2}"
    subprocess.run(["make", "-s", "-C", str(tree / "mpy-cross"), jobs], check=True,
                   capture_output=True)
    subprocess.run(["make", "-s", "-C", str(tree / "ports" / "unix"), jobs, f"BUILD={out / 'build'}",
                    "CC=gcc -m32", "LD=gcc -m32", "MICROPY_PY_FFI=0", "MICROPY_PY_SSL=0",
                    "MICROPY_SSL_MBEDTLS=0", "MICROPY_PY_BTREE=0", "MICROPY_USE_READLINE=1",
                    f"FROZEN_MANIFEST={top}"], check=True, capture_output=True)
    shutil.copyfile(out / "build" / "micropython", out / "micropython")
    os.chmod(out / "micropython", 0o755)
    # a 32-bit build with asyncio frozen in, or the make flags did not take
    subprocess.run([str(out / "micropython"), "-c", "import sys, asyncio; assert sys.maxsize == 2**31 - 1"],
                   check=True, capture_output=True, env={"HOME": str(out)})


def _recipe_digest(mpy_src: Path | None) -> str:
    if mpy_src is not None:
        return "tree:" + str(mpy_src.resolve())
    script = find_toolchain()
    assert script is not None
    h = hashlib.sha256(script.read_bytes() + b"readline=1")
    for tarball in sorted(script.parent.glob("*.tar.gz")):
        st = tarball.stat()
        h.update(f"{tarball.name}:{st.st_size}".encode())
    return h.hexdigest()


def build_unix32(manifest_dir: str | os.PathLike[str], mpy_src: str | os.PathLike[str] | None = None,
                 cache: str | os.PathLike[str] | None = None) -> Path:
    """The 32-bit interpreter freezing ``manifest_dir`` (from :func:`write_manifest`),
    built if not cached; returns its path. Raises :class:`Unix32Unavailable`."""
    why = unavailable(mpy_src)
    if why:
        raise Unix32Unavailable(why)
    tree = Path(mpy_src) if mpy_src is not None else None
    key = hashlib.sha256((manifest_digest(manifest_dir) + _recipe_digest(tree)).encode()).hexdigest()[:16]
    root = Path(cache) if cache is not None else cache_root()
    exe = root / key / "micropython"
    if exe.exists():   # (put in place by os.replace: whole) -- no wait for another key's build
        return exe
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lockfile:
        fcntl.flock(lockfile, fcntl.LOCK_EX)  # two test sessions build it once
        if exe.exists():
            return exe
        with tempfile.TemporaryDirectory(prefix="mpy32-") as tmp:
            out = Path(tmp)
            manifest = Path(manifest_dir).resolve() / "manifest.py"
            try:
                _make_from_tree(tree if tree is not None else _unpack_toolchain(out), out, manifest)
            except subprocess.CalledProcessError as e:
                tail = (e.stderr or b"")[-2000:]
                raise Unix32Unavailable(f"building the 32-bit interpreter failed: {tail!r}") from None
            exe.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / "micropython", exe.with_suffix(".tmp"))
            os.chmod(exe.with_suffix(".tmp"), 0o755)
            os.replace(exe.with_suffix(".tmp"), exe)
    return exe


def frozen_app_interpreter(mpy_src: str | os.PathLike[str] | None = None,
                           cache: str | os.PathLike[str] | None = None) -> Path:
    """The 32-bit interpreter with this install's app and protocol frozen in (cached)."""
    with tempfile.TemporaryDirectory(prefix="lockapp-frozen-") as tmp:
        write_manifest(tmp)
        return build_unix32(tmp, mpy_src=mpy_src, cache=cache)
