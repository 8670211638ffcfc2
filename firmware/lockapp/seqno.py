# The per-lock sequence number, persisted so it is never reused after a reboot.
# seq.dat holds the end of the reserved block (u32 big-endian + crc32). A block of
# `block` numbers is reserved (written, atomically) before its first number is
# used; after a power cut the rest of the block is skipped. One flash write per
# `block` events.
import struct
import binascii
from lockapp import atomic


class SeqNo:
    def __init__(self, path, block=64):
        if block < 1:
            raise ValueError("seq_block must be >= 1")
        self.path = path
        self.block = block
        self.limit = 1
        self.ok = True
        raw = atomic.read(path)
        if raw is not None:
            if len(raw) == 8 and struct.unpack(">I", raw[4:])[0] == binascii.crc32(raw[:4]):
                self.limit = struct.unpack(">I", raw[:4])[0]
            else:
                self.ok = False  # caller raises the floor from the queue / broker
        self.next = self.limit

    def raise_floor(self, n):
        # Never hand out a number below n (queue's max seq + 1, broker's last + 1).
        if n > self.next:
            self.next = n
            if self.limit < n:
                self.limit = n

    def take(self):
        if self.next >= self.limit:
            self._reserve(self.next + self.block)
        s = self.next
        self.next = s + 1
        return s

    def _reserve(self, limit):
        b = struct.pack(">I", limit)
        atomic.write(self.path, b + struct.pack(">I", binascii.crc32(b)))
        self.limit = limit
