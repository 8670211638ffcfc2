"""Target selection and the ESP32 flash image, without any board."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockmq.hil.esp32_image import FS_OFFSET, FW_OFFSET, build_flash_image
from lockmq.hil.target import TargetSpec, TargetUnavailable


def test_parse_targets() -> None:
    assert TargetSpec.parse("virtual").kind == "virtual"
    s = TargetSpec.parse("serial:socket://127.0.0.1:7000", baudrate=9600)
    assert (s.kind, s.port, s.baudrate) == ("serial", "socket://127.0.0.1:7000", 9600)
    assert TargetSpec.parse("serial:/dev/ttyUSB0").max_boards == 1
    assert TargetSpec.parse("qemu", qemu_machine="microbit").runs_firmware is False
    assert TargetSpec.parse("serial:rfc2217://127.0.0.1:2217").can_power_cut  # RTS -> EN
    assert not TargetSpec.parse("serial:socket://127.0.0.1:7000").can_power_cut
    assert TargetSpec.parse("serial:socket://127.0.0.1:7000", power_cut_cmd="relay {off}").can_power_cut
    with pytest.raises(ValueError):
        TargetSpec.parse("serial")
    with pytest.raises(ValueError):
        TargetSpec.parse("jtag")


def test_qemu_esp32_without_a_binary_says_why() -> None:
    spec = TargetSpec.parse("qemu")
    with pytest.raises(TargetUnavailable, match="qemu-system-xtensa.*--hil-qemu-path"):
        spec.check()
    spec = TargetSpec.parse("qemu", qemu_path="/bin/true")
    with pytest.raises(TargetUnavailable, match="--hil-qemu-firmware"):
        spec.check()


def test_esp32_flash_image_layout(tmp_path: Path) -> None:
    pytest.importorskip("littlefs")
    from littlefs import LittleFS

    fw = tmp_path / "micropython.bin"
    fw.write_bytes(b"\xe9" + bytes(range(256)) * 10)
    flash = tmp_path / "flash"
    (flash / "lib").mkdir(parents=True)
    (flash / "main.py").write_text("import lockapp.app\n")
    (flash / "lib" / "x.mpy").write_bytes(b"M\x06")
    image = build_flash_image(str(fw), flash).read_bytes()
    assert len(image) == 4 * 1024 * 1024
    assert image[FW_OFFSET : FW_OFFSET + len(fw.read_bytes())] == fw.read_bytes()
    fs = LittleFS(block_size=4096, block_count=512, mount=False)
    fs.context.buffer = bytearray(image[FS_OFFSET:])
    fs.mount()
    assert fs.open("main.py", "r").read() == "import lockapp.app\n"
    assert fs.open("lib/x.mpy", "rb").read() == b"M\x06"


def test_several_serial_boards_by_port_serial_number_or_location() -> None:
    pytest.importorskip("serial")
    from serial.tools.list_ports_common import ListPortInfo

    from lockmq.hil.target import TargetSpec, TargetUnavailable, resolve_port

    spec = TargetSpec.parse("serial:/dev/ttyUSB0,sn=A1B2,loc=1-1.3")
    assert spec.ports == ("/dev/ttyUSB0", "sn=A1B2", "loc=1-1.3") and spec.max_boards == 3
    assert spec.port == "/dev/ttyUSB0" and spec.label == "serial:/dev/ttyUSB0,sn=A1B2,loc=1-1.3"
    a, b = ListPortInfo("/dev/ttyUSB0"), ListPortInfo("/dev/ttyACM1")
    a.serial_number, a.location = "A1B2", "1-1.2"
    b.serial_number, b.location = "ZZ99", "1-1.3"
    assert resolve_port("sn=A1B2", [a, b]) == "/dev/ttyUSB0"
    assert resolve_port("loc=1-1.3", [a, b]) == "/dev/ttyACM1"
    assert resolve_port("socket://127.0.0.1:7000", [a, b]) == "socket://127.0.0.1:7000"
    with pytest.raises(TargetUnavailable, match=r"no serial port with sn=NOPE; ports here: /dev/ttyUSB0 \(sn=A1B2"):
        resolve_port("sn=NOPE", [a, b])
