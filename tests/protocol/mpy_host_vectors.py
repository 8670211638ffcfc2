# Run the host-only vectors under MicroPython:  micropython mpy_host_vectors.py VECTORS
# Prints "N passed, M failed" and exits 1 on any failure.
import sys

import host_vector_checks

passed, failures = host_vector_checks.run(sys.argv[1])
for f in failures:
    print("FAIL", f)
print("%d passed, %d failed" % (passed, len(failures)))
sys.exit(1 if failures else 0)
