"""Child process of test_kill: append forever and print every acknowledged id.

Usage: python kill_writer.py DATA_DIR WRITERS [sync|async]. Prints ``READY`` once open, then one
``ACK sn seq`` line per acknowledged record (flushed), until it is killed.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys

from lockmq.store import NewRecord, Store, StoreConfig


def payload_for(sn: str, seq: int) -> bytes:
    """Same rule as helpers.payload_for, with a size that varies with seq."""
    return (hashlib.sha256(f"{sn}:{seq}".encode()).digest() * 4)[:8 + seq % 97]


async def main(data_dir: str, writers: int, flush: str) -> None:
    store = Store.open(StoreConfig(data_dir=data_dir, segment_bytes=16 * 1024, flush=flush,
                                   flush_interval_ms=5, checkpoint_interval_ms=30,
                                   min_free_bytes=0))
    out = sys.stdout

    async def writer(w: int) -> None:
        sn = f"K{w}"
        last = store.last_seq(sn)
        seq = 0 if last is None else last + 1
        while True:
            topic = f"t{seq % 3}"
            headers = {"w": w} if seq % 5 == 0 else None
            await store.append([NewRecord(topic, sn, seq, seq, payload_for(sn, seq), headers)])
            out.write(f"ACK {sn} {seq}\n")
            out.flush()
            seq += 1

    print("READY", flush=True)
    await asyncio.gather(*[writer(w) for w in range(writers)])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "sync"))
