"""lockmq: the message system of a smart-lock platform.

The wire protocol lives in :mod:`lockmq.protocol` (shared with the MicroPython
firmware); storage, broker, client library and CLI live in this package.
"""

__version__ = "0.1.0"
