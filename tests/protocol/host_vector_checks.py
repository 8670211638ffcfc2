# Checks of the host-only vectors (vectors.json "host_frames" and "host_invalid_bodies":
# transactional and scheduled messages) that run unchanged under CPython
# (test_host_vectors.py) and MicroPython (mpy_host_vectors.py). Kept apart from
# vector_checks.py: a lock never loads these bodies, so they stay out of its
# heap-sized run. MicroPython subset only.
import json

import lockmq.protocol.schedule  # noqa: F401  (registers the scheduled-delivery bodies)
import lockmq.protocol.txn  # noqa: F401  (registers the TXN_* bodies)

from vector_checks import check_frame, check_invalid_body, check_stream, checker


def run(path):
    """Check every host-only vector; returns (passed, [failure messages])."""
    with open(path) as fh:
        v = json.load(fh)
    passed = 0
    failures = []
    check = checker(failures)
    parts = []
    for f in v["host_frames"]:
        n, data, _ = check_frame(f, check)
        passed += n
        parts.append(data)
    passed += check_stream(b"".join(parts), len(v["host_frames"]), (1, 5, 4096), check)
    for bad in v["host_invalid_bodies"]:
        passed += check_invalid_body(bad, check)
    return passed, failures
