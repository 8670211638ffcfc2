"""numpy helpers shared by the decoders (no Spark, no pyarrow)."""

from __future__ import annotations

import numpy as np


def at_every_byte(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A view of ``arr`` as records of ``dtype`` starting at every byte offset.

    Fancy-indexing it with record positions copies exactly those records' bytes.
    """
    n = len(arr) - dtype.itemsize + 1
    if n <= 0:
        return np.zeros(0, dtype=dtype)
    return np.ndarray(shape=(n,), dtype=dtype, buffer=arr, offset=0, strides=(1,))
