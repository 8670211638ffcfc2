"""`lockmq firmware image`: what it needs is named exactly when it is missing (here:
no ESP-IDF, no ESP32 port), and the part that runs here -- the manifest it builds from,
frozen into the 32-bit unix port -- is the one `build --frozen` writes
(tests/firmware/test_frozen.py boots that interpreter)."""

from __future__ import annotations


import pytest

from lockmq.cli import main as lockmq_main
from lockmq.firmware_tools import unix32
from lockmq.firmware_tools.frozen import ESP32_MANIFEST, MANIFEST
from lockmq.firmware_tools.image import missing


def test_without_anything_it_says_what_to_get(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("IDF_PATH", raising=False)
    assert lockmq_main(["firmware", "image", "--out", str(tmp_path / "fw.bin")]) == 2
    err = capsys.readouterr().err
    assert "missing:" in err and "--micropython-src DIR" in err and "IDF_PATH is not set" in err
    assert not (tmp_path / "fw.bin").exists()


def test_a_tree_without_the_esp32_port_and_an_idf_not_exported(tmp_path):
    if unix32.find_toolchain() is None:
        pytest.skip("the shared toolchain's MicroPython tarball is not here")
    tree = unix32._unpack_toolchain(tmp_path)              # the unix-only source tarball
    idf = tmp_path / "esp-idf"
    (idf / "tools").mkdir(parents=True)
    (idf / "tools" / "idf.py").write_text("")
    got = missing(tree, env={"IDF_PATH": str(idf), "PATH": "/usr/bin:/bin"})
    assert any("has no ESP32 port (ports/esp32/Makefile)" in m for m in got), got
    assert any("idf.py is not on PATH" in m for m in got), got
    assert any("xtensa-esp32-elf-gcc is not on PATH" in m for m in got), got
    assert any("not a MicroPython checkout" in m for m in missing(tmp_path / "nope", env={}))


def test_check_only_and_the_manifest_it_would_freeze(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("IDF_PATH", raising=False)
    assert lockmq_main(["firmware", "image", "--out", str(tmp_path / "fw.bin"), "--check"]) == 2
    assert "missing: ESP-IDF" in capsys.readouterr().out
    # the manifest: the same writer as `build --frozen`, the ESP32 port's modules first
    from lockmq.firmware_tools.frozen import write_manifest

    write_manifest(tmp_path / "m")
    esp32 = (tmp_path / "m" / ESP32_MANIFEST).read_text()
    assert 'include("$(PORT_DIR)/boards/manifest.py")' in esp32 and f'include("{MANIFEST}")' in esp32
