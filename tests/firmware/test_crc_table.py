"""The lock's CRC table is a bytes literal (frozen: it stays in flash, off the heap):
it must be the table the CRC's definition gives, and the lock's table-driven CRC must
agree with the standard library's on any input."""

from __future__ import annotations

import binascii
import random

from lockmq.protocol import _crc


def _make_table():
    # the table from the CRC's definition (poly 0x1021, MSB first), bit by bit; kept
    # here, not in the frozen module, where the lock would carry it for nothing
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            if crc & 0x8000:
                crc = ((crc << 1) ^ 0x1021) & 0xFFFF
            else:
                crc = (crc << 1) & 0xFFFF
        table.append(crc)
    return table

def test_table_literal_is_the_computed_table():
    table = _crc._TABLE
    assert isinstance(table, bytes) and len(table) == 512
    assert [(table[2 * i] << 8) | table[2 * i + 1] for i in range(256)] == _make_table()


def test_table_crc_matches_crc_hqx():
    rnd = random.Random(5)
    for n in list(range(40)) + [1000, 65536]:
        data = bytes(rnd.getrandbits(8) for _ in range(n))
        assert _crc.crc16_table(data) == binascii.crc_hqx(data, 0xFFFF)
        assert _crc.crc16_table(data, 0x1D0F) == binascii.crc_hqx(data, 0x1D0F)
