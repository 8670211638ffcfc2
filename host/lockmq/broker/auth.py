"""The security hook: the one :class:`~lockmq.security.Guard` the broker calls.

``[broker] auth`` picks its policy: ``"required"`` (connection limits, device HMAC and
token authentication, command signing) or ``"off"`` (tests and development:
:meth:`Guard.open <lockmq.security.Guard.open>` -- any claimed identity is accepted, a
peer answering with the device method is a lock named by its frame SN, any other is an
admin, and no limits apply). One implementation of
:class:`~lockmq.security.BrokerGuard` either way, so the broker never probes which
policy it has. The broker never implements security logic itself.
"""

from __future__ import annotations

from typing import Any

from lockmq.security import BrokerGuard, Guard

def make_guard(config: Any, log: Any) -> BrokerGuard:
    """The guard for ``config`` (a :class:`lockmq.config.Config`).

    ``[broker] auth`` is the one switch: exactly ``"off"`` gives the trusting policy
    (with a warning), exactly ``"required"`` the registries'; anything else is refused
    here too (a Config built in code skips the file checks)."""
    from lockmq.config import check_auth_mode

    check_auth_mode(config.broker.auth)
    if config.broker.auth == "off":
        log("auth_off", level="warning",
            note="every peer is trusted; use only for tests and development")
        return Guard.open(log=log)
    return Guard.from_broker_config(config, log=log)
