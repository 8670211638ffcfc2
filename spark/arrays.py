"""numpy helpers shared by the decoders (no Spark, no pyarrow)."""

from __future__ import annotations

import struct

import numpy as np

#: struct format codes -> numpy kinds (sizes are the standard ones of "<" / ">" formats)
_KINDS = {"B": "u1", "b": "i1", "H": "u2", "h": "i2", "I": "u4", "i": "i4", "Q": "u8", "q": "i8"}


def struct_dtype(fmt: struct.Struct, names: tuple[str, ...]) -> np.dtype:
    """The packed numpy dtype of a ``struct`` layout, its fields named ``names``.

    How a vectorised decoder reads a codec's layout without copying its offsets and
    sizes: the byte order and field types come from the codec's own format.
    """
    order = {"<": "<", ">": ">", "!": ">"}[fmt.format[0]]
    codes = fmt.format[1:]
    if len(codes) != len(names) or any(c not in _KINDS for c in codes):
        raise ValueError(f"struct_dtype: {fmt.format!r} does not match the fields {names}")
    dt = np.dtype([(n, order + _KINDS[c]) for n, c in zip(names, codes)])
    assert dt.itemsize == fmt.size
    return dt


def at_every_byte(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A view of ``arr`` as records of ``dtype`` starting at every byte offset.

    Fancy-indexing it with record positions copies exactly those records' bytes.
    """
    n = len(arr) - dtype.itemsize + 1
    if n <= 0:
        return np.zeros(0, dtype=dtype)
    return np.ndarray(shape=(n,), dtype=dtype, buffer=arr, offset=0, strides=(1,))
