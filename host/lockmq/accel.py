"""Which per-record hot path this process runs: compiled or pure Python (issue #14).

``lockmq._speedups`` (``host/lockmq/_speedups.c``) does the per-record work of a read
in a few calls: scan a read's PUBLISH frames, encode the records, pack the acks.
``pip install`` builds it when a C compiler is present and skips it silently when
not; the pure-Python code it mirrors is the fallback and the reference (the tests run
both and hold them equal). Set ``LOCKMQ_PURE_PYTHON=1`` to force the fallback. The
choice is made once, at import; ``lockmq --version`` says which is in use, and which
SHA-256 the frame MACs' tags take: the CPU's SHA extensions where it has them,
portable C otherwise or with ``LOCKMQ_SHA256=portable``.
"""

from __future__ import annotations

import os
from types import ModuleType

#: the environment variable that forces the pure-Python hot path
PURE_ENV = "LOCKMQ_PURE_PYTHON"


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(PURE_ENV, "").strip() not in ("", "0"):
        return None, f"pure Python ({PURE_ENV} is set)"
    try:
        from lockmq import _speedups
    except ImportError:
        return None, "pure Python (lockmq._speedups is not built)"
    # (the frame MACs' SHA-256: the CPU's SHA extensions, or portable C)
    sha = getattr(_speedups, "SHA256", "portable")
    return _speedups, f"compiled (lockmq._speedups, SHA-256 {sha})"


#: the compiled module, or None when the pure-Python path runs
speedups, DESCRIPTION = _load()
#: is the compiled hot path in use?
COMPILED = speedups is not None

if speedups is not None:
    # every frame's CRC-16 through the compiled one: the same CRC eight bytes a step,
    # where binascii.crc_hqx takes one (~6x on a consumer's 10 KiB MESSAGES frame)
    from lockmq.protocol import _crc

    _crc.use(speedups.crc16)

__all__ = ["COMPILED", "DESCRIPTION", "PURE_ENV", "speedups"]
