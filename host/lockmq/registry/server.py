"""The registry server: an asyncio listener speaking the lockmq frame protocol.

Gateways and clients authenticate like everywhere else (CONNECT / CHALLENGE / AUTH
with a token from the registry's token file, through ``lockmq.protocol``'s
ServerSession) and then send ``ADMIN_REQUEST`` JSON ops:

* ``registry.register`` {name, building, addresses, tls_port, topics, role}
* ``registry.heartbeat`` {name, topics?} -- ``UNKNOWN_GATEWAY``: register again
* ``registry.lookup`` {topic?, building?} -> {gateways: [...]}
* ``registry.list`` -> {gateways: [...], evict_after_s}

A sweep every ``sweep_s`` evicts gateways silent for ``evict_after_s``. The table
is saved (atomically, fsynced) to ``state_file`` when it changes shape (a gateway
added or removed), not on every heartbeat.

Who is who (docs/security.md, "The campus registry"): a registry authenticates every
peer (tokens are required; ``allow_anonymous`` is for development and says so in the
log), and a gateway name belongs to one credential -- the first that registered it,
or the one a tokens-file line names (``TOKEN gw-north gw-south``: that token owns
those names from the start and may register no others). A register or heartbeat of
a name by another credential is refused (FORBIDDEN), logged ``gateway_name_refused``
and counted; the owners survive evictions and restarts (the state file).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import time
from typing import Any

from lockmq.eventlog import EventLog
from lockmq.clock import SYSTEM_CLOCK, Clock
from lockmq.protocol import (NO_SEQ, NONCE_SIZE, AuthMethod, ConnectAck, ErrorCode, Flag,
                             FrameDecoder, Op, ProtocolError, Role, ServerSession,
                             SessionError, decode_json, encode_json, error_frame)
from lockmq.protocol import CLOSING, ESTABLISHED
from lockmq.store.files import atomic_write, read_file

from .table import GatewayTable, RegistryError

#: the registry's ops (docs/operators.md, "The registry's ops")
OPS = ("registry.deregister", "registry.heartbeat", "registry.list", "registry.lookup",
       "registry.register")

#: frames the registry accepts (a lookup answer for 1000 gateways fits easily)
MAX_FRAME = 1024 * 1024
#: what ConnectAck tells clients about heartbeats
HEARTBEAT_S = 30
HANDSHAKE_TIMEOUT_S = 5.0
#: an established peer silent this long is dropped (clients heartbeat every HEARTBEAT_S)
IDLE_TIMEOUT_S = 3 * HEARTBEAT_S
#: connections at once (each holds at most one frame of MAX_FRAME)
MAX_CONNECTIONS = 1024


def load_tokens(path: str) -> list[bytes]:
    """The accepted tokens: one ``id.secret`` a line (optionally followed by the
    gateway names it owns: :func:`load_token_names`), ``#`` comments."""
    return list(load_token_names(path))


def load_token_names(path: str) -> dict[bytes, tuple[str, ...]]:
    """Token -> the gateway names an admin provisioned for it (empty: any name it
    registers first), from a tokens file: ``TOKEN [NAME ...]`` a line."""
    out: dict[bytes, tuple[str, ...]] = {}
    with open(path, encoding="utf-8") as fh:
        for ln in fh:
            words = ln.split("#", 1)[0].split()
            if words:
                out[words[0].encode()] = tuple(words[1:])
    return out


def fingerprint(token: bytes) -> str:
    """What the registry keeps of a credential to name an owner (never the token)."""
    return hashlib.sha256(b"lockmq-registry-owner-v1" + bytes(token)).hexdigest()[:32]


class RegistryServer:
    """One registry. ``await start()``, then ``await stop()``.

    ``tokens``: accepted tokens, or a map token -> the gateway names provisioned for
    it (:func:`load_token_names`). None is refused unless ``allow_anonymous`` (tests
    and development: every peer is trusted and names have no owners).
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0,
                 tokens: list[bytes] | dict[bytes, tuple[str, ...]] | None = None,
                 state_file: str = "",
                 clock: Clock = SYSTEM_CLOCK, evict_after_s: float = 120.0,
                 sweep_s: float = 5.0, max_gateways: int = 1000, max_topics: int = 1000,
                 log: EventLog | None = None, allow_anonymous: bool = False,
                 ssl: Any = None) -> None:
        if tokens is None and not allow_anonymous:
            raise ValueError("a registry authenticates its peers: give it tokens (lockmq "
                             "registry --tokens FILE), or allow_anonymous for development")
        self.host, self.port = host, port
        #: a server ``ssl.SSLContext`` (``lockmq registry --tls-cert/--tls-key``): tokens
        #: then never cross the network in clear; None: plain TCP
        self.ssl = ssl
        names = tokens if isinstance(tokens, dict) else dict.fromkeys(tokens or (), ())
        self.tokens: list[bytes] | None = None if tokens is None else list(names)
        #: credential fingerprint -> the names provisioned for it (only those)
        self.pinned: dict[str, tuple[str, ...]] = {fingerprint(t): n for t, n in names.items()
                                                   if n}
        self.state_file = state_file
        self.clock = clock
        self.sweep_s = sweep_s
        self.table = GatewayTable(clock, evict_after_s, max_gateways, max_topics)
        for cred, pinned in self.pinned.items():
            for name in pinned:
                self.table.owners[name] = cred     # provisioned: before any state file
        self.log = log or EventLog()
        self.stats = {"connections": 0, "auth_failed": 0, "registers": 0, "heartbeats": 0,
                      "lookups": 0, "evicted": 0, "refused": 0, "names_refused": 0}
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task | None = None
        self._open = 0

    # -- life cycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Load the state file, listen, start the sweep."""
        if self.state_file:
            blob = read_file(self.state_file)
            if blob:
                try:
                    self.table.restore(json.loads(blob))
                except ValueError:
                    self.log("registry_state_unreadable", level="warning", file=self.state_file)
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  limit=MAX_FRAME, ssl=self.ssl,
                                                  ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S
                                                  if self.ssl else None)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = asyncio.ensure_future(self._sweep_loop())
        self.log("registry_started", host=self.host, port=self.port,
                 auth="token" if self.tokens is not None else "off",
                 transport="tls" if self.ssl else "PLAIN-TCP",
                 gateways=len(self.table.gateways), evict_after_s=self.table.evict_after_s)

    async def stop(self) -> None:
        """Stop listening and sweeping; save the table."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        self._save()
        self.log("registry_stopped", gateways=len(self.table.gateways))

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            self.sweep()

    def sweep(self) -> list[str]:
        """Evict silent gateways now (the loop calls this every ``sweep_s``)."""
        gone = self.table.sweep()
        for name in gone:
            self.stats["evicted"] += 1
            self.log("gateway_evicted", name=name, evict_after_s=self.table.evict_after_s,
                     level="warning")
        if gone:
            self._save()
        return gone

    def _save(self) -> None:
        if self.state_file:
            atomic_write(self.state_file, json.dumps(self.table.snapshot()).encode())

    # -- one connection -----------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self._open >= MAX_CONNECTIONS:
            writer.write(error_frame(ErrorCode.TOO_MANY_CONNECTIONS, "registry is full"))
            writer.close()
            return
        self._open += 1
        self.stats["connections"] += 1
        session, decoder = ServerSession(), FrameDecoder(MAX_FRAME)
        cred: list[str | None] = [None]   # the peer's credential once authenticated
        try:
            deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
            while True:
                timeout = IDLE_TIMEOUT_S if session.state == ESTABLISHED \
                    else max(0.01, deadline - time.monotonic())
                data = await asyncio.wait_for(reader.read(65536), timeout)
                if not data:
                    return
                decoder.feed(data)
                for frame in decoder.frames():
                    try:
                        was = session.state
                        session.receive(frame)
                        if was == ESTABLISHED:
                            out = self._request(session, frame, cred[0], peer)
                        elif frame.opcode == Op.CONNECT:
                            out = session.challenge(os.urandom(NONCE_SIZE),
                                                    int(time.time() * 1000), frame.opaque)
                        elif frame.opcode == Op.AUTH:
                            out = self._auth(session, frame, peer, cred)
                        else:
                            return   # DISCONNECT before authentication
                    except SessionError as exc:
                        writer.write(error_frame(exc.code, exc.message, frame.opaque))
                        if exc.fatal:
                            return
                        continue
                    if out is None:
                        return
                    writer.write(out)
                    if session.state == CLOSING:   # refused
                        return
                await writer.drain()
        except ProtocolError as exc:
            writer.write(error_frame(exc.code, exc.message))
        except asyncio.TimeoutError:
            writer.write(error_frame(ErrorCode.AUTH_TIMEOUT, "authentication not finished in time")
                         if session.state != ESTABLISHED else b"")
        except (ConnectionError, OSError):
            pass
        except Exception as exc:  # noqa: BLE001 -- a registry bug: log it, keep serving
            self.log("internal_error", peer=str(peer), error=repr(exc), level="error")
        finally:
            self._open -= 1
            writer.close()

    def _auth(self, session: ServerSession, frame: Any, peer: Any,
              cred: list[str | None]) -> bytes:
        auth = session.auth
        name = frame.sn or "anonymous"   # the session checks every later frame's SN
        if self.tokens is not None:
            ok = auth.method == AuthMethod.TOKEN and any(
                hmac.compare_digest(auth.proof, t) for t in self.tokens)
            if not ok:
                self.stats["auth_failed"] += 1
                self.log("auth_failed", peer=str(peer), sn=name, level="warning")
                return session.refuse(ErrorCode.AUTH_FAILED, "authentication failed",
                                      frame.opaque)
            cred[0] = fingerprint(auth.proof)
        ack = ConnectAck(HEARTBEAT_S, MAX_FRAME, int(time.time() * 1000), NO_SEQ, 0)
        return session.accept(Role.ADMIN, name, ack, frame.opaque)

    def _request(self, session: ServerSession, frame: Any, cred: str | None = None,
                 peer: Any = None) -> bytes | None:
        op = frame.opcode
        if op == Op.DISCONNECT:
            return None
        if op == Op.HEARTBEAT:
            body = b""
            if frame.flags & Flag.ONEWAY:
                return b""
            return session.seal(Op.HEARTBEAT, "", body, frame.opaque, Flag.RESPONSE)
        if op != Op.ADMIN_REQUEST:
            return error_frame(ErrorCode.UNEXPECTED_FRAME,
                               "a registry answers only ADMIN_REQUEST registry.* ops",
                               frame.opaque)
        try:
            req = decode_json(frame.body)
            reply = self.handle(str(req.get("op", "")), req.get("args") or {}, cred)
        except RegistryError as exc:
            self.stats["refused"] += 1
            if exc.code == "FORBIDDEN":
                self.stats["names_refused"] += 1
                self.log.limited("gateway_name_refused", "gateway_name_refused",
                                 peer=str(peer), message=exc.message, level="warning")
            reply = {"ok": False, "error": exc.code, "message": exc.message}
        except (ValueError, AttributeError) as exc:
            reply = {"ok": False, "error": "INVALID_ARGUMENT", "message": str(exc)}
        return session.seal(Op.ADMIN_RESPONSE, "", encode_json(reply), frame.opaque,
                            Flag.RESPONSE)

    # -- the ops --------------------------------------------------------------------------
    def handle(self, op: str, args: dict[str, Any], cred: str | None = None) -> dict[str, Any]:
        """Run one ``registry.*`` op for the credential ``cred`` (its fingerprint;
        None with ``allow_anonymous``); RegistryError for a refused one."""
        if not isinstance(args, dict):
            raise RegistryError("INVALID_ARGUMENT", "args must be an object")
        t = self.table
        if op in ("registry.register", "registry.heartbeat"):
            pinned = self.pinned.get(cred or "")
            if pinned and args.get("name") not in pinned:
                raise RegistryError("FORBIDDEN", f"this credential may register only "
                                    f"{', '.join(pinned)} (its line in the tokens file)")
        if op == "registry.register":
            new = args.get("name") not in t.gateways
            gw = t.register(args, cred)
            self.stats["registers"] += 1
            if new:
                self.log("gateway_registered", name=gw.name, building=gw.building,
                         addresses=",".join(gw.addresses), role=gw.role, topics=len(gw.topics))
                self._save()
            return {"ok": True, "evict_after_s": t.evict_after_s}
        if op == "registry.deregister":   # a gateway stopping cleanly
            found = t.deregister(args)
            if found:
                self.log("gateway_deregistered", name=args.get("name"))
                self._save()
            return {"ok": True, "found": found}
        if op == "registry.heartbeat":
            t.heartbeat(args, cred)
            self.stats["heartbeats"] += 1
            return {"ok": True}
        if op == "registry.lookup":
            self.stats["lookups"] += 1
            return {"ok": True, "gateways": t.lookup(args.get("topic"), args.get("building"))}
        if op == "registry.list":
            return {"ok": True, "gateways": t.lookup(), "evict_after_s": t.evict_after_s,
                    "stats": dict(self.stats)}
        # the broker's answer to an unknown admin op (lockmq.broker.admin): one code
        raise RegistryError("INVALID_ARGUMENT", f"unknown op {op!r}; ops: {', '.join(OPS)}")
