"""`lockmq systemd-unit`: print the systemd unit (and its companions) shipped in the
package, with ``ExecStart=`` pointing at this installation's ``lockmq``.

The files are ``dist/`` of the source tree, in the wheel as ``lockmq/systemd/``
(docs/install.md): ``lockmq.service`` (the unit), ``lockmq.sysusers`` (the
``lockmq`` system user) and ``lockmq.toml`` (an example broker config).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

#: Where the shipped unit expects lockmq (a venv in /opt/lockmq) and its config.
UNIT_LOCKMQ = "/opt/lockmq/bin/lockmq"
UNIT_CONFIG = "/etc/lockmq/broker.toml"
FILES = {"unit": "lockmq.service", "sysusers": "lockmq.sysusers", "config": "lockmq.toml"}


def shipped_file(name: str) -> Path:
    """Path of a file of ``dist/`` as installed with the package."""
    return Path(__file__).resolve().parent.parent / "systemd" / name


def this_lockmq() -> str:
    """The ``lockmq`` command of the running installation (venv or system)."""
    beside = Path(sys.executable).parent / "lockmq"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("lockmq") or UNIT_LOCKMQ


def render_unit(lockmq: str, config: str) -> str:
    """The shipped unit with its lockmq command and config path replaced."""
    text = shipped_file(FILES["unit"]).read_text()
    return text.replace(UNIT_LOCKMQ, lockmq).replace(UNIT_CONFIG, config)


def _print(args: argparse.Namespace) -> int:
    if args.file == "unit":
        sys.stdout.write(render_unit(args.lockmq or this_lockmq(), args.config))
    else:
        sys.stdout.write(shipped_file(FILES[args.file]).read_text())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `systemd-unit` command."""
    p = subparsers.add_parser(
        "systemd-unit", help="print the systemd unit for this installation",
        description="Print the hardened systemd unit of the lockmq broker, with ExecStart= "
                    "pointing at this installation's lockmq: lockmq systemd-unit > "
                    "/etc/systemd/system/lockmq.service (docs/install.md).")
    p.add_argument("--file", choices=sorted(FILES), default="unit",
                   help="what to print: the unit (default), the sysusers.d line of the "
                        "lockmq user, or the example broker config")
    p.add_argument("--config", default=UNIT_CONFIG,
                   help=f"broker config the unit starts with (default {UNIT_CONFIG})")
    p.add_argument("--lockmq", metavar="PATH",
                   help="lockmq command for ExecStart= (default: this installation's)")
    p.set_defaults(func=_print)
