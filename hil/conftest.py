"""The HIL rig's options and fixtures come from the ``lockmq-hil`` pytest plugin
(:mod:`lockmq.hil.plugin`, registered by lockmq's ``pytest11`` entry point).

Run with ``pytest hil`` (virtual boards), ``pytest hil --hil-target serial:/dev/ttyUSB0``
or ``pytest hil --hil-target qemu --hil-qemu-path ...``; see hil/README.md.
"""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # An install made before the entry point existed has no fixtures: say so, once.
    if not config.pluginmanager.has_plugin("lockmq-hil"):
        raise pytest.UsageError("the lockmq-hil pytest plugin is not registered: reinstall "
                                "lockmq (pip install -e .) so that its pytest11 entry point exists")
