# CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, no reflection, xorout 0).
# The lock computes it from a 256-entry table with small-int arithmetic only
# (no heap allocation per byte on a 32-bit MicroPython); the host uses the standard
# library's binascii.crc_hqx (the same CRC with init 0xFFFF, in C; every supported
# CPython has it). The shared vectors prove both give the same answer (the tests
# also hold them against crcmod, an independent implementation).

try:
    from array import array
except ImportError:  # pragma: no cover - every supported interpreter has array
    array = None


def _make_table():
    table = array("H", bytes(512)) if array else [0] * 256
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            if crc & 0x8000:
                crc = ((crc << 1) ^ 0x1021) & 0xFFFF
            else:
                crc = (crc << 1) & 0xFFFF
        table[i] = crc
    return table


_TABLE = _make_table()


def crc16_table(data, crc=0xFFFF):
    """Table-driven CRC-16/CCITT-FALSE of a bytes-like object (the lock's code)."""
    table = _TABLE
    for b in data:
        crc = ((crc << 8) & 0xFF00) ^ table[((crc >> 8) ^ b) & 0xFF]
    return crc


crc16 = crc16_table

try:
    from binascii import crc_hqx as _crc_hqx
    _crc_hqx(b"", 0xFFFF)
except (ImportError, AttributeError):  # MicroPython's binascii has no crc_hqx
    crc16_hqx = None
else:
    def crc16_hqx(data, crc=0xFFFF):
        """CRC-16/CCITT-FALSE of a bytes-like object (the standard library's C code)."""
        return _crc_hqx(data, crc)

    crc16 = crc16_hqx

# crc16_init(data, 0xFFFF): the fastest CRC called without a Python wrapper (hot loops)
crc16_init = crc16_table if crc16_hqx is None else _crc_hqx
