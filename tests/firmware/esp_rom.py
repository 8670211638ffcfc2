"""An ESP32 ROM bootloader stand-in on TCP, for `esptool --port socket://...`.

It implements the subset of the ROM's serial protocol that esptool's
`write-flash --chip esp32 --before no-reset --after no-reset --no-stub` uses:
SLIP framing; SYNC, READ_REG/WRITE_REG (with an SPI controller that answers the
flash-id command), SPI_ATTACH, SPI_SET_PARAMS, CHANGE_BAUDRATE, FLASH_BEGIN/DATA/END,
FLASH_DEFL_BEGIN/DATA/END (zlib), SPI_FLASH_MD5; anything else gets the ROM's
"invalid command" status. Written bytes land in a 4 MiB ``flash`` bytearray.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import threading
import zlib

FLASH_SIZE = 4 * 1024 * 1024
MAGIC_REG, MAGIC_ESP32 = 0x40001000, 0x00F01D83
UART_CLKDIV_REG = 0x3FF40014
SPI_BASE = 0x3FF42000
SPI_W0 = SPI_BASE + 0x80
FLASH_ID = 0x1640EF            # Winbond, 4 MiB (size code 0x16)

SYNC, WRITE_REG, READ_REG = 0x08, 0x09, 0x0A
FLASH_BEGIN, FLASH_DATA, FLASH_END = 0x02, 0x03, 0x04
SPI_SET_PARAMS, SPI_ATTACH, CHANGE_BAUDRATE = 0x0B, 0x0D, 0x0F
DEFL_BEGIN, DEFL_DATA, DEFL_END, MD5 = 0x10, 0x11, 0x12, 0x13


def slip(data: bytes) -> bytes:
    return b"\xc0" + data.replace(b"\xdb", b"\xdb\xdd").replace(b"\xc0", b"\xdb\xdc") + b"\xc0"


class EspRom:
    """Listens on 127.0.0.1 (one client at a time); ``flash`` holds what was written."""

    def __init__(self, port: int = 0) -> None:
        self.flash = bytearray(b"\xff" * FLASH_SIZE)
        self.regs: dict[int, int] = {MAGIC_REG: MAGIC_ESP32, UART_CLKDIV_REG: 347}
        self.commands: list[int] = []
        self.errors: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", port))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(5)

    # -- transport ----------------------------------------------------------------------
    def _serve(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(0.2)
                self._session(conn)

    def _session(self, conn: socket.socket) -> None:
        buf, frame, in_frame, esc = b"", bytearray(), False, False
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            for b in data:
                if b == 0xC0:
                    if in_frame and frame:
                        self._handle(conn, bytes(frame))
                    frame, in_frame, esc = bytearray(), True, False
                elif not in_frame:
                    continue
                elif esc:
                    frame.append(0xC0 if b == 0xDC else 0xDB)
                    esc = False
                elif b == 0xDB:
                    esc = True
                else:
                    frame.append(b)

    def _reply(self, conn: socket.socket, op: int, value: int = 0, data: bytes = b"",
               status: bytes = b"\x00\x00\x00\x00") -> None:
        body = data + status
        conn.sendall(slip(struct.pack("<BBHI", 1, op, len(body), value) + body))

    # -- commands -----------------------------------------------------------------------
    def _handle(self, conn: socket.socket, pkt: bytes) -> None:
        if len(pkt) < 8 or pkt[0] != 0:
            return
        _, op, size, chk = struct.unpack_from("<BBHI", pkt)
        data = pkt[8:8 + size]
        self.commands.append(op)
        try:
            value, out = self._run(op, data, chk)
        except _Invalid:
            self._reply(conn, op, 0, b"", b"\x01\x05\x00\x00")
            return
        except Exception as e:  # a failed check: the ROM answers status 1
            self.errors.append(f"op {op:#x}: {e}")
            self._reply(conn, op, 0, b"", b"\x01\x06\x00\x00")
            return
        if op == SYNC:
            for _ in range(8):
                self._reply(conn, op, 0x20120707)
        else:
            self._reply(conn, op, value, out)

    def _run(self, op: int, d: bytes, chk: int) -> tuple[int, bytes]:
        if op == SYNC:
            return 0, b""
        if op == READ_REG:
            (addr,) = struct.unpack("<I", d[:4])
            if addr == SPI_W0:
                return FLASH_ID, b""
            if addr == SPI_BASE:
                return 0, b""        # SPI_CMD_REG: the user command is always done
            return self.regs.get(addr, 0), b""
        if op == WRITE_REG:
            addr, value, _mask, _delay = struct.unpack("<IIII", d[:16])
            self.regs[addr] = value
            return 0, b""
        if op in (SPI_ATTACH, SPI_SET_PARAMS, CHANGE_BAUDRATE):
            return 0, b""
        if op in (FLASH_BEGIN, DEFL_BEGIN):
            erase, blocks, block_size, offset = struct.unpack("<IIII", d[:16])
            if offset + erase > FLASH_SIZE:
                raise ValueError("write beyond the end of flash")
            self.flash[offset:offset + erase] = b"\xff" * erase
            self._offset, self._block, self._next = offset, block_size, 0
            self._z = zlib.decompressobj() if op == DEFL_BEGIN else None
            self._pos = offset
            return 0, b""
        if op in (FLASH_DATA, DEFL_DATA):
            n, seq, _, _ = struct.unpack("<IIII", d[:16])
            payload = d[16:16 + n]
            x = 0xEF
            for b in payload:
                x ^= b
            if x != chk:
                raise ValueError("data checksum mismatch")
            if seq != self._next:
                raise ValueError(f"block {seq}, expected {self._next}")
            self._next += 1
            if op == FLASH_DATA:
                at = self._offset + seq * self._block
                self.flash[at:at + len(payload)] = payload
            else:
                raw = self._z.decompress(payload)
                self.flash[self._pos:self._pos + len(raw)] = raw
                self._pos += len(raw)
            return 0, b""
        if op in (FLASH_END, DEFL_END):
            return 0, b""
        if op == MD5:
            addr, size, _, _ = struct.unpack("<IIII", d[:16])
            return 0, hashlib.md5(bytes(self.flash[addr:addr + size])).hexdigest().encode()
        raise _Invalid()


class _Invalid(Exception):
    pass
