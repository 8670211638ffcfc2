"""Errors raised by lockmq.security, each carrying a wire error code.

The broker turns any :class:`SecurityError` into an ERROR frame with
``err.code`` (a ``lockmq.protocol.ErrorCode`` value when the protocol defines the
name, else the numeric fallback below) and ``err.public_message`` (safe to send:
it never says whether an SN exists). ``str(err)`` is the detailed text for the log.
"""

from __future__ import annotations


def _protocol_code(name: str, fallback: int) -> int:
    """The protocol's numeric error code called ``name`` (``fallback`` if absent)."""
    try:
        from lockmq.protocol import ErrorCode  # type: ignore[attr-defined]
    except Exception:  # protocol not importable: keep the fallback
        return fallback
    value = getattr(ErrorCode, name, None)
    return int(value) if value is not None else fallback


class SecurityError(Exception):
    """Base class: a request refused for a security reason.

    Attributes:
        code_name: symbolic protocol error name (``AUTH_FAILED`` ...).
        reason: short metric/log label (``unknown_sn``, ``bad_proof`` ...); never
            sent to the peer.
        public_message: what the peer is told.
        close: whether the broker should close the connection after answering.
    """

    code_name = "FORBIDDEN"
    fallback_code = 12
    public_message = "forbidden"
    close = False

    def __init__(self, detail: str = "", *, reason: str = "", retry_after_ms: int = 0) -> None:
        super().__init__(detail or self.public_message)
        self.reason = reason or self.code_name.lower()
        self.retry_after_ms = retry_after_ms

    @property
    def code(self) -> int:
        """The numeric wire code (resolved against ``lockmq.protocol.ErrorCode``)."""
        return _protocol_code(self.code_name, self.fallback_code)


class AuthFailed(SecurityError):
    """Authentication refused. Unknown SN, wrong key, disabled device, replayed or
    expired nonce, bad or expired token: all look the same on the wire."""

    code_name = "AUTH_FAILED"
    fallback_code = 11
    public_message = "authentication failed"
    close = True


class AuthRateLimited(AuthFailed):
    """Too many failed attempts from this address or for this SN: try later."""

    code_name = "RATE_LIMITED"
    fallback_code = 21
    public_message = "too many failed attempts, retry later"


class Replayed(AuthFailed):
    """An AUTH answer that was already used (a captured exchange played again).

    Saying so leaks nothing: the replayer learns no more than it already had."""

    code_name = "REPLAY"
    fallback_code = 15
    public_message = "replayed authentication"


class TokenExpired(AuthFailed):
    """A token with the right secret but past its expiry (only its holder sees this)."""

    code_name = "TOKEN_EXPIRED"
    fallback_code = 14
    public_message = "token expired"


class AuthTimeout(AuthFailed):
    """The connection did not authenticate within ``auth_timeout_s``."""

    code_name = "AUTH_TIMEOUT"
    fallback_code = 16
    public_message = "authentication timed out"


class PermissionDenied(SecurityError):
    """An authenticated principal asked for something it has no right to."""

    code_name = "FORBIDDEN"
    fallback_code = 12
    public_message = "not permitted"


class IdentityMismatch(PermissionDenied):
    """A frame after connect claims an SN other than the authenticated one."""

    code_name = "SN_MISMATCH"
    fallback_code = 13
    public_message = "frame SN does not match the authenticated identity"
    close = True


class LimitExceeded(SecurityError):
    """A configured limit was hit. ``limit`` names the setting."""

    code_name = "BUSY"
    fallback_code = 20
    public_message = "limit exceeded"

    def __init__(self, limit: str, detail: str = "", *, retry_after_ms: int = 0,
                 close: bool = False) -> None:
        super().__init__(detail or f"limit {limit} exceeded", reason=limit,
                         retry_after_ms=retry_after_ms)
        self.limit = limit
        self.close = close
        self.public_message = f"limit exceeded: {limit}"


class ConnectionRefused(LimitExceeded):
    """A new connection refused by a connection limit (the broker closes it)."""

    code_name = "TOO_MANY_CONNECTIONS"
    fallback_code = 22

    def __init__(self, limit: str, detail: str = "", *, retry_after_ms: int = 1000) -> None:
        super().__init__(limit, detail, retry_after_ms=retry_after_ms, close=True)


class RateLimited(LimitExceeded):
    """A per-lock message rate exceeded: the frame is refused, retry later."""

    code_name = "RATE_LIMITED"
    fallback_code = 21


class FrameTooLarge(LimitExceeded):
    """A frame over ``max_frame_bytes`` (the connection is closed)."""

    code_name = "FRAME_TOO_LARGE"
    fallback_code = 3

    def __init__(self, detail: str = "") -> None:
        super().__init__("max_frame_bytes", detail, close=True)
