"""pytest wiring of the HIL rig: the options, fixtures and hooks of lockmq.hil.plugin.

Run with ``pytest hil`` (virtual boards), ``pytest hil --target serial:/dev/ttyUSB0``
or ``pytest hil --target qemu --qemu-path ...``; see hil/README.md.
"""

from lockmq.hil.plugin import (  # noqa: F401  (pytest finds hooks and fixtures by name)
    _virtual_only,
    board_factory,
    broker,
    firmware_template,
    lock_factory,
    fault_proxy_factory,
    hil_target,
    pytest_addoption,
    pytest_configure,
    pytest_report_header,
    pytest_runtest_makereport,
)
