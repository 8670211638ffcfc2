"""The security hook: the one :class:`~lockmq.security.BrokerGuard` the broker calls.

``auth = "required"`` uses ``lockmq.security``'s Guard (connection limits, device
HMAC and token authentication, command signing). ``auth = "off"`` (tests and
development) uses :class:`OpenGuard`: any claimed identity is accepted -- a peer
answering with the device method is a lock named by its frame SN, any other is an
admin -- and no limits apply. Both implement the same typed protocol, so the broker
never probes which one it has. The broker never implements security logic itself.
"""

from __future__ import annotations

import time
from typing import Any

from lockmq.protocol import HARD_MAX_FRAME, AuthMethod
from lockmq.security import BrokerGuard
from lockmq.security.keys import new_nonce
from lockmq.security.errors import AuthTimeout
from lockmq.security.identity import check_producer_id
from lockmq.security.principal import Permissions, Principal



class OpenGuard:
    """The guard of ``auth = "off"``: a :class:`~lockmq.security.BrokerGuard` like
    ``lockmq.security.Guard`` (see docs/security.md) that admits everyone, checks
    nothing but the identity rules, and signs nothing."""

    #: What the broker logs at start as ``auth=`` (the truth, whatever a file said).
    auth_mode = "off"
    #: No smaller limit before authentication than after.
    preauth_max_frame = HARD_MAX_FRAME
    #: No frame MACs required (there are no device keys).
    lock_frames_need_mac = False
    #: No broker id in CHALLENGE.
    broker_id = ""

    def __init__(self) -> None:
        self._cmd_ids: dict[str, int] = {}

    def reopen_registries(self) -> None:
        """No registry files."""

    def admit(self, peer_ip: str) -> None:
        """No connection limits."""

    def release(self, peer_ip: str) -> None:
        """Nothing to release."""

    def challenge(self) -> bytes:
        """A fresh nonce (still sent, so clients run the same handshake)."""
        return new_nonce()

    def forget_challenge(self, nonce: bytes) -> None:
        """No nonce book to clean."""

    def auth_timed_out(self, peer_ip: str, nonce: bytes | None = None) -> AuthTimeout:
        """The error for a handshake that took too long."""
        return AuthTimeout(f"authentication not finished in time by {peer_ip}",
                           reason="auth_timeout")

    def authenticate(self, claimed_sn: Any, auth_body: Any, nonce: bytes, peer_ip: str,
                     *, tls: bool = False, transcript: bytes = b"") -> Principal:
        """Accept any claim: device method -> lock ``claimed_sn``; else admin."""
        if getattr(auth_body, "method", None) == AuthMethod.DEVICE_HMAC and claimed_sn:
            return Principal(name=claimed_sn, kind="lock", lock_topics=("*",), peer_ip=peer_ip,
                             session_nonce=nonce)
        return Principal(name=claimed_sn or "anonymous", kind="admin",
                         permissions=Permissions(admin=True), peer_ip=peer_ip)

    def check_frame_sn(self, principal: Principal, sn: Any) -> None:
        """Even with auth off a lock may only speak as itself."""
        principal.check_frame_sn(sn)

    def check_publish(self, principal: Principal, topic: str, sn: Any = None, n: int = 1) -> None:
        """``$`` system topics only (nobody has the system right with auth off); the
        frame's SN is bound by the protocol session before this is called. On the hot
        path: the common case costs one comparison."""
        if topic[:1] == "$":
            principal.require_publish(topic)

    def publish_quota(self, principal: Principal, topic: str, n: int) -> int:
        """All ``n`` records, but to ``$`` topics (check_publish then refuses each)."""
        return n if topic[:1] != "$" or principal.may_publish(topic) else 0

    def publish_credit(self, principal: Principal, n: int) -> int:
        """No per-lock rate with auth off: -1, no limit."""
        return -1

    def return_credit(self, principal: Principal, n: int) -> None:
        """Nothing was taken."""

    def check_heartbeat(self, principal: Principal, due: bool = False) -> None:
        """No per-lock rate with auth off (the broker still stores at most one
        heartbeat record per lock per ``heartbeat_record_gap_s``)."""

    def check_producer_id(self, principal: Principal, producer_id: str) -> str:
        """Even with auth off nobody publishes under the broker's ``$`` ids or outside
        the identity charset (no registry, so no ownership)."""
        return check_producer_id(principal, producer_id)

    def check_consume(self, principal: Principal, topic: str, cluster: str) -> None:
        """Locks may not consume."""
        principal.require_consume(topic, cluster)

    def check_command(self, principal: Principal, sn: str, kind: int | None = None,
                      args: bytes | None = None) -> None:
        """Locks may not send commands (no registry here: any SN is accepted)."""
        principal.require_command(sn, kind)

    def check_admin(self, principal: Principal, op: str = "") -> None:
        """Locks may not use admin ops."""
        principal.require_admin()

    def record_protocol_error(self, peer_ip: str, reason: str) -> None:
        """Nothing to count here (the broker counts bad frames itself)."""

    def next_command_id(self, sn: str) -> int:
        """Increasing per lock, and with wall time across restarts."""
        base = int((time.time() - 1_700_000_000) * 10)
        nid = max(self._cmd_ids.get(sn, 0) + 1, base) & 0xFFFFFFFF
        self._cmd_ids[sn] = nid
        return nid

    def sign_command(self, sn: str, cmd_id: int, expires_ms: int, kind: int, args: bytes,
                     principal: Principal | None = None) -> bytes:
        """No key: commands go out unsigned (the lock must run with auth off too)."""
        return b""

    def listeners(self, port: int) -> list[dict[str, Any]]:
        """One plain-TCP listener on ``port`` (no TLS settings with auth off)."""
        return [{"port": port, "tls": False}]

    def tls_context(self) -> Any:
        """No TLS."""
        return None

    def log_listener(self, port: int, tls: bool) -> None:
        """The broker's start-up line says it all (``auth=off``)."""

    def status(self) -> dict[str, Any]:
        """No security counters."""
        return {}

    def standing(self, principal: Principal) -> str:
        """Nobody is ever revoked with auth off."""
        return ""

    def authorize_status(self, view: str, authorization: str) -> str:
        """With auth off the status page is open."""
        return ""

    def security_version(self) -> int:
        """No registry: never changes."""
        return 0

    def revocations(self, since: float) -> tuple[set[str], list[tuple[str, bool, int]]]:
        """Nothing revoked."""
        return set(), []

    def close(self) -> None:
        """Nothing to close."""


def make_guard(config: Any, log: Any) -> BrokerGuard:
    """The guard for ``config`` (a :class:`lockmq.config.Config`).

    ``[broker] auth`` is the one switch: exactly ``"off"`` gives the OpenGuard (with a
    warning), exactly ``"required"`` the security Guard; anything else is refused here
    too (a Config built in code skips the file checks)."""
    from lockmq.config import check_auth_mode

    check_auth_mode(config.broker.auth)
    if config.broker.auth == "off":
        log("auth_off", level="warning",
            note="every peer is trusted; use only for tests and development")
        return OpenGuard()
    from lockmq.security import Guard

    return Guard.from_broker_config(config, log=log)
