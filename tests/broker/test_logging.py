"""``[broker] log_file``: a real broker process writes its event lines to a file,
owner-only, and opens a new one when the file is moved away (as logrotate does)."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from lockmq.broker.logs import EventLog
from lockmq.protocol import Role

from lockmq.testing import open_peer

LOCKMQ = os.path.join(os.path.dirname(sys.executable), "lockmq")


def wait_for_line(path: Path, pattern: str, proc: subprocess.Popen,
                  timeout: float = 20.0) -> re.Match[str]:
    """The first line of ``path`` matching ``pattern``, waiting until it is written."""
    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while True:
        if path.exists():
            for line in path.read_text().splitlines():
                if m := rx.search(line):
                    return m
        assert proc.poll() is None, f"broker exited: {proc.stderr.read().decode()}"
        assert time.monotonic() < deadline, f"no line {pattern!r} in {path}"
        time.sleep(0.05)


def test_log_file_is_reopened_after_logrotate_moves_it(tmp_path):
    log = tmp_path / "log" / "broker.log"
    log.parent.mkdir()
    cfg = tmp_path / "lockmq.toml"
    cfg.write_text(f"""
[broker]
host = "127.0.0.1"
port = 0
status_port = 0
auth = "off"
data_dir = "{tmp_path / 'data'}"
log_file = "{log}"
log_level = "DEBUG"   # lock connects are logged at debug
""")
    proc = subprocess.Popen([LOCKMQ, "broker", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port = int(wait_for_line(log, r"event=broker_started .*\bport=(\d+)", proc)[1])
        assert stat.S_IMODE(log.stat().st_mode) == 0o600   # lines name SNs and peers

        rotated = log.with_name("broker.log.1")
        log.rename(rotated)                      # logrotate's default: move, no signal
        lock = open_peer(port, sn="LOCK-7", role=Role.LOCK)
        wait_for_line(log, r"event=device_online sn=LOCK-7 ", proc)
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert "LOCK-7" not in rotated.read_text()
        lock.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
    assert rc == 0
    assert "event=broker_stopped" in log.read_text()
    assert b"event=" not in proc.stderr.read()   # the file, not stderr


def test_json_lines_through_a_file(tmp_path):
    path = tmp_path / "events.log"
    log = EventLog("INFO", "json", log_file=str(path))
    log("member_join", cluster="backend", member=3)
    log("noise", level="debug")
    log.close()
    log("after_close")                        # dropped, and no stderr fallback
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [(r["event"], r["level"], r.get("cluster")) for r in lines] == [
        ("member_join", "info", "backend")]
