"""The security hook: a ``Guard`` the connection handler calls.

``auth = "required"`` uses ``lockmq.security``'s Guard (connection limits, device
HMAC and token authentication, command signing). ``auth = "off"`` (tests and
development) uses :class:`OpenGuard`: any claimed identity is accepted -- a peer
answering with the device method is a lock named by its frame SN, any other is an
admin -- and no limits apply. The broker never implements security logic itself.
"""

from __future__ import annotations

import os
from typing import Any

from lockmq.protocol import AuthMethod, NONCE_SIZE


class OpenGuard:
    """The guard of ``auth = "off"``: admits everyone, signs nothing."""

    def admit(self, peer_ip: str) -> None:
        """No connection limits."""

    def release(self, peer_ip: str) -> None:
        """Nothing to release."""

    def challenge(self) -> bytes:
        """A fresh nonce (still sent, so clients run the same handshake)."""
        return os.urandom(NONCE_SIZE)

    def authenticate(self, claimed_sn: str, auth_body: Any, nonce: bytes, peer_ip: str) -> Any:
        """Accept any claim: device method -> lock ``claimed_sn``; else admin."""
        from lockmq.security.principal import Permissions, Principal

        if getattr(auth_body, "method", None) == AuthMethod.DEVICE_HMAC and claimed_sn:
            return Principal(name=claimed_sn, kind="lock", lock_topics=("*",), peer_ip=peer_ip,
                             session_nonce=nonce)
        return Principal(name=claimed_sn or "anonymous", kind="admin",
                         permissions=Permissions(admin=True), peer_ip=peer_ip)

    def sign_command(self, sn: str, cmd_id: int, expires_ms: int, kind: int, args: bytes,
                     principal: Any = None) -> bytes:
        """No key: commands go out unsigned (the lock must run with auth off too)."""
        return b""


def make_guard(config: Any, log: Any) -> Any:
    """The guard for ``config`` (a :class:`lockmq.config.Config`)."""
    if config.broker.auth == "off":
        log("auth_off", level="warning",
            note="every peer is trusted; use only for tests and development")
        return OpenGuard()
    try:
        from lockmq.security import Guard  # type: ignore[attr-defined]
    except ImportError as exc:
        raise RuntimeError(
            "auth = \"required\" but lockmq.security provides no Guard "
            f"({exc}); set [broker] auth = \"off\" for development") from None
    maker = getattr(Guard, "from_broker_config", None)
    if maker is not None:
        return maker(config)
    return Guard(config)
