"""Opening an authenticated session: CONNECT -> CHALLENGE -> AUTH -> CONNECT_ACK.

The rules are the protocol's :class:`~lockmq.protocol.ClientSession` (the same object
the lock firmware drives); this module adds the asyncio I/O around it. Used by the
producer, the consumer, the admin client and the lock simulator alike.
Two ways to prove who we are:

* a **token** (services, operators): ``Credentials.token("id.secret")``;
* a **device key** (locks): ``Credentials.device(key)``; the proof is
  ``HMAC-SHA256(key, b"lockmq-auth-v2" + nonce + cnonce + sn_len + sn + transcript)``
  (SPEC 2, "The session transcript").

With no credentials the client still answers a challenge (with an empty token),
which a broker running ``auth = "off"`` accepts.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import ssl as _ssl
from dataclasses import dataclass
from typing import Callable

from lockmq.protocol import (
    AuthMethod,
    ESTABLISHED,
    ClientSession,
    ConnectAck,
    ErrorCode,
    ErrorReply,
    Role,
    SessionError,
    check_identity,
)

from ._conn import FrameConnection
from .errors import (
    AuthError,
    BrokerError,
    BusyError,
    ConnectionLost,
    ForbiddenError,
    InsecureTransportError,
    InvalidIdentityError,
    TlsError,
)

CLIENT_NAME = "lockmq-py/0.1"
DEFAULT_PORT = 6800
DEFAULT_MAX_FRAME = 1024 * 1024

_BUSY = {ErrorCode.BUSY, ErrorCode.RATE_LIMITED, ErrorCode.TOO_MANY_CONNECTIONS,
         ErrorCode.STORAGE_FULL, ErrorCode.INFLIGHT_LIMIT, ErrorCode.SHUTTING_DOWN}
_AUTH = {ErrorCode.NOT_AUTHENTICATED, ErrorCode.AUTH_FAILED, ErrorCode.TOKEN_EXPIRED,
         ErrorCode.REPLAY, ErrorCode.AUTH_TIMEOUT, ErrorCode.SN_MISMATCH}
_CODE_NAMES = {v: k for k, v in vars(ErrorCode).items() if not k.startswith("_")}


def error_from_body(body: bytes) -> BrokerError:
    """Turn an ERROR frame's body into the matching :class:`BrokerError` subclass."""
    err = ErrorReply.decode(body)
    return _broker_error(err.code, err.retry_after_ms, err.message)


def _broker_error(code: int, retry_after_ms: int, message: str) -> BrokerError:
    cls: type[BrokerError] = BrokerError
    if code in _BUSY:
        cls = BusyError
    elif code in _AUTH:
        cls = AuthError
    elif code == ErrorCode.FORBIDDEN:
        cls = ForbiddenError
    return cls(code, retry_after_ms, message, _CODE_NAMES.get(code, ""))


def _explain(exc: SessionError, credentials: "Credentials") -> str:
    """The broker's refusal, plus what this side knows: that no token was given."""
    if exc.code == ErrorCode.AUTH_FAILED and credentials.method == AuthMethod.TOKEN \
            and not credentials.secret:
        return (f"{exc.message}: no token was given and the broker requires one "
                "(--token TOKEN or LOCKMQ_TOKEN; token= in the library)")
    return exc.message


@dataclass(frozen=True)
class Credentials:
    """How a connection proves its identity (see module docs)."""

    method: int
    secret: bytes

    @staticmethod
    def token(token: str | None) -> "Credentials":
        """A service/operator token (``None``: an empty token, for ``auth = "off"``)."""
        return Credentials(AuthMethod.TOKEN, (token or "").encode())

    @staticmethod
    def device(key: bytes) -> "Credentials":
        """A lock's per-device key."""
        return Credentials(AuthMethod.DEVICE_HMAC, bytes(key))


@dataclass
class Endpoint:
    """Where a broker listens and how to reach it.

    Attributes:
        host, port: the broker's address (default 127.0.0.1:6800).
        ssl: an :class:`ssl.SSLContext` for TLS, or None for plain TCP.
        connect_timeout_s: limit on TCP connect plus handshake.
        connect_retry_s: how long a client's *first* connect keeps retrying a broker
            that is not there yet (connection refused or reset, handshake timeout,
            BUSY / SHUTTING_DOWN ...), with jittered exponential backoff; 0 = one
            attempt. A refusal of the credentials or of TLS is never retried. (Once
            connected, a client reconnects on its own; see ``reconnect``.)
        max_frame: largest frame accepted from the broker.
        server_hostname: name to verify in the broker's certificate when it differs
            from ``host`` (TLS only; e.g. connecting by IP to ``gw.local``).
        insecure: allow a token over plain TCP to a non-loopback host (see
            :func:`cleartext_refusal`); off by default.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    ssl: _ssl.SSLContext | None = None
    connect_timeout_s: float = 10.0
    connect_retry_s: float = 30.0
    max_frame: int = DEFAULT_MAX_FRAME
    server_hostname: str | None = None
    insecure: bool = False

    @staticmethod
    def parse(address: str) -> "Endpoint":
        """``host:port``, ``host`` or ``:port``."""
        host, _, port = address.rpartition(":") if ":" in address else (address, "", "")
        return Endpoint(host or "127.0.0.1", int(port) if port else DEFAULT_PORT)


def parse_endpoints(endpoint: "Endpoint | str | list[Endpoint]") -> list["Endpoint"]:
    """A broker list: ``"host1:port,host2:port"`` (a primary and its standby), one
    :class:`Endpoint`, or a list of them. Clients try them in turn (see
    ``SessionClient``)."""
    if isinstance(endpoint, Endpoint):
        return [endpoint]
    if isinstance(endpoint, str):
        out = [Endpoint.parse(a.strip()) for a in endpoint.split(",") if a.strip()]
    else:
        out = list(endpoint)
    if not out:
        raise ValueError("no broker address given")
    return out


def is_loopback_host(host: str) -> bool:
    """True for a loopback IP literal (127.0.0.0/8, ::1) or ``localhost``.

    Names other than ``localhost`` count as remote: checking what they resolve to
    would trust DNS, which an attacker on the path may answer.
    """
    h = host.strip().strip("[]").rstrip(".").lower()
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def cleartext_refusal(endpoint: Endpoint, credentials: Credentials) -> InsecureTransportError | None:
    """The error to raise before connecting, or None when the connection may go ahead.

    A token is a bearer secret: over plain TCP anyone on the path can copy it and it
    stays valid. So a token (a non-empty ``TOKEN`` secret) goes in clear only to a
    loopback host or when the endpoint says ``insecure``. A lock's device key never
    crosses the wire (only an HMAC proof over fresh nonces), and an empty token
    (``auth = "off"``) has nothing to steal.
    """
    if endpoint.ssl is not None or endpoint.insecure:
        return None
    if credentials.method != AuthMethod.TOKEN or not credentials.secret:
        return None
    if is_loopback_host(endpoint.host):
        return None
    return InsecureTransportError(endpoint.host)


async def open_session(
    endpoint: Endpoint,
    sn: str,
    role: int,
    credentials: Credentials,
    on_frame: Callable[[object], None] | None = None,
    on_lost: Callable[[BaseException | None], None] | None = None,
    keepalive_s: int = 30,
) -> tuple[FrameConnection, ConnectAck]:
    """Connect, authenticate and return the live connection and the broker's ack.

    Raises :class:`InvalidIdentityError` or :class:`InsecureTransportError` (before any
    connect: an id the broker would refuse; a token would go in clear to a remote
    host), :class:`AuthError`, :class:`BusyError` (too many connections, ...),
    :class:`BrokerError` or :class:`ConnectionLost`. Frames the broker sent right
    after CONNECT_ACK wait in ``conn.early_frames``: call ``conn.dispatch_early()``
    once the caller is ready for them.
    """
    refusal = cleartext_refusal(endpoint, credentials)
    if refusal is not None:
        raise refusal   # before any socket exists: the token never leaves this process
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()

    def factory() -> FrameConnection:
        return FrameConnection(sn, endpoint.max_frame, on_frame=inbox.put_nowait,
                               on_lost=lambda exc: inbox.put_nowait(None))

    if sn or role == Role.LOCK:
        try:
            check_identity(sn, "lock SN" if role == Role.LOCK else "client id")
        except SessionError as exc:   # the client library raises its own errors only
            raise InvalidIdentityError(str(exc), exc.code) from None
    session = ClientSession(role, sn, credentials.method, credentials.secret, CLIENT_NAME,
                            keepalive_s)

    async def handshake() -> tuple[FrameConnection, ConnectAck]:
        try:
            _, conn = await loop.create_connection(
                factory, endpoint.host, endpoint.port, ssl=endpoint.ssl,
                server_hostname=(endpoint.server_hostname or None) if endpoint.ssl else None,
            )
        except _ssl.SSLError as exc:   # a certificate problem: retrying will not help
            raise TlsError(f"TLS with {endpoint.host}:{endpoint.port} failed: {exc}") from exc
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {endpoint.host}:{endpoint.port}: {exc}") from exc
        try:
            conn.send_bytes(session.connect_frame(conn.new_opaque()))
            while session.state != ESTABLISHED:
                frame = await inbox.get()
                if frame is None:
                    raise ConnectionLost("broker closed the connection during the handshake")
                try:
                    out = session.receive(frame, os.urandom(16), conn.new_opaque())
                except SessionError as exc:
                    raise _broker_error(exc.code, exc.retry_after_ms,
                                        _explain(exc, credentials)) from None
                if out:
                    conn.send_bytes(out)
            ack = session.ack
        except BaseException:
            conn.close()
            raise
        # Frames that come after CONNECT_ACK (a command waiting for this lock, say)
        # are held until the caller has stored the connection: conn.dispatch_early().
        conn.holding = True
        while not inbox.empty():
            early = inbox.get_nowait()
            if early is not None:
                conn.early_frames.append(early)
        conn.on_frame = on_frame
        conn.on_lost = on_lost
        if conn.transport is None:
            raise ConnectionLost("broker closed the connection after the handshake")
        return conn, ack

    return await asyncio.wait_for(handshake(), endpoint.connect_timeout_s)
