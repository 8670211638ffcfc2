"""The Guard: the broker's single entry point to lockmq.security.

One Guard per broker. The broker calls, in order:

* :meth:`Guard.admit` when a connection is accepted (and :meth:`Guard.release`
  when it closes, whatever happened);
* :meth:`Guard.challenge` to get the nonce of the CHALLENGE frame;
* :meth:`Guard.authenticate` with the AUTH body — it returns a
  :class:`~lockmq.security.principal.Principal` or raises
  :class:`~lockmq.security.errors.AuthFailed`; the broker closes the connection
  if it has not succeeded within :attr:`Guard.auth_timeout_s`
  (:meth:`Guard.auth_timed_out` logs and counts that);
* per frame: :meth:`Guard.check_publish` / :meth:`Guard.check_consume` /
  :meth:`Guard.check_command` / :meth:`Guard.check_frame_sn`;
* :meth:`Guard.sign_command` when it sends a command down to a lock.

Every refusal raises a :class:`~lockmq.security.errors.SecurityError` with the
wire code, and is logged and counted (:attr:`Guard.metrics`).

``[broker] auth = "off"`` (tests, development) is the same Guard with the trusting
policy (:meth:`Guard.open`): the claimed identity is accepted, no registry file is
opened, no connection or message limit applies, commands go out unsigned. Every
other rule (SN binding, ``$`` system topics, the producer-id charset, what a lock may
not do) is the one code path of both.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol, runtime_checkable

from lockmq.protocol import HARD_MAX_FRAME, Auth, AuthMethod, CommandKind, identity_problem

from . import audit, keys
from .commands import SignedCommand, check_network_marked, command_mac, config_network_keys
from .config import SecurityConfig
from .errors import (AuthFailed, AuthRateLimited, AuthTimeout, LimitExceeded, PermissionDenied,
                     RateLimited, Replayed, SecurityError, TokenExpired)
from .identity import check_producer_id as _check_producer_id
from .identity import system_topic_refusal
from .limits import (LRU, ConnectionLimiter, FailureLimiter, MessageRateLimiter, SourcePolicy,
                     check_buffered, check_frame_size)
from .nonces import NonceBook
from .principal import ADMIN, COMMAND_DENIED_MESSAGE, LOCK, SERVICE, Permissions, Principal
from .registry import DeviceRegistry, valid_sn
from .tokens import TokenError, TokenStore

METHOD_DEVICE = "device"
METHOD_TOKEN = "token"
_DUMMY_KEY = b"\x00" * keys.KEY_BYTES
_CONFIG = CommandKind.CONFIG


@runtime_checkable
class BrokerGuard(Protocol):
    """Everything the broker asks of security: what :class:`Guard` implements (with
    ``auth = "required"`` or, :meth:`Guard.open`, ``"off"``), so the broker calls one
    typed interface and never probes.

    Every ``check_*`` raises a :class:`~lockmq.security.errors.SecurityError`
    (carrying the wire code, the public message and whether to close) or returns.
    """

    #: what the broker logs as ``auth=``: ``"required"`` or ``"off"``
    auth_mode: str

    @property
    def preauth_max_frame(self) -> int:
        """Largest frame a connection may send before it has authenticated."""

    @property
    def lock_frames_need_mac(self) -> bool:
        """Locks on plain TCP must ask for frame MACs (``lock_frame_mac = "required"``)."""

    @property
    def broker_id(self) -> str:
        """This broker's name for the CHALLENGE ("" = none sent)."""

    def admit(self, peer_ip: str) -> None:
        """Count a new connection in, or raise (a connection limit)."""

    def release(self, peer_ip: str) -> None:
        """Count a closed connection out (once per successful :meth:`admit`)."""

    def challenge(self) -> bytes:
        """A fresh nonce for the CHALLENGE frame."""

    def forget_challenge(self, nonce: bytes) -> None:
        """The connection holding ``nonce`` closed before authenticating."""

    def auth_timed_out(self, peer_ip: str, nonce: bytes | None = None) -> SecurityError:
        """Count a handshake that took too long; the error to send."""

    def authenticate(self, claimed_sn: Any, auth_body: Any, nonce: bytes, peer_ip: str,
                     *, tls: bool = False, transcript: bytes = b"") -> Principal:
        """The principal an AUTH answer proves (a device proof covering the session
        ``transcript``), or raise."""

    def check_frame_sn(self, principal: Principal, sn: Any) -> None:
        """A frame's SN must be the principal's (counted when it is not)."""

    def check_publish(self, principal: Principal, topic: str, sn: Any = None,
                      n: int = 1) -> None:
        """May ``principal`` publish ``n`` records to ``topic``?"""

    def publish_quota(self, principal: Principal, topic: str, n: int) -> int:
        """How many of ``n`` records in a row to ``topic`` ``principal`` may publish
        now: 0 when it may not publish there at all; refuses and audits nothing."""

    def publish_credit(self, principal: Principal, n: int) -> int:
        """Up to ``n`` records taken from ``principal``'s message rate in advance
        (the broker's lane spends them); -1: ``principal`` has no rate limit."""

    def return_credit(self, principal: Principal, n: int) -> None:
        """Give back ``n`` records of a :meth:`publish_credit` not spent."""

    def check_heartbeat(self, principal: Principal, due: bool = False) -> None:
        """A lock's HEARTBEAT within its message rate?"""

    def check_producer_id(self, principal: Principal, producer_id: Any) -> str:
        """May ``principal`` publish under ``producer_id``? Returns the id."""

    def check_consume(self, principal: Principal, topic: str, cluster: str) -> None:
        """May ``principal`` join ``cluster`` on ``topic``?"""

    def check_command(self, principal: Principal, sn: str, kind: int | None = None,
                      args: bytes | None = None) -> None:
        """May ``principal`` send this command to lock ``sn``?"""

    def check_admin(self, principal: Principal, op: str = "") -> None:
        """May ``principal`` use admin operation ``op``?"""

    def record_protocol_error(self, peer_ip: str, reason: str) -> None:
        """Count a malformed frame or a broken session rule from ``peer_ip``."""

    def next_command_id(self, sn: str) -> int:
        """The next command id of lock ``sn`` (strictly increasing)."""

    def sign_command(self, sn: str, cmd_id: int, expires_ms: int, kind: int, args: bytes,
                     principal: Principal | None = None) -> bytes:
        """The MAC of a COMMAND for lock ``sn`` (empty: unsigned)."""

    def listeners(self, port: int) -> list[dict[str, Any]]:
        """The listeners to open: ``[{"port": int, "tls": bool}]``."""

    def tls_context(self) -> Any:
        """The server ``ssl.SSLContext``, or None without TLS."""

    def log_listener(self, port: int, tls: bool) -> None:
        """Log an open listener (a plain one marked as unencrypted)."""

    def status(self) -> dict[str, Any]:
        """Counters and gauges for the metrics."""

    def standing(self, principal: Principal) -> str:
        """Why ``principal`` may no longer act, read from the registry now ("" if it
        still may): a revoked or expired token, a disabled, removed or re-keyed lock."""

    def authorize_status(self, view: str, authorization: str) -> str:
        """May an HTTP request with header ``Authorization: authorization`` read the
        status page's ``view`` (``"metrics"`` or ``"views"``)? "" if so, else why not."""

    def security_version(self) -> int:
        """A number that changes when the registry file was written by another process."""

    def revocations(self, since: float) -> tuple[set[str], list[tuple[str, bool, int]]]:
        """``(ids of tokens not active, devices changed since since)``."""

    def close(self) -> None:
        """Release files."""

    def reopen_registries(self) -> None:
        """Open the registry files again (a reload)."""


def _field(body: Any, *names: str) -> Any:
    """The first of ``names`` present in ``body`` (a dict or an object)."""
    for name in names:
        if isinstance(body, dict):
            if name in body:
                return body[name]
        elif hasattr(body, name):
            return getattr(body, name)
    return None


#: the protocol's numeric AUTH methods
_METHOD_IDS = {1: METHOD_DEVICE, 2: METHOD_TOKEN}


def _method(body: Any) -> str:
    if type(body) is Auth and type(body.method) is int:   # the broker's decoded AUTH
        return _METHOD_IDS.get(body.method, "")
    m = _field(body, "method")
    if isinstance(m, (bytes, bytearray)):
        m = bytes(m).decode("ascii", "replace")
    if isinstance(m, int):  # numeric method ids: 1 device, 2 token
        return _METHOD_IDS.get(m, "")
    m = str(getattr(m, "name", m) or "").lower()
    if m in ("device", "hmac", "device_hmac"):
        return METHOD_DEVICE
    if m in ("token", "bearer"):
        return METHOD_TOKEN
    if m == "" and _field(body, "token") is not None:
        return METHOD_TOKEN
    if m == "" and _field(body, "proof") is not None:
        return METHOD_DEVICE
    return m


def _as_sn(sn: Any) -> str:
    if isinstance(sn, (bytes, bytearray)):
        return bytes(sn).decode("ascii", "backslashreplace")
    return "" if sn is None else str(sn)


class Guard:
    """Identity, permissions and limits of one broker.

    Args:
        cfg: the security settings.
        registry: device registry (opened from ``cfg`` if not given).
        tokens: token store (opened from ``cfg`` if not given).
        log: the broker's event log (``log(event, level=..., **fields)``); every
            security event is also written there. Python logging always gets it.
        clock: monotonic clock for rates and timeouts (tests inject one).
        wall: Unix clock for token and command expiry.
        auth: ``"required"``, or ``"off"``: the trusting policy (use :meth:`open`).
    """

    def __init__(self, cfg: SecurityConfig, *, registry: DeviceRegistry | None = None,
                 tokens: TokenStore | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 log: Callable[..., None] | None = None, auth: str = "required") -> None:
        cfg.validate()
        self.cfg = cfg
        #: What the broker logs at start as ``auth=`` (the truth, whatever a file said).
        self.auth_mode = auth
        #: ``auth = "off"``: trust the claim; no registry, tokens, limits or keys
        self.open = auth == "off"
        self.registry: DeviceRegistry = None if self.open else (  # type: ignore[assignment]
            registry or DeviceRegistry.open(cfg))
        self.tokens: TokenStore = None if self.open else (  # type: ignore[assignment]
            tokens or TokenStore(cfg.registry_path))
        #: auth = "off": the last command id given per lock (no registry keeps them)
        self._cmd_ids: dict[str, int] = {}
        self.clock = clock
        self.wall = wall
        self.metrics = audit.Metrics()
        # One notion of "source" (IPv4 /ipv4_prefix, IPv6 /ipv6_prefix) for the
        # connection caps, the connect rate and the failure counters alike.
        self.sources = SourcePolicy(cfg.ipv4_prefix, cfg.ipv6_prefix,
                                    cfg.limit_exempt_addresses)
        self.connections = ConnectionLimiter(
            cfg.max_connections, cfg.max_connections_per_address, cfg.connect_rate,
            cfg.connect_burst, cfg.limit_exempt_addresses, cfg.max_tracked_keys, clock,
            policy=self.sources)
        self.nonces = NonceBook(cfg.nonce_ttl_s, cfg.max_tracked_keys, clock)
        # Failed authentications per source, and per (source, claimed SN). They only
        # ever change how a *failed* attempt is answered (RATE_LIMITED): a correct
        # answer is never refused because of failures, so nobody -- not even a peer
        # behind the real lock's own NAT -- can lock a lock out by failing in its name.
        self._fail_addr = FailureLimiter(cfg.auth_fail_per_address, cfg.auth_fail_window_s,
                                         cfg.max_tracked_keys, clock)
        self._fail_sn = FailureLimiter(cfg.auth_fail_per_sn, cfg.auth_fail_window_s,
                                       cfg.max_tracked_keys, clock)
        self.message_rate = MessageRateLimiter(cfg.lock_message_rate, cfg.lock_message_burst,
                                               cfg.max_tracked_keys, clock)
        # Proofs accepted recently: the same proof again is a replayed exchange.
        self._used_proofs: LRU[bytes, bool] = LRU(cfg.max_tracked_keys)
        self.metrics.sink = log
        #: system topics the broker writes besides identity.INTERNAL_TOPICS (the
        #: configured ``[devices]`` topics): no client may publish there
        self.internal_topics: frozenset[str] = frozenset()

    @classmethod
    def open(cls, log: Callable[..., None] | None = None, **kwargs: Any) -> "Guard":
        """The guard of ``auth = "off"``: any claimed identity is accepted -- a peer
        answering with the device method is a lock named by its frame SN, any other
        is an admin -- with no registry file, no connection, auth-failure or message
        limit (every address exempt, no lock rate) and no command key."""
        cfg = SecurityConfig(limit_exempt_addresses=["0.0.0.0/0", "::/0"],
                             lock_message_rate=0.0)
        return cls(cfg, log=log, auth="off", **kwargs)

    @classmethod
    def from_broker_config(cls, config: Any, **kwargs: Any) -> "Guard":
        """A Guard from a whole ``lockmq.config.Config`` (``[broker]`` + ``[security]``)."""
        g = cls(SecurityConfig.from_broker_config(config), **kwargs)
        # the devices' AUTH snapshot read now, not by the first lock of a storm
        g.registry.load_snapshot()
        d = getattr(config, "devices", None)
        if d is not None:
            g.internal_topics = frozenset(t for t in (d.events_topic, d.heartbeats_topic) if t)
        return g

    def close(self) -> None:
        """Close the registry files."""
        if self.open:
            return
        self.registry.close()
        self.tokens.close()

    def reopen_registries(self) -> None:
        """Open the device and token registries again (a broker reload): a file
        restored or replaced on disk is the one read from now on."""
        if self.open:
            return
        old = (self.registry, self.tokens)
        self.registry = DeviceRegistry.open(self.cfg)
        self.registry.load_snapshot()
        self.tokens = TokenStore(self.cfg.registry_path)
        for store in old:
            store.close()

    # -- the status page ---------------------------------------------------------

    def authorize_status(self, view: str, authorization: str) -> str:
        """``[security] status_token_required`` / ``metrics_token_required``: the
        named views need an admin token, ``/metrics`` (when protected) any valid one,
        as ``Authorization: Bearer <token>``. A loopback bind is not access control."""
        need = self.cfg.metrics_token_required if view == "metrics" \
            else self.cfg.status_token_required
        if not need or self.open:   # (auth off: the status page is open)
            return ""
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "a token is needed (Authorization: Bearer <token>)"
        try:
            info = self.tokens.verify(token.strip(), now=self.wall())
        except TokenError as exc:
            audit.record(self.metrics, "status_refused", exc.reason)
            return "token refused"
        if view != "metrics" and not info.permissions.admin:
            audit.record(self.metrics, "status_refused", "not_admin")
            return "an admin token is needed"
        return ""

    # -- standing now (lockmq.broker.admission) ------------------------------------

    def standing(self, principal: Principal) -> str:
        """Why ``principal`` may no longer act ("" if it still may), from the registry
        as it is now: a deferred item (scheduled, transactional, held command) takes
        effect only for a principal that still stands."""
        if self.open:
            return ""   # nobody is ever revoked with auth off
        if principal.kind == LOCK:
            enabled, version = self.registry.standing(principal.name)
            if not enabled:
                return "lock disabled or removed"
            if principal.key_version and version != principal.key_version:
                return "lock re-keyed"
            return ""
        if not principal.token_id:
            return ""
        info = self.tokens.get(principal.token_id)
        if info is None:
            return "token unknown"
        state = info.state(self.wall())
        return "" if state == "active" else f"token {state}"

    def security_version(self) -> int:
        """The registry file's ``data_version`` (moves on every outside commit)."""
        return 0 if self.open else self.registry.data_version()

    def revocations(self, since: float) -> tuple[set[str], list[tuple[str, bool, int]]]:
        """Tokens not active now, and the devices written at or after ``since``."""
        if self.open:
            return set(), []
        return self.tokens.not_active(self.wall()), self.registry.changed_since(since)

    # -- settings the broker enforces ---------------------------------------------

    @property
    def auth_timeout_s(self) -> float:
        """Seconds a new connection has to authenticate (slowloris defence)."""
        return self.cfg.auth_timeout_s

    @property
    def max_frame_bytes(self) -> int:
        """Largest frame accepted (give it to the decoder)."""
        return self.cfg.max_frame_bytes

    @property
    def preauth_max_frame(self) -> int:
        """Largest frame before authentication (give it to a new connection's decoder,
        then raise the decoder's limit to :attr:`max_frame_bytes` after AUTH)."""
        if self.open:
            return HARD_MAX_FRAME   # no smaller limit before authentication than after
        return min(self.cfg.preauth_max_frame_bytes, self.cfg.max_frame_bytes)

    @property
    def lock_frames_need_mac(self) -> bool:
        """``lock_frame_mac = "required"``: locks on plain TCP must ask for frame MACs."""
        return self.cfg.lock_frame_mac == "required"

    @property
    def broker_id(self) -> str:
        """``[security] broker_id``: sent in CHALLENGE, covered by the lock's proof."""
        return self.cfg.broker_id

    @property
    def max_buffered_bytes(self) -> int:
        """Bytes one connection may have buffered."""
        return self.cfg.max_buffered_bytes

    # -- connections ----------------------------------------------------------------

    def admit(self, peer_ip: str) -> None:
        """Count a new connection in; :class:`ConnectionRefused` names the limit hit."""
        try:
            self.connections.admit(peer_ip)
        except LimitExceeded as exc:
            audit.record(self.metrics, "connection_refused", exc.limit, addr=peer_ip)
            raise
        self.metrics.inc("connection_admitted")

    def release(self, peer_ip: str) -> None:
        """Count a closed connection out (call once per successful :meth:`admit`)."""
        self.connections.release(peer_ip)

    def challenge(self) -> bytes:
        """A fresh, single-use 16-byte nonce for the CHALLENGE frame."""
        return self.nonces.issue()

    def forget_challenge(self, nonce: bytes) -> None:
        """The connection holding ``nonce`` closed before authenticating."""
        self.nonces.discard(nonce)

    def auth_timed_out(self, peer_ip: str, nonce: bytes | None = None) -> AuthTimeout:
        """Log and count a connection closed for not authenticating in time.

        Returns the :class:`AuthTimeout` error to send before closing.
        """
        if nonce:
            self.nonces.discard(nonce)
        audit.record(self.metrics, "auth_timeout", "auth_timeout", addr=peer_ip,
                     timeout_s=self.cfg.auth_timeout_s)
        return AuthTimeout(f"no authentication from {peer_ip} within "
                           f"{self.cfg.auth_timeout_s} s", reason="auth_timeout")

    # -- authentication -------------------------------------------------------------

    def authenticate(self, claimed_sn: Any, auth_body: Any, nonce: bytes, peer_ip: str,
                     *, tls: bool = False, transcript: bytes = b"") -> Principal:
        """Check an AUTH answer to the challenge ``nonce``; return the Principal.

        ``transcript``: the session's ``ServerSession.transcript`` (the broker always
        passes it): a device proof must cover it, so a CONNECT or CHALLENGE changed on
        the path (a stripped MAC flag, a lowered frame limit) fails here.

        ``auth_body`` is the decoded AUTH body (dict or object) with ``method``
        (device/token), and ``cnonce`` + ``proof`` (device) or ``token`` (token).
        Raises :class:`AuthFailed` — the same public error for an unknown SN, a wrong
        key, a disabled device, a replayed nonce or a bad token — or
        :class:`AuthRateLimited` after too many failures.

        With ``auth = "off"`` every claim is accepted: the device method is the lock
        ``claimed_sn``, anything else an admin.
        """
        if self.open:
            return self._trust(claimed_sn, auth_body, nonce, peer_ip, tls)
        sn = _as_sn(claimed_sn)
        src = self.sources.key(peer_ip)
        exempt = self.sources.exempt(peer_ip)
        method = _method(auth_body)
        # No refusal before the proof is checked: the failure counters are keyed by
        # source, and the real lock may share its source (NAT, /64) with an attacker.
        try:
            nonce_problem = self.nonces.consume(nonce) if nonce else "no_nonce"
            if method == METHOD_DEVICE:
                principal = self._auth_device(sn, auth_body, bytes(nonce or b""), nonce_problem,
                                              bytes(transcript), tls)
            elif method == METHOD_TOKEN:
                principal = self._auth_token(sn, auth_body, peer_ip, tls, nonce_problem)
            else:
                raise AuthFailed(f"unknown auth method {method!r}", reason="bad_method")
        except AuthFailed as exc:
            raise self._failed(exc, sn, src, exempt, peer_ip, method, tls) from None
        principal.peer_ip = peer_ip
        principal.tls = tls
        if method == METHOD_DEVICE and valid_sn(sn):
            self._fail_sn.succeed(f"{src}|{sn}")
        audit.record(self.metrics, "auth_ok", principal.kind, name=principal.name,
                     addr=peer_ip, tls=tls, transport="tls" if tls else "PLAIN-TCP")
        return principal

    def _trust(self, claimed_sn: Any, auth_body: Any, nonce: bytes, peer_ip: str,
               tls: bool) -> Principal:
        """auth = "off": the principal a peer claims to be."""
        if nonce:
            self.nonces.discard(nonce)
        if getattr(auth_body, "method", None) == AuthMethod.DEVICE_HMAC and claimed_sn:
            p = Principal(name=claimed_sn, kind=LOCK, lock_topics=("*",), peer_ip=peer_ip,
                          session_nonce=nonce)
        else:
            p = Principal(name=claimed_sn or "anonymous", kind=ADMIN,
                          permissions=Permissions(admin=True), peer_ip=peer_ip)
        p.tls = tls
        return p

    def _failed(self, exc: AuthFailed, sn: str, src: str, exempt: bool, peer_ip: str,
                method: str, tls: bool) -> AuthFailed:
        """Count a failed authentication against its source; return the error to
        raise: ``exc`` itself, or :class:`AuthRateLimited` once that source is over
        a limit.

        The penalty falls on the source that fails (its failed attempts get
        RATE_LIMITED with ``retry_after_ms`` until its window ends) -- other sources
        are not affected, and a correct proof from anywhere is accepted whatever the
        counters say (see :meth:`authenticate`)."""
        per_sn = method == METHOD_DEVICE and valid_sn(sn)
        # the first `limit` failures in a window are answered AUTH_FAILED, later ones
        # RATE_LIMITED: look at the count before adding this failure
        wait, scope = 0.0, ""
        if per_sn:
            wait, scope = self._fail_sn.blocked(f"{src}|{sn}"), "per_source_sn"
            self._fail_sn.fail(f"{src}|{sn}")
        if not exempt:
            if not wait:
                wait, scope = self._fail_addr.blocked(src), "per_address"
            self._fail_addr.fail(src)
        if wait:
            audit.record(self.metrics, "auth_rate_limited", scope, sn=sn, addr=peer_ip,
                         source=src, method=method, failure=exc.reason)
            what = f"SN {sn[:64]!r} from {src}" if scope == "per_source_sn" else src
            return AuthRateLimited(f"too many failed authentications for {what}",
                                   reason="auth_rate_limited",
                                   retry_after_ms=int(wait * 1000) + 1)
        audit.record(self.metrics, "auth_failed", exc.reason, sn=sn, addr=peer_ip,
                     method=method, tls=tls)
        return exc

    def _auth_device(self, sn: str, body: Any, nonce: bytes, nonce_problem: str,
                     transcript: bytes = b"", tls: bool = False) -> Principal:
        if type(body) is Auth:   # the broker's decoded AUTH: both fields bytes already
            cnonce, proof = body.cnonce, body.proof
        else:
            cnonce = bytes(_field(body, "cnonce", "client_nonce") or b"")
            proof = bytes(_field(body, "proof", "mac") or b"")
        key, state, need_mac, need_tls, key_version = (
            self.registry.lookup_policy(sn) if valid_sn(sn)
            else (None, "unknown", False, False, 0))
        # Compute the MAC whether or not the SN exists: same work, same answer.
        want = keys.device_proof(key or _DUMMY_KEY, nonce, cnonce, sn.encode("ascii", "replace"),
                                 transcript)
        good = keys.equal(want, proof)
        if nonce_problem or self._used_proofs.get(proof):
            raise Replayed(f"device {sn}: {nonce_problem or 'proof already used'}",
                           reason="replayed")
        if not 8 <= len(cnonce) <= 64:
            raise AuthFailed(f"device {sn}: client nonce of {len(cnonce)} bytes",
                             reason="bad_cnonce")
        if key is None:
            reason = "device_disabled" if state == "disabled" else "unknown_sn"
            raise AuthFailed(f"device {sn}: {reason}", reason=reason)
        if not good:
            raise AuthFailed(f"device {sn}: wrong proof (wrong key, a replayed answer, or a "
                             "CONNECT/CHALLENGE changed on the path)", reason="bad_proof")
        if need_tls and not tls:
            # provisioned for TLS: plain TCP is a downgrade, whatever the lock sent
            raise AuthFailed(f"device {sn}: provisioned for TLS, connected over plain TCP",
                             reason="tls_required")
        self._used_proofs.put(proof, True)
        return Principal(name=sn, kind=LOCK,
                         lock_topics=tuple(p.replace("{sn}", sn) for p in self.cfg.lock_topics),
                         session_nonce=nonce, client_nonce=cnonce,
                         session_key=keys.session_key(key, nonce, cnonce, sn, transcript),
                         need_mac=need_mac, key_version=key_version)

    def _auth_token(self, sn: str, body: Any, peer_ip: str, tls: bool,
                    nonce_problem: str) -> Principal:
        token = _field(body, "token")
        if token is None:  # protocol AUTH: the token travels in the proof field
            token = _field(body, "proof")
        if isinstance(token, (bytes, bytearray)):
            token = bytes(token).decode("utf-8", "replace")
        if not tls and peer_ip not in self.cfg.allow_plain_tokens_from:
            audit.record(self.metrics, "plain_token_refused", "plain_token", addr=peer_ip)
            raise AuthFailed(f"token sent over plain TCP from {peer_ip}", reason="plain_token")
        if nonce_problem:
            raise Replayed(f"token auth: {nonce_problem}", reason="replayed")
        try:
            info = self.tokens.verify(str(token or ""), now=self.wall())
        except TokenError as exc:
            if exc.reason == "token_expired":
                raise TokenExpired(str(exc), reason=exc.reason) from None
            raise AuthFailed(str(exc), reason=exc.reason) from None
        name = sn or info.name
        if sn and identity_problem(sn):   # (the protocol Session refuses it at CONNECT too)
            raise AuthFailed(f"token {info.id} ({info.name}) claims client id {sn[:80]!r} "
                             "outside the identity charset", reason="bad_client_id")
        # A token may not speak under a lock's SN, nor a lookalike of one (compared
        # case-insensitively); the answer is the same as for a bad token.
        lock_sn = self.registry.exists_folded(name)
        if lock_sn is not None:
            raise AuthFailed(f"token {info.id} ({info.name}) claims client id {name!r}, "
                             f"a registered lock SN or a lookalike of one",
                             reason="token_claims_lock")
        kind = ADMIN if info.permissions.admin else SERVICE
        return Principal(name=name, kind=kind, permissions=info.permissions, token_id=info.id,
                         token_name=info.name)

    # -- per-frame checks -------------------------------------------------------------

    def _refuse(self, exc: SecurityError, principal: Principal | None, **fields: Any) -> None:
        event = "sn_mismatch" if exc.reason == "sn_mismatch" else (
            "rate_limited" if exc.reason == "lock_message_rate" else (
                "limit_exceeded" if isinstance(exc, LimitExceeded) else (
                    "bad_command" if exc.code_name == "INVALID_ARGUMENT" else "permission_denied")))
        audit.record(self.metrics, event, exc.reason,
                     name=principal.name if principal else None,
                     kind=principal.kind if principal else None, **fields)

    def check_frame_sn(self, principal: Principal, sn: Any) -> None:
        """A frame's SN must be the authenticated one (:class:`IdentityMismatch`)."""
        try:
            principal.check_frame_sn(sn)
        except SecurityError as exc:
            self._refuse(exc, principal, claimed=_as_sn(sn))
            raise

    def check_publish(self, principal: Principal, topic: str, sn: Any = None, n: int = 1) -> None:
        """SN binding, topic permission and (for locks) the message rate of a publish.
        The broker binds a frame's SN in the session and passes none: no second check
        per record on the publish path. With auth off only ``$`` system topics are
        refused (nobody has the system right), whatever the principal."""
        if sn is not None:
            self.check_frame_sn(principal, sn)
        try:
            if topic in self.internal_topics:
                raise system_topic_refusal(principal, topic, internal=True)
            if not self.open or topic[:1] == "$":   # (auth off: rights guard `$` only)
                principal.require_publish(topic)
            if principal.is_lock:
                self.message_rate.check(principal.name, n)
        except SecurityError as exc:
            self._refuse(exc, principal, topic=topic)
            raise

    def publish_quota(self, principal: Principal, topic: str, n: int) -> int:
        """How many of ``n`` records in a row to ``topic`` may ``principal`` publish
        now, from the first: :meth:`check_publish` for a run of records in one step
        (the broker's publish path, once per read and topic). 0 when the topic is
        not allowed; for a lock, what its message rate has room for, taken from its
        budget. Refuses and audits nothing: the caller passes the records over the
        quota to :meth:`check_publish` one by one, which refuses (and audits) each
        exactly as before."""
        if topic in self.internal_topics or not (
                principal.may_publish(topic) or self.open and topic[:1] != "$"):
            return 0
        if principal.is_lock:
            return self.message_rate.take_up_to(principal.name, n)
        return n

    def publish_credit(self, principal: Principal, n: int) -> int:
        """Up to ``n`` records taken from a lock's message rate in advance, for the
        broker's lane to spend (what is left goes back with :meth:`return_credit`);
        -1 when ``principal`` has no rate limit. The topic rights are checked per topic
        by :meth:`publish_quota` before the lane takes a topic."""
        if not (principal.is_lock and self.message_rate.enabled):
            return -1
        return self.message_rate.take_up_to(principal.name, n)

    def return_credit(self, principal: Principal, n: int) -> None:
        """Give back ``n`` records of a :meth:`publish_credit` not spent."""
        if principal.is_lock:
            self.message_rate.give_back(principal.name, n)

    def check_heartbeat(self, principal: Principal, due: bool = False) -> None:
        """A lock's HEARTBEAT takes one message of its per-lock rate (issue 10 item 8:
        heartbeats used to bypass it). ``due``: the keepalive the lock's interval calls
        for -- taken from the budget if there is one, but never refused, so that a lock
        flushing its queue at the rate limit keeps its connection. Raises
        :class:`RateLimited` (the connection stays) for any other heartbeat over the rate."""
        if not principal.is_lock:
            return
        wait = self.message_rate.take(principal.name)
        if wait and not due:
            exc = RateLimited("lock_message_rate",
                              f"lock {principal.name} sends heartbeats faster than its "
                              f"message rate allows", retry_after_ms=int(wait * 1000) + 1)
            self._refuse(exc, principal, frame="heartbeat")
            raise exc

    def check_producer_id(self, principal: Principal, producer_id: Any) -> str:
        """May ``principal`` publish under ``producer_id`` (a PUBLISH frame's SN, or its
        own name)? See :mod:`lockmq.security.identity`: the charset, never ``$...``, a
        lock only as itself, a token holder never as a registered lock's SN or a
        lookalike, nor under an id another principal published under first (claimed
        and persisted here on first use). Returns the id; raises
        :class:`PermissionDenied` (FORBIDDEN). Call once per connection and id."""
        pid = _as_sn(producer_id)
        max_ids = self.cfg.max_producer_ids_per_principal
        if self.open:   # no registry, so no ownership: the charset and `$` only
            try:
                return _check_producer_id(principal, pid)
            except SecurityError as exc:
                self._refuse(exc, principal, producer_id=pid)
                raise

        def taken(p: str, owner: str) -> bool:
            why = self.registry.claim_producer_id(p, owner, max_ids, now=self.wall())
            if why:
                audit.record(self.metrics, "producer_id_refused", why, name=principal.name,
                             owner=owner, producer_id=p)
            return bool(why)

        try:
            return _check_producer_id(principal, pid, taken=taken)
        except SecurityError as exc:
            self._refuse(exc, principal, producer_id=pid)
            raise

    def check_consume(self, principal: Principal, topic: str, cluster: str) -> None:
        """May ``principal`` join ``cluster`` on ``topic``?"""
        try:
            principal.require_consume(topic, cluster)
        except SecurityError as exc:
            self._refuse(exc, principal, topic=topic, cluster=cluster)
            raise

    def check_command(self, principal: Principal, sn: str, kind: int | None = None,
                      args: bytes | None = None) -> None:
        """May ``principal`` send a command of ``kind`` (with ``args``) to lock ``sn``?

        Refused (:class:`PermissionDenied`, FORBIDDEN) when the token has no right for
        that SN, that kind, or -- a CONFIG changing brokers/TLS -- ``config.network``;
        and when ``sn`` is not a registered, enabled lock, with the *same* public
        message as for an SN outside the token's scope (no enumeration; the log says
        which). Bad CONFIG arguments: :class:`InvalidCommand` (INVALID_ARGUMENT).
        An authorised network change is logged at warning level with the principal.
        With auth off only the principal's own rule applies (a lock sends no command).
        """
        if self.open:   # auth off: no registry (any SN), no rights to read from CONFIG
            try:
                principal.require_command(sn, kind)
            except SecurityError as exc:
                self._refuse(exc, principal, target=sn, command_kind=kind)
                raise
            return
        # Look the lock up first, whatever the answer will be: the same work each time.
        state = self.registry.lookup(sn)[1] if valid_sn(sn) else "unknown"
        network: tuple[str, ...] = ()
        try:
            principal.require_command(sn)                      # scope, before any detail
            marked = False
            if kind == _CONFIG and args is not None:
                network, marked = config_network_keys(args)
            principal.require_command(sn, kind, network=bool(network))
            check_network_marked(network, marked)
            if state != "enabled":
                exc = PermissionDenied(f"command to {state} lock {sn!r}",
                                       reason="unknown_lock" if state == "unknown"
                                       else "disabled_lock")
                exc.public_message = COMMAND_DENIED_MESSAGE
                raise exc
        except SecurityError as exc:
            self._refuse(exc, principal, target=sn, command_kind=kind)
            raise
        if network:
            audit.record(self.metrics, "command_network_change", "config.network",
                         name=principal.name, principal_kind=principal.kind,
                         token=principal.token_id, addr=principal.peer_ip, target=sn,
                         keys=",".join(network))
        audit.record(self.metrics, "command_authorised", "", name=principal.name, target=sn,
                     command_kind=kind)

    def check_admin(self, principal: Principal, op: str = "") -> None:
        """Admin operations need an admin principal (``replica.*``: or ``replicate``;
        with auth off every admin may run every op, ``replica.security`` too: there is
        nothing secret to copy)."""
        try:
            if self.open:
                principal.require_admin()
            else:
                principal.require_admin_op(op)
        except SecurityError as exc:
            self._refuse(exc, principal, op=op)
            raise

    def check_frame_size(self, nbytes: int, principal: Principal | None = None) -> None:
        """Refuse a frame over ``max_frame_bytes``."""
        try:
            check_frame_size(nbytes, self.cfg.max_frame_bytes)
        except SecurityError as exc:
            self._refuse(exc, principal, size=nbytes)
            raise

    def check_buffered(self, nbytes: int, principal: Principal | None = None) -> None:
        """Refuse a connection buffering over ``max_buffered_bytes``."""
        try:
            check_buffered(nbytes, self.cfg.max_buffered_bytes)
        except SecurityError as exc:
            self._refuse(exc, principal, buffered=nbytes)
            raise

    def record_protocol_error(self, peer_ip: str, reason: str) -> None:
        """Count a malformed frame (the broker calls this when its decoder refuses one;
        with auth off the broker's own bad_frames counter is all)."""
        if self.open:
            return
        audit.record(self.metrics, "bad_frame", reason, addr=peer_ip)

    # -- downlink commands --------------------------------------------------------------

    def next_command_id(self, sn: str) -> int:
        """The next command id of lock ``sn``: persisted, strictly increasing (auth
        off: increasing per lock, and with wall time across restarts)."""
        if self.open:
            nid = max(self._cmd_ids.get(sn, 0) + 1, int((self.wall() - 1_700_000_000) * 10))
            self._cmd_ids[sn] = nid = nid & 0xFFFFFFFF
            return nid
        return self.registry.next_command_id(sn)

    def sign_command(self, sn: str, cmd_id: int, expires_ms: int, kind: int, args: bytes,
                     principal: Principal | None = None) -> bytes:
        """The MAC of a COMMAND for lock ``sn`` (the protocol's ``command_mac``).

        Call at delivery time, with ``cmd_id`` from :meth:`next_command_id` (or any
        id above every id used before for this lock: the registry remembers the
        highest signed id so that :meth:`next_command_id` never goes back).
        ``principal`` is the lock's session (unused by the MAC; logged).
        Raises :class:`AuthFailed` for an unknown or disabled lock. With auth off there
        is no key: b"" (commands go out unsigned; the lock must run with auth off too).
        """
        if self.open:
            return b""
        key = self.registry.key_for(sn)
        if key is None:
            raise AuthFailed(f"command to unknown or disabled lock {sn}", reason="unknown_sn")
        self.registry.note_command_id(sn, cmd_id)
        mac = command_mac(key, sn, cmd_id, expires_ms, kind, args)
        audit.record(self.metrics, "command_signed", "", target=sn, cmd_id=cmd_id, kind=kind,
                     expires_ms=expires_ms)
        return mac

    def sign(self, sn: str, kind: int, args: bytes = b"", *,
             ttl_s: float | None = None) -> SignedCommand:
        """Allocate an id, set the expiry (now + ``ttl_s`` or ``command_ttl_s``) and sign."""
        cid = self.next_command_id(sn)
        expires_ms = int((self.wall() + (self.cfg.command_ttl_s if ttl_s is None else ttl_s))
                         * 1000)
        mac = self.sign_command(sn, cid, expires_ms, kind, args)
        return SignedCommand(sn, cid, expires_ms, kind, bytes(args), mac)

    # -- transport ------------------------------------------------------------------------

    def listeners(self, port: int) -> list[dict[str, Any]]:
        """The listeners to open: ``[{"port": int, "tls": bool}]`` (see docs/security.md)."""
        from .tls import describe_listeners

        return describe_listeners(self.cfg, port)

    def tls_context(self) -> Any:
        """The server ``ssl.SSLContext`` from ``[security] tls_cert/tls_key`` (None if unset)."""
        from .tls import server_context_from_config

        return server_context_from_config(self.cfg)

    def log_listener(self, port: int, tls: bool) -> None:
        """Log a listener; a plain-TCP one is marked clearly as unencrypted (auth off:
        the broker's start-up line, ``auth=off``, says it all)."""
        if self.open:
            return
        if tls:
            audit.record(self.metrics, "listener", "tls", port=port, transport="TLS")
        else:
            audit.record(self.metrics, "listener", "plain", port=port,
                         transport="PLAIN-TCP-UNENCRYPTED",
                         note="frames and tokens readable on the network; for locks "
                              "without TLS only")

    # -- introspection --------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Counters and gauges for the broker's metrics endpoint (none with auth off)."""
        if self.open:
            return {}
        out: dict[str, Any] = dict(self.metrics.snapshot())
        out["security_connections_open"] = self.connections.total
        out["security_challenges_outstanding"] = len(self.nonces)
        return out
