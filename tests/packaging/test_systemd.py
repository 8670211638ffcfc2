"""dist/: the systemd unit has the hardening a gateway service should have, agrees
with the example config, passes `systemd-analyze verify`, and the example config
passes the broker's own `--check-config`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "dist"
LOCKMQ = [sys.executable, "-c", "import sys, lockmq.cli; sys.exit(lockmq.cli.main())"]


def _unit_options(text: str) -> dict[str, list[str]]:
    """``{key: [values]}`` of a unit file (a key may repeat, e.g. SystemCallFilter)."""
    opts: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            opts.setdefault(key.strip(), []).append(value.strip())
    return opts


def test_unit_has_the_hardening_options_and_agrees_with_the_example_config():
    opts = _unit_options((DIST / "lockmq.service").read_text())
    one = {k: v[-1] for k, v in opts.items()}
    expected = {"User": "lockmq", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                "PrivateTmp": "yes", "ProtectHome": "yes", "CapabilityBoundingSet": "",
                "MemoryDenyWriteExecute": "yes", "Restart": "on-failure", "UMask": "0077"}
    assert {k: one.get(k) for k in expected} == expected
    assert set(one["RestrictAddressFamilies"].split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert int(one["LimitNOFILE"]) > 10_000   # a 10,000-lock connection storm
    config = "/etc/lockmq/broker.toml"
    assert one["ExecStartPre"].endswith(f"broker --config {config} --check-config")
    assert one["ExecStart"].endswith(f"broker --config {config}")
    # systemctl reload: the new file is checked, then SIGHUP reloads it (tests/ops)
    assert opts["ExecReload"][0].endswith(f"broker --config {config} --check-config")
    assert opts["ExecReload"][1] == "/bin/kill -HUP $MAINPID"
    # the data dir of the example config is the one place the unit lets it write
    data_dir = tomllib.loads((DIST / "lockmq.toml").read_text())["broker"]["data_dir"]
    assert data_dir in one["ReadWritePaths"].split()
    assert data_dir == "/var/lib/" + one["StateDirectory"]
    assert (DIST / "lockmq.sysusers").read_text().splitlines()[-1].split()[:2] == ["u", "lockmq"]


def test_systemd_analyze_verifies_the_unit_this_installation_prints(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here (Debian: apt-get install systemd)")
    unit = tmp_path / "lockmq.service"
    printed = subprocess.run(LOCKMQ + ["systemd-unit"], capture_output=True, text=True,
                             check=True).stdout
    unit.write_text(printed)
    # ExecStart= must name this installation's lockmq: verify checks it is executable
    assert f"ExecStart={Path(sys.executable).parent}/lockmq broker" in printed
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "lockmq.service" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_example_config_passes_the_brokers_check_once_its_files_exist(tmp_path):
    pytest.importorskip("cryptography")
    tls = tmp_path / "tls"
    r = subprocess.run(LOCKMQ + ["certs", "init", str(tls), "--host", "gw.local"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = (DIST / "lockmq.toml").read_text()
    text = text.replace("/etc/lockmq/tls", str(tls)).replace("/var/lib/lockmq",
                                                             str(tmp_path / "data"))
    config = tmp_path / "broker.toml"
    config.write_text(text)
    r = subprocess.run(LOCKMQ + ["broker", "--config", str(config), "--check-config"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # and as shipped, it names the first file the operator has not made yet
    r = subprocess.run(LOCKMQ + ["broker", "--config", str(DIST / "lockmq.toml"),
                                 "--check-config"], capture_output=True, text=True)
    assert r.returncode == 2 and "security.tls_cert" in r.stderr
