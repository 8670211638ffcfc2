"""A small scriptable broker for the firmware tests: the real protocol on real sockets.

It speaks the lock side of the session (CONNECT/CHALLENGE/AUTH/CONNECT_ACK,
PUBLISH/PUBLISH_ACK with (sn, seq) de-duplication, HEARTBEAT, COMMAND/
COMMAND_RESULT). Kept beside :class:`lockmq.testing.BrokerProcess` because these
tests need what the real broker will not do on request: answer the next N publishes
with BUSY, write raw (malformed) bytes to a lock, send a COMMAND in the same TCP
segment as the CONNECT_ACK, sign a command with a wrong key or MAC, and drop every
connection at once without a shutdown. It needs no registry or provisioning, so the
firmware's link is tested independently of the broker. The end-to-end tests against
the real broker are ``test_broker_e2e.py``, ``tests/security/test_e2e_firmware.py``
and ``tests/adversarial``. Runs its asyncio loop in a thread; the test drives it.
It speaks no frame MACs: a lock pointed at it is configured with ``frame_mac=False``
(the firmware's default asks for them on plain TCP; the real broker grants them).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import Future

from lockmq.protocol import (Auth, Challenge, Command, CommandResult, Connect, ConnectAck,
                             ErrorCode, ErrorReply, Flag, FrameDecoder, Heartbeat, LockEvent,
                             NO_SEQ, Op, Publish, PublishAck, command_mac, encode_frame,
                             transcript_hash, verify_auth_proof)


class MiniBroker:
    """One listening socket on 127.0.0.1; ``stored[(sn, seq)] = LockEvent``."""

    def __init__(self, keys: dict[str, bytes], heartbeat_s: int = 30, port: int = 0,
                 ssl_context=None) -> None:
        self.keys = keys
        self.ssl_context = ssl_context
        self.heartbeat_s = heartbeat_s
        self.port = port
        self.stored: dict[tuple[str, int], LockEvent] = {}
        self.order: list[tuple[str, int]] = []
        self.publishes = 0
        self.auth_failures = 0
        self.sessions = 0
        self.busy_next = 0            # answer the next N publishes with BUSY
        self.busy_retry_ms = 300
        self.results: dict[int, Future] = {}
        self.heartbeats: list[Heartbeat] = []
        self.errors: list[str] = []
        self.pending_commands: dict[str, list[bytes]] = {}   # sent with the CONNECT_ACK
        #: > 0: after an AUTH, wait up to this many seconds for a frame before sending
        #: the CONNECT_ACK (a lock that pipelines sends one; one that waits does not)
        self.hold_connect_ack_s = 0.0
        #: (sn, seq) of the PUBLISHes received before their session's CONNECT_ACK was sent
        self.early: list[tuple[str, int]] = []
        self._writers: dict[str, asyncio.StreamWriter] = {}
        self._all_writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._thread.start()
        self.start()

    # -- control (from the test thread) -------------------------------------------------
    def _call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> None:
        async def go():
            self._server = await asyncio.start_server(self._client, "127.0.0.1", self.port,
                                                      ssl=self.ssl_context)
            self.port = self._server.sockets[0].getsockname()[1]
        self._call(go())

    def stop(self) -> None:
        """Stop listening and drop every connection (a broker crash)."""
        async def go():
            if self._server is not None:
                self._server.close()
                self._server = None
            for w in list(self._all_writers):
                w.transport.abort()
        self._call(go())

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def seqs(self, sn: str) -> list[int]:
        """Seqs stored for ``sn``, in arrival order."""
        return [s for (n, s) in self.order if n == sn]

    def send_command(self, sn: str, cmd_id: int, kind: int, args: bytes = b"",
                     expires_ms: int | None = None, key: bytes | None = None,
                     mac: bytes | None = None) -> Future:
        """Send a COMMAND to a connected lock; the future gets its CommandResult."""
        if expires_ms is None:
            expires_ms = int(time.time() * 1000) + 60_000
        if mac is None:
            mac = command_mac(key or self.keys[sn], sn, cmd_id, expires_ms, kind, args)
        fut: Future = Future()
        self.results[cmd_id] = fut
        body = Command(sn, cmd_id, expires_ms, kind, args, mac).encode()

        async def go():
            w = self._writers[sn]
            w.write(encode_frame(Op.COMMAND, sn, body, 1000 + cmd_id))
            await w.drain()
        self._call(go())
        return fut

    def queue_command(self, sn: str, cmd_id: int, kind: int, args: bytes = b"") -> Future:
        """A COMMAND sent right behind the next CONNECT_ACK of ``sn`` (a broker that kept
        it while the lock was offline); the future gets its CommandResult."""
        expires_ms = int(time.time() * 1000) + 60_000
        mac = command_mac(self.keys[sn], sn, cmd_id, expires_ms, kind, args)
        fut: Future = Future()
        self.results[cmd_id] = fut
        body = Command(sn, cmd_id, expires_ms, kind, args, mac).encode()
        self.pending_commands.setdefault(sn, []).append(encode_frame(Op.COMMAND, sn, body, 1000 + cmd_id))
        return fut

    def send_raw(self, sn: str, data: bytes) -> None:
        """Write bytes to a connected lock as they are."""
        async def go():
            w = self._writers[sn]
            w.write(data)
            await w.drain()
        self._call(go())

    def wait_for(self, pred, timeout: float = 10.0) -> bool:
        """Poll ``pred()`` until true (bounded)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return True
            time.sleep(0.02)
        return pred()

    # -- the session --------------------------------------------------------------------
    async def _client(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self._all_writers.add(w)
        dec = FrameDecoder()
        sn = None

        async def frame():
            while True:
                f = dec.next_frame()
                if f is not None:
                    return f
                data = await r.read(4096)
                if not data:
                    raise ConnectionError("closed")
                dec.feed(data)

        def send(op, body, opaque, flags=Flag.RESPONSE):
            w.write(encode_frame(op, sn or "", body, opaque, flags))

        try:
            f = await frame()
            assert f.opcode == Op.CONNECT
            Connect.decode(f.body)
            sn = f.sn
            nonce = os.urandom(16)
            challenge = Challenge(nonce, int(time.time() * 1000)).encode()
            transcript = transcript_hash(sn, f.flags, f.body, challenge)
            send(Op.CHALLENGE, challenge, f.opaque)
            f = await frame()
            auth = Auth.decode(f.body)
            key = self.keys.get(sn)
            if key is None or not verify_auth_proof(key, nonce, auth.cnonce, sn, transcript,
                                                    auth.proof):
                self.auth_failures += 1
                send(Op.ERROR, ErrorReply(ErrorCode.AUTH_FAILED, "authentication failed").encode(), f.opaque)
                await w.drain()
                return
            held = []   # frames that came before the CONNECT_ACK (held, then handled)
            if self.hold_connect_ack_s > 0:
                try:
                    held.append(await asyncio.wait_for(frame(), self.hold_connect_ack_s))
                except asyncio.TimeoutError:
                    pass
                while held and (more := dec.next_frame()) is not None:
                    held.append(more)
            self.early += [(sn, Publish.decode(h.body).seq) for h in held
                           if h.opcode == Op.PUBLISH]
            last = max(self.seqs(sn), default=NO_SEQ)
            ack = encode_frame(Op.CONNECT_ACK, sn, ConnectAck(self.heartbeat_s, 65536,
                               int(time.time() * 1000), last, 1).encode(), f.opaque, Flag.RESPONSE)
            # commands kept for this lock go in the same write (one TCP segment) as the ack
            w.write(ack + b"".join(self.pending_commands.pop(sn, [])))
            self.sessions += 1
            self._writers[sn] = w
            while True:
                f = held.pop(0) if held else await frame()
                if f.opcode == Op.PUBLISH:
                    p = Publish.decode(f.body)
                    self.publishes += 1
                    if self.busy_next > 0:
                        self.busy_next -= 1
                        send(Op.ERROR, ErrorReply(ErrorCode.BUSY, "busy", self.busy_retry_ms).encode(), f.opaque)
                        continue
                    k = (sn, p.seq)
                    dup = k in self.stored
                    if not dup:
                        self.stored[k] = LockEvent.decode(p.payload)
                        self.order.append(k)
                    send(Op.PUBLISH_ACK, PublishAck(1 if dup else 0, len(self.order)).encode(), f.opaque)
                elif f.opcode == Op.HEARTBEAT:
                    self.heartbeats.append(Heartbeat.decode(f.body))
                    send(Op.HEARTBEAT, b"", f.opaque)
                elif f.opcode == Op.COMMAND_RESULT:
                    res = CommandResult.decode(f.body)
                    fut = self.results.get(res.cmd_id)
                    if fut is not None and not fut.done():
                        fut.set_result(res)
                await w.drain()
        except (ConnectionError, AssertionError, OSError):
            pass
        except Exception as e:  # a bug in this test broker: keep it visible
            self.errors.append(repr(e))
        finally:
            self._all_writers.discard(w)
            if sn is not None and self._writers.get(sn) is w:
                del self._writers[sn]
            w.close()
