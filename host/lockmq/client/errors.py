"""Exceptions raised by the lockmq client.

One base, :class:`LockmqError`; a broker refusal carries the broker's error code, its
retry hint and a readable message, as the ERROR frame does.
"""

from __future__ import annotations


class LockmqError(Exception):
    """Base of every client error."""


class ConnectionLost(LockmqError):
    """The connection closed (or never opened) before the answer arrived.

    For a publish this means *unknown outcome*: the broker may have stored the
    message. Retrying is safe — the broker stores a retransmitted ``(sn, seq)`` once.
    """


class TlsError(LockmqError):
    """The TLS handshake failed (the broker's certificate does not verify against the
    CA, names another host, ...): not retried, since trying again cannot fix it."""


class ClientClosed(LockmqError):
    """The producer or consumer was closed."""


class BrokerError(LockmqError):
    """The broker answered with an ERROR frame.

    Attributes:
        code: the broker's numeric error code.
        name: the code's symbolic name when known (``"BUSY"``, ``"FORBIDDEN"``...).
        retry_after_ms: the broker's hint (0 = do not retry as is).
        detail: the broker's message.
    """

    def __init__(self, code: int, retry_after_ms: int, detail: str, name: str = "") -> None:
        self.code = code
        self.name = name or str(code)
        self.retry_after_ms = retry_after_ms
        self.detail = detail
        hint = f", retry after {retry_after_ms} ms" if retry_after_ms else ""
        super().__init__(f"broker error {self.name} ({code}){hint}: {detail}")


class BusyError(BrokerError):
    """The broker cannot take more right now; ``retry_after_ms`` says when to retry."""


class AuthError(BrokerError):
    """The broker refused the credentials (unknown device, bad proof, bad token)."""


class ForbiddenError(BrokerError):
    """The credentials are valid but do not allow this operation."""


class CommandError(LockmqError):
    """A downlink command did not produce the lock's answer.

    Attributes:
        reason: ``"expired"`` (the lock stayed offline past the expiry),
            ``"forbidden"``, ``"unknown_lock"``, ``"timeout"`` or the broker's code.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"command failed: {reason}" + (f": {detail}" if detail else ""))


class AdminError(LockmqError):
    """An admin request was refused or failed on the broker.

    Attributes:
        error: the broker's error name (``"UNKNOWN_GATEWAY"``, ``"INVALID_ARGUMENT"``,
            ...) when it answered with one, else ``""``.
    """

    def __init__(self, message: str, error: str = "") -> None:
        super().__init__(message)
        self.error = error


class InvalidIdentityError(LockmqError, ValueError):
    """Refused before connecting: the client id (or lock SN) breaks the identity rule
    (SPEC §2), so the broker would refuse it. Nothing was sent.

    Attributes:
        code: ``ErrorCode.INVALID_ARGUMENT``.
    """

    def __init__(self, message: str, code: int) -> None:
        self.code = code
        super().__init__(message)


class InsecureTransportError(LockmqError):
    """Refused before connecting: a token would cross the network in clear.

    Raised by :func:`lockmq.client.session.open_session` when the endpoint has no TLS,
    the host is not a loopback address and the credentials carry a secret, unless the
    endpoint says ``insecure=True`` (the CLI's ``--insecure``). No byte was sent.

    Attributes:
        code: ``ErrorCode.INVALID_ARGUMENT`` (the caller's endpoint is refused).
        name: ``"INSECURE_TRANSPORT"``.
    """

    def __init__(self, host: str) -> None:
        from lockmq.protocol import ErrorCode

        self.code = ErrorCode.INVALID_ARGUMENT
        self.name = "INSECURE_TRANSPORT"
        self.host = host
        super().__init__(
            f"refusing to send a token in clear to {host!r}: it is not a loopback address; "
            "use TLS (--tls-ca FILE / LOCKMQ_TLS_CA, or --tls for the system CAs) or say "
            "--insecure (LOCKMQ_INSECURE=1) to accept that anyone on the path can read it")
