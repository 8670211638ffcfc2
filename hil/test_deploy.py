"""``lockmq firmware deploy`` (USB update) on a virtual board served as a serial port,
under each interpreter: a copy cut by a link reset leaves the old app running, and a
good deploy starts the new app, which reaches the broker with its queue intact
(docs/firmware.md, "deploy ... cannot brick")."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lockmq.client import Admin
from lockmq.hil.broker import BrokerProcess, lockmq_cli
from lockmq.hil.firmware import build, make_flash
from lockmq.hil.plugin import TEST_SETTINGS
from lockmq.hil.scenario import stored_seqs
from lockmq.testing.deploycut import cut_mid_copy

SN = "DEPLOY01"


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*lockmq_cli(), *args], capture_output=True, text=True, timeout=timeout)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _online(broker: BrokerProcess, token: str, timeout: float = 60) -> dict:
    """The lock's ``devices online`` entry once its heartbeat is in."""
    end = time.monotonic() + timeout
    with Admin(f"{broker.host}:{broker.port}", token=token) as admin:
        while True:
            devs = admin.request("devices", sn=SN)["devices"]
            if devs and "uptime_s" in devs[0]:
                return devs[0]
            assert time.monotonic() < end, f"{SN} not online: {devs}"
            time.sleep(0.2)


def test_a_cut_deploy_leaves_the_old_app_running_and_a_good_one_starts_the_new(
        broker: BrokerProcess, lock_factory, hil_interpreter, firmware_template: Path,
        tmp_path: Path, fault_proxy_factory) -> None:
    if hil_interpreter is None:
        pytest.skip("the virtual target's board is served as a serial port here")
    pytest.importorskip("serial")
    key = broker.provision([SN])[SN]
    token = broker.service_token("deploy-admin", "--admin")
    settings = {**TEST_SETTINGS, "heartbeat_s": 2}
    board = make_flash(firmware_template, tmp_path / "board", SN, key, [broker.address], **settings)
    # the new app as .mpy in lib/ (on a frozen board it goes before the image's app)
    new = firmware_template if not hil_interpreter.frozen else build(tmp_path / "mpy")
    new = make_flash(new, tmp_path / "new", SN, key, [broker.address], **settings)
    heap = "96K" if hil_interpreter.frozen else "160K"   # (the .mpy app on the frozen board)
    vb = subprocess.Popen([sys.executable, "-m", "lockmq.hil.vboard", str(board), "--tcp", "0",
                           "--heapsize", heap, "--micropython", hil_interpreter.exe],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = vb.stdout.readline()
        assert line.startswith("vboard ready socket://127.0.0.1:"), line
        proxy = fault_proxy_factory(("127.0.0.1", int(line.split()[2].rsplit(":", 1)[1])))
        url = f"socket://{proxy.address[0]}:{proxy.address[1]}"
        _online(broker, token)
        before = _tree(board / "lib") if (board / "lib").exists() else {}

        # the link reset under the copy, back at once (a cable blip): the deploy's
        # clean-up and restart then reach the board, whatever the moment they connect
        watcher = cut_mid_copy(board, proxy.reset, lambda: vb.poll() is None)
        p = _cli("firmware", "deploy", "--port", url, "--dir", str(new), "--boot-timeout", "20")
        watcher.join(5)
        assert p.returncode == 1, p.stdout + p.stderr
        assert "copy failed, nothing swapped" in p.stderr and "the old app runs again" in p.stderr, p.stderr
        assert (_tree(board / "lib") if (board / "lib").exists() else {}) == before
        assert not (board / "lib.new").exists(), p.stderr
        _online(broker, token)                            # the old app is back at the broker
        mon = _cli("firmware", "monitor", "--port", url, "--send", "event tamper 3",
                   "--until", r"^I evt queued seq=\d+ type=tamper", "--timeout", "20")
        assert mon.returncode == 0, mon.stdout

        p = _cli("firmware", "deploy", "--port", url, "--dir", str(new), "--reset", "soft")
        assert p.returncode == 0, p.stdout + p.stderr
        assert re.search(r"^app started: fw=\S+$", p.stdout, re.M), p.stdout
        assert _tree(board / "lib") == _tree(new / "lib")
        _online(broker, token)                            # the new app reaches the broker
        mon = _cli("firmware", "monitor", "--port", url, "--send", "status",
                   "--until", r"^I sys status q=0 ", "--timeout", "30")
        assert mon.returncode == 0, mon.stdout            # ... and sent what was queued
    finally:
        vb.terminate()
        vb.wait(10)
    broker.stop()
    seqs = stored_seqs(broker, SN)
    assert len(seqs) == len(set(seqs)) >= 3, seqs
