"""The shared test vectors, checked by CPython and by the real MicroPython.

The same file (protocol/vectors.json) and the same checks
(vector_checks.py) run under both interpreters: this is what proves the lock's
table-driven CRC, its HMAC and its codec agree with the host's binascii-based ones
(and both CRCs with crcmod, an independent implementation).
"""
from __future__ import annotations

import binascii
import hmac as std_hmac
import hashlib
import json
import shutil
import subprocess
from pathlib import Path


import pytest

from lockmq import protocol as p
import crcmod.predefined

from lockmq.protocol._crc import crc16, crc16_hqx, crc16_init, crc16_table
from lockmq.testing.micropython import BIN, PROTOCOL, build_mpy_lib, run_micropython

from . import vector_checks

HERE = Path(__file__).resolve().parent
#: an independent CRC-16/CCITT-FALSE (a test dependency only) to hold ours against
crc16_crcmod = crcmod.predefined.mkCrcFun("crc-ccitt-false")
VECTORS = PROTOCOL / "vectors.json"


def test_vectors_pass_under_cpython() -> None:
    passed, failures = vector_checks.run(str(VECTORS), [crc16_table, crc16_crcmod, crc16_hqx])
    assert failures == []
    assert passed > 100


def test_crc_implementations_agree_and_match_the_standard_check_value() -> None:
    assert crc16_crcmod(b"123456789") == 0x29B1          # CRC-16/CCITT-FALSE check value
    assert crc16_table(b"123456789") == 0x29B1
    assert crc16_hqx(b"123456789") == 0x29B1
    assert crc16 is crc16_hqx                            # the host uses the fastest one
    assert crc16_init(b"123456789", 0xFFFF) == 0x29B1   # ... and calls it unwrapped in loops
    data = bytes(range(256)) * 3
    for cut in range(0, len(data), 37):
        assert crc16_table(data[:cut]) == crc16_crcmod(data[:cut]) == crc16_hqx(data[:cut])
        assert crc16_hqx(memoryview(data)[:cut]) == crc16_table(data[:cut])


def test_frames_take_the_compiled_crc_where_it_is_built() -> None:
    from lockmq import accel
    from lockmq.protocol import _crc

    if not accel.COMPILED:
        pytest.skip("the pure-Python hot path: frames take binascii.crc_hqx")
    assert _crc.crc16_init is accel.speedups.crc16   # (switched by lockmq.accel)
    frame = p.encode_frame(p.Op.PUBLISH, "LK-1", bytes(range(256)) * 9, 7)
    assert frame[-2:] == binascii.crc_hqx(frame[:-2], 0xFFFF).to_bytes(2, "big")
    dec = p.FrameDecoder(1 << 16)
    dec.feed(frame)
    assert [f.opaque for f in dec.frames()] == [7]
    dec.feed(frame[:-1] + bytes([frame[-1] ^ 1]))
    with pytest.raises(p.BadChecksum):
        list(dec.frames())


def test_hmac_matches_the_standard_library() -> None:
    for key in (b"", b"k", b"x" * 64, b"y" * 65, bytes(range(200))):
        for msg in (b"", b"lockmq", bytes(1000)):
            assert p.hmac_sha256(key, msg) == std_hmac.new(key, msg, hashlib.sha256).digest()


def test_the_locks_tag_compare_answers_as_the_standard_librarys() -> None:
    # (a process that chose the compiled core compares tags with CPython's: compiled.py)
    from lockmq.protocol._hmac import compare_digest

    tag = bytes(range(16))
    for other in (tag, tag[:15], tag + b"\0", b"", bytes(16), tag[:-1] + b"\x0e"):
        assert compare_digest(tag, other) == std_hmac.compare_digest(tag, other)


def test_vectors_file_is_what_the_generator_makes(tmp_path: Path) -> None:
    # Guards against editing vectors.json by hand or changing the codec silently.
    from . import make_vectors
    out = tmp_path / "v.json"
    original = make_vectors.OUT
    make_vectors.OUT = out
    try:
        make_vectors.main()
    finally:
        make_vectors.OUT = original
    assert json.loads(out.read_text()) == json.loads(VECTORS.read_text())


def _run_vectors_under_micropython(tmp_path: Path, compile_mpy: bool, heap: str):
    lib = build_mpy_lib(tmp_path, compile_mpy)
    shutil.copy(HERE / "mpy_vectors.py", tmp_path / "mpy_vectors.py")
    if compile_mpy:
        # the checks as bytecode too: compiling them at import would take the
        # compiler's peak and leave its fragments in the heap being measured
        subprocess.run([str(BIN / "mpy-cross"), "-o", str(tmp_path / "vector_checks.mpy"),
                        str(HERE / "vector_checks.py")], check=True)
    else:
        shutil.copy(HERE / "vector_checks.py", tmp_path / "vector_checks.py")
    return run_micropython(tmp_path / "mpy_vectors.py", [str(VECTORS)], tmp_path,
                           [lib, tmp_path], heap)


def test_vectors_pass_under_micropython_from_source(tmp_path: Path) -> None:
    proc = _run_vectors_under_micropython(tmp_path, compile_mpy=False, heap="512K")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 failed" in proc.stdout


def test_vectors_pass_under_micropython_as_shipped_mpy_with_esp32_sized_heap(tmp_path: Path) -> None:
    # The artifacts a board runs: mpy-cross -march=xtensawin bytecode. The unix
    # port is a 64-bit build (objects about twice an ESP32's), so 128K here is
    # about what an ESP32 gives a MicroPython app.
    proc = _run_vectors_under_micropython(tmp_path, compile_mpy=True, heap="128K")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    passed = int(proc.stdout.strip().splitlines()[-1].split()[0])
    assert passed > 100
