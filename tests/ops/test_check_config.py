"""``lockmq broker --check-config`` refuses what the broker would then refuse, as the
user the service runs as; ``--print-config`` is complete; ``certs renew`` keeps the
owner and mode of what it replaces. Every case runs the real ``lockmq`` command."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest

from lockmq.testing.process import LOCKMQ_COMMAND

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def lockmq(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOCKMQ_COMMAND, *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def check(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return lockmq("broker", "--config", str(config), "--check-config", "--as-user", "",
                  *extra)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def one_line_refusal(r: subprocess.CompletedProcess[str], *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_two_listeners_on_one_port_are_refused_by_the_check_and_the_start(tmp_path):
    cfg = write(tmp_path / "b.toml", f'[broker]\nport = 46800\nstatus_port = 46800\n'
                                     f'data_dir = "{tmp_path}/data"\n')
    line = one_line_refusal(check(cfg), "broker.status_port = 46800", "broker.port")
    start = lockmq("broker", "--config", str(cfg))
    assert one_line_refusal(start) == line   # the broker itself refuses the same way


def test_log_file_in_a_missing_directory_is_refused(tmp_path):
    cfg = write(tmp_path / "b.toml", f'[broker]\ndata_dir = "{tmp_path}/data"\n'
                                     f'log_file = "{tmp_path}/nowhere/broker.log"\n')
    one_line_refusal(check(cfg), "broker.log_file", "does not exist")
    assert not (tmp_path / "nowhere").exists()


def test_an_unusable_data_dir_is_refused_and_a_good_one_left_as_it_was(tmp_path):
    bad = write(tmp_path / "bad.toml", '[broker]\ndata_dir = "/proc/nope"\n')
    one_line_refusal(check(bad), 'broker.data_dir = "/proc/nope"')
    afile = write(tmp_path / "afile", "")
    one_line_refusal(check(write(tmp_path / "f.toml", f'[broker]\ndata_dir = "{afile}"\n')),
                     "broker.data_dir")
    good = write(tmp_path / "good.toml", f'[broker]\ndata_dir = "{tmp_path}/new/data"\n')
    r = check(good)
    assert r.returncode == 0 and r.stdout.strip() == "configuration ok", r.stderr
    assert not (tmp_path / "new").exists()   # the check made nothing that stays


@AS_ROOT
@pytest.mark.skipif(not _user_exists("nobody"), reason="needs the user nobody")
def test_a_key_the_service_user_cannot_read_is_refused_as_that_user():
    # Under /tmp, not tmp_path: pytest's folders are root-only, nobody could not even
    # reach its data dir.
    root = Path(tempfile.mkdtemp(prefix="lockmq-as-user-"))
    try:
        os.chmod(root, 0o755)
        certs = root / "tls"
        assert lockmq("certs", "init", str(certs)).returncode == 0
        os.chmod(certs, 0o755)
        data = root / "data"
        data.mkdir(mode=0o700)
        nobody = pwd.getpwnam("nobody")
        os.chown(data, nobody.pw_uid, nobody.pw_gid)
        cfg = write(root / "broker.toml", f'[broker]\ndata_dir = "{data}"\n[security]\n'
                                          f'tls_cert = "{certs}/server.pem"\n'
                                          f'tls_key = "{certs}/server.key"\n')
        os.chmod(cfg, 0o644)
        as_root = check(cfg)
        assert as_root.returncode == 0, as_root.stderr   # root reads anything ...
        as_nobody = lockmq("broker", "--config", str(cfg), "--check-config",
                           "--as-user", "nobody")
        one_line_refusal(as_nobody, "security.tls_key", "not readable", "user nobody")
        os.chown(certs / "server.key", 0, nobody.pw_gid)   # root:nogroup 0640
        os.chmod(certs / "server.key", 0o640)
        ok = lockmq("broker", "--config", str(cfg), "--check-config", "--as-user", "nobody")
        assert ok.returncode == 0 and "checked as user nobody" in ok.stderr, ok.stderr

        # renew keeps that owner and mode: the service can still read its new key
        before = (certs / "server.key").read_bytes()
        r = lockmq("certs", "renew", str(certs))
        assert r.returncode == 0, r.stderr
        st = os.stat(certs / "server.key")
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, nobody.pw_gid, 0o640)
        assert (certs / "server.key").read_bytes() != before
        assert "root:" in r.stdout and "0640" in r.stdout
        again = lockmq("broker", "--config", str(cfg), "--check-config", "--as-user", "nobody")
        assert again.returncode == 0, again.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_as_user_refuses_an_unknown_user_and_a_plain_start(tmp_path):
    cfg = write(tmp_path / "b.toml", f'[broker]\ndata_dir = "{tmp_path}/data"\n')
    one_line_refusal(lockmq("broker", "--config", str(cfg), "--check-config",
                            "--as-user", "no-such-user-here"), "no such user")
    one_line_refusal(lockmq("broker", "--config", str(cfg), "--as-user", "nobody"),
                     "--check-config")


def test_print_config_is_complete_and_passes_the_check(tmp_path):
    r = lockmq("broker", "--print-config")
    assert r.returncode == 0
    tables = tomllib.loads(r.stdout)
    for name in ("broker", "store", "security", "replication"):
        assert tables.get(name), name
    assert {"flush", "retention_ms", "segment_bytes"} <= set(tables["store"])
    assert {"tls_cert", "lock_message_rate", "tls_port"} <= set(tables["security"])
    assert {"role", "primary", "promote_after_s"} <= set(tables["replication"])
    # what [broker] already sets is named, not repeated (it would override it)
    assert "data_dir" not in tables["store"] and "max_connections" not in tables["security"]
    text = r.stdout.replace('data_dir = "./data"', f'data_dir = "{tmp_path}/data"')
    ok = check(write(tmp_path / "all.toml", text))
    assert ok.returncode == 0, ok.stderr
