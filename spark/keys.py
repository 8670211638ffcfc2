"""64-bit message keys: the message id ``sn:seq`` as one integer, vectorised.

The ingest shuffles keys, not id strings: 8 bytes a record instead of a string the
JVM has to build. A key is a hash, so two ids may share one (at 10^9 ids, a few
pairs); a shared key only sends both ids down the exact path (compared by
``message_id``), it never merges two messages.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Odd 64-bit constant (2^64 / golden ratio) spreading consecutive sequence numbers.
_SEQ_MIX = np.uint64(0x9E3779B97F4A7C15)


def _sn_hashes(names: list[bytes | None]) -> np.ndarray:
    return np.array([int.from_bytes(hashlib.blake2b(n or b"", digest_size=8).digest(), "little")
                     for n in names], dtype=np.uint64)


def message_keys(sn: pa.Array | pa.ChunkedArray, seq: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    """The int64 key of every ``(sn, seq)``: blake2b(sn) + seq * mix (mod 2^64).

    The serial numbers are hashed once per distinct value (a batch holds a few
    thousand locks, not a million), the rest is numpy.
    """
    if isinstance(sn, pa.ChunkedArray):
        sn = sn.combine_chunks()
    if not pa.types.is_dictionary(sn.type):
        sn = pc.dictionary_encode(sn)
    names = sn.dictionary.cast(pa.binary()).to_pylist()
    idx = sn.indices.to_numpy(zero_copy_only=False)
    if isinstance(seq, (pa.Array, pa.ChunkedArray)):
        seq = seq.to_numpy()
    with np.errstate(over="ignore"):
        keys = _sn_hashes(names)[idx] + np.asarray(seq).astype(np.uint64) * _SEQ_MIX
    return keys.view(np.int64)
