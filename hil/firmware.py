"""Flash folders for the boards, made with ``lockmq firmware build`` (firmware/README.md).

Building compiles the app with mpy-cross, which takes seconds; a fleet test needs
a hundred boards. So one *template* folder is built per session with the CLI and
each board gets a copy whose ``config.json`` (the documented shape: sn, key,
brokers, and any setting) is rewritten — exactly the files ``build`` would write
for that lock, minus the compile time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from lockmq.firmware_tools.deploy import STATE_FILES

from .broker import lockmq_cli

#: Files the app creates at run time (firmware/README.md); a fresh board has none.
TEMPLATE_SN = "TEMPLATE"
TEMPLATE_KEY = "00" * 32


def firmware_available() -> str | None:
    """None when ``lockmq firmware build`` exists here, else the reason it does not."""
    try:
        from lockmq.cli import GROUPS
    except ImportError as exc:  # pragma: no cover
        return f"the lockmq CLI is not importable: {exc}"
    if "firmware" not in GROUPS:
        return "`lockmq firmware build` is not in the CLI yet (firmware issue in progress)"
    from lockmq.firmware_tools.build import BuildError, firmware_src

    try:
        firmware_src()
    except BuildError as exc:
        return str(exc)
    return None


def build(out: Path, sn: str = TEMPLATE_SN, key: str = TEMPLATE_KEY,
          brokers: list[tuple[str, int]] | None = None, *extra: str) -> Path:
    """Run ``lockmq firmware build --out OUT ...`` (simulated hardware); return OUT."""
    args = [*lockmq_cli(), "firmware", "build", "--out", str(out), "--sn", sn, "--key", key, "--hw", "sim",
            "--no-image"]  # boards copy the folder; the QEMU image is made per lock
    for host, port in brokers or [("127.0.0.1", 9)]:
        args += ["--broker", f"{host}:{port}"]
    args += list(extra)
    res = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"lockmq firmware build failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    return out


def make_flash(template: Path, dest: Path, sn: str, key: str, brokers: list[tuple[str, int]],
               **settings: Any) -> Path:
    """A fresh board's flash folder: the template's code plus this lock's config.json."""
    if dest.exists():
        shutil.rmtree(dest)
    # the app's state stays behind; the cards the build wrote are the board's own
    shutil.copytree(template, dest,
                    ignore=shutil.ignore_patterns(*(f for f in STATE_FILES if f != "cards.bin")))
    write_config(dest, sn=sn, key=key, brokers=[list(b) for b in brokers], **settings)
    return dest


def write_config(flash: Path, **changes: Any) -> None:
    """Rewrite keys of ``flash/config.json`` (unknown keys are kept by the firmware)."""
    p = flash / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg, indent=1))
