"""Which hot path this process runs: the compiled core or pure Python (issues #14, #38).

``lockmq._core`` (the Rust crate in ``host/rust/``, bound with PyO3) does the per-batch
work of a read, a group commit and a consumer fetch in a few calls: scan a read's
PUBLISH frames, encode the records, plan and write the commit, pack the acks, decode
a read's records and a MESSAGES body; per frame, the CRC-16 and the frame MACs' tags,
which this module hands the protocol here (``lockmq.protocol.compiled.use``: the
protocol's own code stays its reference). ``pip install`` builds it when a Rust toolchain
is present and skips it when not (``setup.py``: optional); the pure-Python code it
mirrors is the fallback and the reference (the tests run both and hold them equal).

The choice is made once, at import, for the whole core, never per function: the
module must import, say the interface version this tree was written against
(:data:`API`) and carry every function in :data:`REQUIRED`; anything else -- a build
left from another checkout, a missing function -- runs pure Python. Set
``LOCKMQ_PURE_PYTHON=1`` to force it. ``lockmq --version`` says which runs, and which
SHA-256 the frame MACs' tags take (RustCrypto's ``sha2`` picks the CPU's SHA
extensions at run time).
"""

from __future__ import annotations

import os
from types import ModuleType

#: the environment variable that forces the pure-Python hot path
PURE_ENV = "LOCKMQ_PURE_PYTHON"
#: the core's interface version this tree calls (``API`` in host/rust/src/lib.rs)
API = 1
#: every function of the core the host calls, no more and no fewer (tests/broker/
#: test_wiring.py holds it): a build without one of them runs pure Python
REQUIRED = ("scan_publishes", "scan_sealed_publishes", "scan_frame", "encode_records",
            "publish_acks", "sealed_publish_acks", "queue_run", "plan_run", "plan_calls",
            "dedup_run", "commit_write", "mac_pads", "frame_tag", "encode_leases",
            "read_run", "messages_fields", "crc16", "hmac_sha256", "Lane")


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(PURE_ENV, "").strip() not in ("", "0"):
        return None, f"pure Python ({PURE_ENV} is set)"
    try:
        from lockmq import _core
    except ImportError:
        return None, "pure Python (lockmq._core is not built)"
    got = getattr(_core, "API", None)
    missing = [name for name in REQUIRED if not hasattr(_core, name)]
    if got != API or missing:
        return None, (f"pure Python (lockmq._core is a stale build: API {got}, "
                      f"this tree needs {API}{'; lacks ' + ', '.join(missing) if missing else ''})")
    return _core, f"compiled (lockmq._core, SHA-256 {_core.SHA256})"


#: the compiled core, or None when the pure-Python path runs
speedups, DESCRIPTION = _load()
#: is the compiled hot path in use?
COMPILED = speedups is not None

if speedups is not None:
    # every frame's CRC-16 through the compiled one (slice-by-16 tables, where
    # binascii.crc_hqx takes a byte a step: ~6x on a consumer's 10 KiB MESSAGES frame),
    # and every session's frame tags (the key's pads hashed once per session)
    from lockmq.protocol import compiled

    compiled.use(speedups.crc16, speedups.mac_pads, speedups.frame_tag)

__all__ = ["API", "COMPILED", "DESCRIPTION", "PURE_ENV", "REQUIRED", "speedups"]
