# Run the shared vectors under MicroPython:  micropython mpy_vectors.py VECTORS
# Prints "N passed, M failed" and exits 1 on any failure.
import sys
import gc

import vector_checks

gc.collect()
before = gc.mem_alloc() if hasattr(gc, "mem_alloc") else 0
passed, failures = vector_checks.run(sys.argv[1])
for f in failures:
    print("FAIL", f)
print("%d passed, %d failed" % (passed, len(failures)))
sys.exit(1 if failures else 0)
