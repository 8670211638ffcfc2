# const(): MicroPython folds `_NAME = const(int)` into the bytecode where the name is
# used (no heap, no dict slot on a lock: docs/firmware.md "Memory"); on CPython it is
# the identity. Lock-side modules declare the few protocol numbers they use this way
# instead of importing the classes of _constants (tests/protocol/test_lock_consts.py
# holds every such copy equal to _constants).
try:
    from micropython import const
except ImportError:
    def const(value):
        return value
