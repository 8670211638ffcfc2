"""The rig among other pytest plugins: every option of ``lockmq-hil`` is namespaced
(``--hil-...``), so a run with Espressif's pytest-embedded installed (its ``--target``,
``--port``, ``--baud``, ``--qemu-*``) starts, and both plugins' options are there."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

GROUP = "lockmq hardware-in-the-loop rig"


def _help(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider", *extra],
                          capture_output=True, text=True, timeout=120)


def _rig_options(text: str) -> list[str]:
    section = text.split(GROUP + ":", 1)[1]
    section = re.split(r"\n\S", section, maxsplit=1)[0]     # up to the next group
    return re.findall(r"^  (--[\w-]+)", section, re.M)


def test_every_rig_option_is_namespaced() -> None:
    p = _help("-p", "no:pytest_embedded")
    assert p.returncode == 0, p.stderr
    opts = _rig_options(p.stdout)
    assert "--hil-target" in opts and "--hil-interpreter" in opts and "--hil-ports" in opts
    assert all(o.startswith("--hil-") for o in opts), opts


def test_the_rig_and_pytest_embedded_together() -> None:
    pytest.importorskip("pytest_embedded")
    p = _help()
    assert p.returncode == 0, p.stderr            # was: ValueError: option dest 'target' already used
    assert re.search(r"^  --target", p.stdout, re.M) and "--hil-target" in p.stdout


def test_ports_from_a_range() -> None:
    import socket

    from lockmq.hil.ports import PortRange

    r = PortRange("23100-23109")
    got = {r.take() for _ in range(5)}
    assert len(got) == 5 and all(23100 <= p <= 23109 for p in got)
    with socket.socket() as held:            # a port in use is passed over
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        one = PortRange(f"{busy}-{busy}")
        with pytest.raises(OSError, match="no free port left"):
            one.take()
    assert PortRange(None).take() > 0
    for bad in ("2000", "b-c", "9-1", "0-10"):
        with pytest.raises(ValueError, match="LO-HI"):
            PortRange(bad)
