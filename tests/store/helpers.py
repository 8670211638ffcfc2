"""Records and configs the storage-engine tests share (imported by the test modules;
the fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import hashlib

from lockmq.store import NewRecord, Store, StoreConfig


def payload_for(sn: str, seq: int, size: int = 24) -> bytes:
    """Deterministic payload of a message id, so a reader can tell garbage from data."""
    digest = hashlib.sha256(f"{sn}:{seq}".encode()).digest()
    return (digest * (size // len(digest) + 1))[:size]


def rec(topic: str, sn: str, seq: int, size: int = 24, headers=None) -> NewRecord:
    """A record whose payload is derived from its id."""
    return NewRecord(topic, sn, seq, 1_700_000_000_000 + seq, payload_for(sn, seq, size), headers)


def config(path, **kw) -> StoreConfig:
    """Small segments and no disk reserve, unless a test says otherwise."""
    kw.setdefault("segment_bytes", 8192)
    kw.setdefault("min_free_bytes", 0)
    return StoreConfig(data_dir=str(path), **kw)


def run(coro):
    """Run a coroutine on a fresh event loop."""
    return asyncio.run(coro)


async def fill(store: Store, topic: str, sn: str, seqs, batch: int = 50) -> list:
    """Append records with the given sequences in calls of ``batch`` records."""
    out = []
    seqs = list(seqs)
    for i in range(0, len(seqs), batch):
        out.extend(await store.append([rec(topic, sn, s) for s in seqs[i:i + batch]]))
    return out
