# Run the session vectors under MicroPython:  micropython mpy_session.py VECTORS
# Prints "N passed, M failed" and exits 1 on any failure.
import sys

import session_checks

passed, failures = session_checks.run(sys.argv[1])
for f in failures:
    print("FAIL", f)
print("%d passed, %d failed" % (passed, len(failures)))
sys.exit(1 if failures else 0)
