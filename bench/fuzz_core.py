"""The compiled core's fuzz targets, run long: one hypothesis property per parser of
``lockmq._core`` (random and damaged input through the binding, held to the
pure-Python reference), each with ``--scale`` times the examples it takes in the suite.

    .venv/bin/python bench/fuzz_core.py              # scale 100: a few minutes
    .venv/bin/python bench/fuzz_core.py --scale 1000 # longer

Prints each target's examples and time; exits 1 if one failed (the failing example
is in the pytest output). The same targets run in seconds in the suite.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (parser, pytest node, examples in the suite)
TARGETS = [
    ("scan_publishes", "tests/protocol/test_accel.py::test_c_scanner_answers_as_the_pure_one", 400),
    ("scan_publishes (any bytes)", "tests/protocol/test_accel.py::test_c_scanner_survives_any_bytes", 300),
    ("scan_frame", "tests/protocol/test_accel.py::test_c_frame_reader_answers_as_the_pure_one", 400),
    ("scan_frame (any bytes)", "tests/protocol/test_accel.py::test_c_frame_reader_survives_any_bytes", 300),
    ("scan + decoder errors", "tests/protocol/test_accel.py::test_bad_input_raises_the_same_errors_with_the_scanners", 300),
    ("scan_sealed_publishes", "tests/protocol/test_frame_macs.py::"
     "test_compiled_scan_takes_what_the_session_opens_and_stops_where_it_would_not", 100),
    ("messages_fields", "tests/protocol/test_accel_messages.py::test_the_scan_reads_what_the_decoder_reads", 300),
    ("messages_fields (any bytes)", "tests/protocol/test_accel_messages.py::test_the_scan_survives_any_bytes", 300),
    ("read_run", "tests/store/test_accel_read.py::test_the_compiled_read_decodes_as_decode_record", 300),
    ("Lane.poll", "tests/broker/test_lane.py::test_the_lane_takes_what_the_python_paths_scanner_takes", 300),
    ("Lane.poll (sealed)", "tests/broker/test_lane.py::test_a_sealed_slot_takes_what_the_sealed_scanner_takes", 200),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=100, help="times the suite's examples")
    ap.add_argument("--only", nargs="*", help="targets whose parser starts with these")
    a = ap.parse_args()
    env = dict(os.environ, LOCKMQ_FUZZ_SCALE=str(a.scale))
    failed = 0
    print(f"fuzz targets of lockmq._core, scale {a.scale}")
    for name, node, examples in TARGETS:
        if a.only and not any(name.startswith(o) for o in a.only):
            continue
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "--timeout", "0", node], cwd=ROOT, env=env, capture_output=True, text=True)
        took = time.monotonic() - t0
        ok = proc.returncode == 0
        failed += not ok
        print(f"{name:30s} {examples * a.scale:>9,} examples {took:8.1f} s  {'ok' if ok else 'FAILED'}",
              flush=True)
        if not ok:
            print(proc.stdout[-4000:], proc.stderr[-2000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
