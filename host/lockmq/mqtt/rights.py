"""The one place where the MQTT listener asks for rights: an adapter over the
broker's guard (``lockmq.security.BrokerGuard``), never a rule of its own.

Every decision is the guard's -- the same tokens, the same per-topic, per-cluster
and per-command-kind rights, the same limits -- so a token means the same on MQTT
as on the lockmq protocol; publishes and commands go through the broker's one
admission point (``broker/admission.py``), which also ends the MQTT sessions of a
revoked token (:meth:`Rights.on_revoked`).
"""

from __future__ import annotations

from typing import Any

from lockmq.security import BrokerGuard, SecurityError

from .codec import reason as rc

#: the guard's error names -> MQTT 5 reason codes
_REASONS = {
    "AUTH_FAILED": rc.BAD_USERNAME_OR_PASSWORD,
    "TOKEN_EXPIRED": rc.BAD_USERNAME_OR_PASSWORD,
    "REPLAY": rc.BAD_USERNAME_OR_PASSWORD,
    "AUTH_TIMEOUT": rc.BAD_USERNAME_OR_PASSWORD,
    "RATE_LIMITED": rc.SERVER_BUSY,
    "BUSY": rc.SERVER_BUSY,
    "LIMIT_EXCEEDED": rc.QUOTA_EXCEEDED,
    "FORBIDDEN": rc.NOT_AUTHORIZED,
    "SN_MISMATCH": rc.NOT_AUTHORIZED,
    "INVALID_ARGUMENT": rc.IMPLEMENTATION_SPECIFIC,
}


def reason_of(exc: SecurityError) -> int:
    """The MQTT 5 reason code of a guard refusal."""
    return _REASONS.get(exc.code_name, rc.NOT_AUTHORIZED)


def message_of(exc: SecurityError) -> str:
    """What a peer may read of a refusal (the guard's public message)."""
    return getattr(exc, "public_message", "") or str(exc)


class Rights:
    """What the MQTT listener asks of security (see the module docstring)."""

    def __init__(self, guard: BrokerGuard, admission: Any = None) -> None:
        self.guard = guard
        #: the broker's one admission decision (``broker/admission.py``): publishes and
        #: commands go through it, so a revoked token's rights end here too
        self.admission = admission or guard

    def admit(self, peer_ip: str) -> None:
        """Count a new connection in (the guard's connection limits)."""
        self.guard.admit(peer_ip)

    def release(self, peer_ip: str) -> None:
        """Count a closed connection out (once per successful :meth:`admit`)."""
        self.guard.release(peer_ip)

    def authenticate(self, username: str | None, password: bytes | None, peer_ip: str,
                     tls: bool) -> Any:
        """The principal of a CONNECT's credentials: the password is a lockmq token
        (the user name is free, e.g. the token's name; a client that can send only
        a user name may send the token there). Raises the guard's SecurityError."""
        secret = password.decode("utf-8", "replace") if password else (username or "")
        nonce = self.guard.challenge()   # token auth is bound to a fresh nonce
        return self.guard.authenticate("", {"method": "token", "token": secret}, nonce,
                                       peer_ip, tls=tls)

    def check_publish(self, principal: Any, topic: str) -> None:
        """May ``principal`` publish to ``topic``?"""
        self.admission.check_publish(principal, topic, n=1)

    def check_producer_id(self, principal: Any, producer_id: str) -> None:
        """May ``principal`` publish under ``producer_id`` (its MQTT client id)?"""
        self.guard.check_producer_id(principal, producer_id)

    def check_consume(self, principal: Any, topic: str, cluster: str) -> None:
        """May ``principal`` join ``cluster`` on ``topic`` (and does it still stand,
        by the registry now: a subscription is rare, the read is cheap)?"""
        standing = getattr(self.admission, "check_standing", None)
        if standing is not None:
            standing(principal, "consume")
        self.guard.check_consume(principal, topic, cluster)

    def on_revoked(self, end_sessions: Any) -> None:
        """``end_sessions(matches, why)`` is called when principals stop standing (a
        token revoked or expired): the listener ends their connections at once."""
        register = getattr(self.admission, "on_revoked", None)
        if register is not None:
            register(end_sessions)

    def check_command(self, principal: Any, sn: str, kind: int, args: bytes) -> None:
        """May ``principal`` send a command of ``kind`` to lock ``sn``? (The command
        path checks again when it takes the command: both are the guard's rule.)"""
        self.admission.check_command(principal, sn, kind, args)
