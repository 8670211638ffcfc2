"""``lockmq broker --check-config`` refuses exactly what ``lockmq broker`` refuses.

Both run ``lockmq.config.validate_config``: each bad file below is refused by the
check *and* by a real start, with the same one line naming the file and the
setting (``table.key``), exit status 2 and no traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from lockmq.security.certs import init_ca_and_server

LOCKMQ = os.path.join(os.path.dirname(sys.executable), "lockmq")


def _lockmq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([LOCKMQ, *args], capture_output=True, text=True, timeout=60)


def _write(tmp_path, body: str) -> str:
    """A config file; ``body`` continues the ``[broker]`` table, then may open others."""
    path = tmp_path / "broker.toml"
    path.write_text(f'[broker]\nport = 0\nstatus_port = 0\ndata_dir = "{tmp_path}/data"\n'
                    + body)
    return str(path)


BAD = [
    ('[security]\nfoo = 1\n', "security.foo"),
    ('[security]\ntls_cert = "/nonexistent/server.pem"\ntls_key = "/nonexistent/server.key"\n',
     "security.tls_cert: /nonexistent/server.pem does not exist"),
    ('[store]\nretention_ms = -5\n', "store.retention_ms"),
    ('[consumers]\nretry_levels_s = ["1s"]\n', "consumers.retry_levels_s"),
    ('[security]\ntls_client_ca = "ca.pem"\n', "security.tls_client_ca"),
    ('[security]\nallow_plain_tokens_from = ["gateway"]\n', "security.allow_plain_tokens_from"),
]


@pytest.mark.parametrize("body,named", BAD, ids=[n for _, n in BAD])
def test_check_and_start_refuse_with_the_same_line(tmp_path, body, named):
    path = _write(tmp_path, body)
    check = _lockmq("broker", "--config", path, "--check-config")
    start = _lockmq("broker", "--config", path)
    for result in (check, start):
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"lockmq broker: bad configuration: {path}: ")
        assert named in result.stderr
    assert check.stderr == start.stderr
    assert not os.path.exists(tmp_path / "data"), "a refused start must not touch the data"


def test_tls_settings_with_auth_off_are_refused_not_ignored(tmp_path):
    files = init_ca_and_server(str(tmp_path / "tls"), ["localhost"], ["127.0.0.1"])
    path = _write(tmp_path, f'auth = "off"\n[security]\ntls_cert = "{files.server_pem}"\n'
                            f'tls_key = "{files.server_key}"\n')
    for args in (("--check-config",), ()):
        result = _lockmq("broker", "--config", path, *args)
        assert result.returncode == 2
        assert 'security.tls_cert is set but broker.auth = "off"' in result.stderr


def test_a_key_that_does_not_match_its_certificate_is_named(tmp_path):
    one = init_ca_and_server(str(tmp_path / "one"), ["localhost"], [])
    two = init_ca_and_server(str(tmp_path / "two"), ["localhost"], [])
    path = _write(tmp_path, f'[security]\ntls_cert = "{one.server_pem}"\n'
                            f'tls_key = "{two.server_key}"\n')
    result = _lockmq("broker", "--config", path, "--check-config")
    assert result.returncode == 2
    assert "security.tls_cert / security.tls_key" in result.stderr and one.server_pem in result.stderr


def test_a_file_that_passes_the_check_starts_the_broker(tmp_path):
    files = init_ca_and_server(str(tmp_path / "tls"), ["localhost"], ["127.0.0.1"])
    path = _write(tmp_path, f'[security]\ntls_cert = "{files.server_pem}"\n'
                            f'tls_key = "{files.server_key}"\ntls_port = 0\n')
    check = _lockmq("broker", "--config", path, "--check-config")
    assert (check.returncode, check.stdout.strip()) == (0, "configuration ok"), check.stderr
    proc = subprocess.Popen([LOCKMQ, "broker", "--config", path], stderr=subprocess.PIPE,
                            text=True)
    try:
        for line in proc.stderr:   # wait for the condition: the broker says it listens
            assert "level=error" not in line, line
            if "event=broker_started" in line:
                break
        else:
            pytest.fail(f"broker exited with {proc.wait()} before starting")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
