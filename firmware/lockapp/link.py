# The broker link. run() is the ONE place every link failure ends up: a refused or
# timed-out connect, an auth failure, a reset, a silent broker, a protocol error,
# an unexpected frame - each raises out of _session() into run(), which logs
# "W net down err=...", closes the socket, waits (exponential backoff, full jitter,
# at least the broker's retry-after) and tries the next broker address.
#
# Session: CONNECT -> CHALLENGE -> AUTH -> CONNECT_ACK, driven by the protocol's
# ClientSession (the same rules the broker and every client use), then PUBLISH the offline
# queue in order (up to `window` unacked), HEARTBEAT every interval, answer COMMANDs.
# Every socket operation has a timeout; EAGAIN (unix port) and ETIMEDOUT (ESP32)
# count as timeouts.
import gc
import os
import time
import errno
import struct
import asyncio
from micropython import const
from lockmq.protocol._frame import FrameDecoder
from lockmq.protocol._lockbodies import (error_fields, publish_body, publish_ack_fields,
                                         command_result_body)
from lockmq.protocol._errors import ProtocolError
from lockmq.protocol._session import ClientSession, SessionError
from lockapp import log
from lockapp.backoff import Backoff

# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
_AUTH_DEVICE_HMAC = const(1)
_E_AUTH_FAILED = const(11)
_E_BAD_MAC = const(17)
_E_BUSY = const(20)
_E_INFLIGHT_LIMIT = const(33)
_E_INTERNAL = const(50)
_E_RATE_LIMITED = const(21)
_E_SHUTTING_DOWN = const(51)
_E_STORAGE_FULL = const(23)
_FLAG_RESPONSE = const(2)
_NO_SEQ = const(0xFFFFFFFF)
_OP_COMMAND = const(0x30)
_OP_COMMAND_RESULT = const(0x31)
_OP_DISCONNECT = const(0x06)
_OP_ERROR = const(0x0F)
_OP_FW_CHUNK = const(0x35)
_OP_HEARTBEAT = const(0x05)
_OP_PUBLISH = const(0x10)
_OP_PUBLISH_ACK = const(0x11)
_ROLE_LOCK = const(1)
# -- end of generated protocol numbers --

_TIMEOUT_ERRNOS = (errno.EAGAIN, errno.ETIMEDOUT, 11, 110, 116)
# Broker errors that mean "later", not "never": the message is sent again.
_RETRY_CODES = (_E_BUSY, _E_RATE_LIMITED, _E_STORAGE_FULL,
                _E_INTERNAL, _E_SHUTTING_DOWN, _E_INFLIGHT_LIMIT)
MAX_FRAME = 4096


class LinkError(Exception):
    # A link failure: args = (short reason without spaces, retry-after ms).
    # (MicroPython exception instances take no attributes: everything is in args.)
    pass


def within(v, lo, hi):
    # A number the network gave, bounded by this lock's own limits (SPEC 2: a lock
    # trusts no number it is given).
    if v < lo:
        return lo
    if v > hi:
        return hi
    return v


def retry_after_of(e):
    if isinstance(e, LinkError) and len(e.args) > 1:
        return e.args[1]
    return 0


def reason_of(e):
    # Short, greppable reason for any exception that ended a session.
    if isinstance(e, LinkError):
        return e.args[0]
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    if isinstance(e, OSError):
        code = e.args[0] if e.args else 0
        if code in _TIMEOUT_ERRNOS:
            return "timeout"
        if code == errno.ECONNREFUSED:
            return "refused"
        if code == errno.ECONNRESET:
            return "reset"
        return "oserror%s" % code
    if isinstance(e, ProtocolError):
        return "protocol%d" % e.code
    return "bug_" + type(e).__name__


class Link:
    def __init__(self, app):
        self.app = app
        cfg = app.cfg
        self.backoff = Backoff(cfg["backoff_min_ms"], cfg["backoff_max_ms"])
        self.up = False
        self.signal = asyncio.Event()
        self._idx = 0
        self._w = None

    # -- the one failure handler -------------------------------------------------------
    async def run(self):
        n = self.app.fatal_count
        if n:
            # Booted after n fatal reboots in a row (App.fatal): the first connect
            # waits as the n-th retry would, so that a lock failing at every session
            # does not reconnect at boot speed.
            self.backoff.attempt = n - 1
            delay = self.backoff.next_ms()
            log.warn("sys fatal_backoff n=%d ms=%d" % (n, delay))
            await asyncio.sleep_ms(delay)
        while True:
            cfg = self.app.cfg          # re-read: a config command may have changed it
            brokers = cfg["brokers"]
            self.backoff.min_ms = cfg["backoff_min_ms"]
            self.backoff.max_ms = cfg["backoff_max_ms"]
            host, port = brokers[self._idx % len(brokers)]
            host = str(host)
            port = int(port)
            retry_after = 0
            try:
                if not await self.app.hw.net_up():
                    raise LinkError("wifi")
                await self._session(host, port)
            except MemoryError:
                # Not a link failure: retrying the same allocation would loop for
                # ever (the lock online a moment, then down, acking nothing). It
                # leaves the task, and the app fails loudly and reboots (App.guard).
                raise
            except Exception as e:  # every link failure comes here
                retry_after = retry_after_of(e)
                reason = reason_of(e)
                if reason == "auth":
                    log.error("net auth failed broker=%s:%d" % (host, port))
                log.warn("net down err=%s broker=%s:%d" % (reason, host, port))
            finally:
                self.up = False
                self._close()
            self._idx += 1
            delay = self.backoff.next_ms(retry_after)
            log.info("net backoff ms=%d attempt=%d" % (delay, self.backoff.attempt))
            await asyncio.sleep_ms(delay)

    def _close(self):
        # Offline, nothing of the session is held: decoder, session keys, streams.
        self._dec = self._sess = self._r = None
        w = self._w
        self._w = None
        if w is not None:
            try:
                w.close()
            except Exception:
                pass

    # -- one session ---------------------------------------------------------------------
    async def _session(self, host, port):
        app = self.app
        cfg = app.cfg
        tmo = cfg["io_timeout_ms"]
        log.info("net connecting broker=%s:%d" % (host, port))
        r, w = await asyncio.wait_for_ms(self._open(host, port), tmo)
        self._w = w
        self._r = r
        self._dec = FrameDecoder(MAX_FRAME)
        # State in CONNECT the largest frame we can take: the broker then refuses a
        # bigger command instead of sending one that breaks this link at every
        # reconnect. That is the decoder's MAX_FRAME, or less when the heap is short:
        # a command is copied a few times on its way in (read buffer, body, args) and
        # needs contiguous blocks in a fragmented heap. Measured on the unix port,
        # free/24 was handled every time (free/16 and free/8 failed with MemoryError
        # at 128K): 128K heap -> ~1 KB, 160K -> ~2.4 KB, 4 KiB from ~98 KB free.
        gc.collect()
        self.max_frame = max(512, min(MAX_FRAME, gc.mem_free() // 24))
        log.info("net frame limit=%d" % self.max_frame)
        # Frame MACs on plain TCP (TLS already protects the frames): asked for on
        # CONNECT; the session then seals and checks every frame (SPEC "Frame MACs").
        mac = bool(cfg.get("frame_mac")) and not cfg["tls"].get("enabled")
        # The AUTH proof and the session key cover what CONNECT and CHALLENGE said (MAC
        # flag, frame limit, the broker's id): a relay that changes either fails it.
        s = ClientSession(_ROLE_LOCK, app.sn, _AUTH_DEVICE_HMAC, app.key,
                          app.client_name(), cfg["heartbeat_s"], self.max_frame, mac,
                          cfg.get("broker_id") or "")
        self._sess = s
        inflight = {}          # opaque -> [seq, sent ticks]
        self._opaque = 100
        if app.ota is not None:
            app.ota.opaque = 0     # a fetch of the last session is not answered on this one
        try:
            await self._write(s.connect_frame(1))
            auth = s.receive(await self._read_frame(tmo), os.urandom(16))
            # Events whose seq is trusted go out in the AUTH's write (SPEC "Pipelined
            # requests"): stored a round trip sooner, the radio on that much less.
            # Provisional ones wait for the CONNECT_ACK's last_seq (it may renumber them).
            if app.seq.ok:
                auth += self._publishes(inflight, time.ticks_ms())
            await self._write(auth)
            s.receive(await self._read_frame(tmo))
        except SessionError as e:
            raise LinkError("auth" if e.code == _E_AUTH_FAILED else "error%d" % e.code,
                            e.retry_after_ms)
        ack = s.ack
        app.clock.sync(ack.server_time_ms)
        if not app.seq.ok:
            app.confirm_seq(ack.last_seq)
        elif ack.last_seq != _NO_SEQ and not app.seq.broker_floor(ack.last_seq + 1):
            # far ahead of our own numbers: not taken (SPEC 2, "Sequence numbers"); the
            # broker stores what we send below it as new, never as a duplicate
            log.warn("seq floor_ignored broker_last=%d next=%d" % (ack.last_seq, app.seq.next))
        # the broker's heartbeat interval, never longer than ours (it also sets how long
        # a silent broker keeps this lock waiting: 2.5 intervals)
        hb_ms = within(ack.heartbeat_s or cfg["heartbeat_s"], 1, cfg["heartbeat_s"]) * 1000
        self.up = True
        self.backoff.reset()
        log.info("net connected broker=%s:%d%s" % (host, port, " mac=1" if mac else ""))
        await self._pump_loop(hb_ms, tmo, inflight)

    async def _open(self, host, port):
        tls = self.app.cfg["tls"]
        if not tls.get("enabled"):
            return await asyncio.open_connection(host, port)
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.verify_mode = ssl.CERT_REQUIRED   # never left to a port's default
        f = open(tls.get("ca", "ca.der"), "rb")
        try:
            ctx.load_verify_locations(cadata=f.read())
        finally:
            f.close()
        return await asyncio.open_connection(host, port, ssl=ctx,
                                             server_hostname=tls.get("server_hostname") or host)

    def _publishes(self, inflight, now):
        # The PUBLISH frames of the queued events not in flight, in order, up to the
        # window, as one write; each is registered in `inflight`.
        app = self.app
        q = app.q
        out = []
        window = app.cfg["window"]
        if len(inflight) < window and len(q):
            sending = [v[0] for v in inflight.values()]
            for i in range(len(q)):
                if len(inflight) >= window:
                    break
                seq = q.seq_at(i)
                if seq in sending or q.is_acked(seq):
                    continue
                data = q.get(seq)
                if data is None:
                    continue
                self._opaque += 1
                inflight[self._opaque] = [seq, now]
                # the LockEvent record: type, method, result u8, value u16, ts_ms u64
                ts = struct.unpack_from(">Q", data, 5)[0]
                out.append(self._sess.seal(_OP_PUBLISH, app.sn,
                                           publish_body(app.cfg["topic"], seq, ts, data),
                                           self._opaque))
        return out[0] if len(out) == 1 else b"".join(out)

    async def _send(self, opcode, body, opaque, flags=0):
        await self._write(self._sess.seal(opcode, self.app.sn, body, opaque, flags))

    async def _write(self, data):
        self._w.write(data)
        await asyncio.wait_for_ms(self._w.drain(), self.app.cfg["io_timeout_ms"])

    async def _read_frame(self, timeout_ms):
        # The next frame, reading with a timeout; raises on EOF / timeout.
        while True:
            f = self._dec.next_frame()
            if f is not None:
                return f
            data = await asyncio.wait_for_ms(self._r.read(512), timeout_ms)
            if not data:
                raise LinkError("closed")
            self._dec.feed(data)

    # -- the session's steady state ------------------------------------------------------
    async def _pump_loop(self, hb_ms, tmo, inflight):
        app = self.app
        pause_until = None     # ticks: BUSY said wait
        last_rx = time.ticks_ms()
        last_hb = time.ticks_ms()
        if app.ota is not None and app.ota.on_trial():
            last_hb = time.ticks_add(last_hb, -hb_ms)   # an update on trial heartbeats at once
        dead_ms = hb_ms * 5 // 2
        self._err = None
        rx = asyncio.create_task(self._rx_loop())
        self._rx_frames = []
        try:
            while True:
                if self._err is not None:
                    raise self._err
                now = time.ticks_ms()
                # 1. frames from the reader task
                while self._rx_frames:
                    f = self._rx_frames.pop(0)
                    last_rx = now
                    pause = await self._on_frame(f, inflight)
                    if pause:
                        pause_until = time.ticks_add(now, pause)
                ota = app.ota
                if ota is not None and ota.refused:
                    ota.refused = False     # a new session's CONNECT says why (rollouts)
                    raise LinkError("ota_refused")
                if app.reboot_pending:
                    if app.reboot_pending == "ota":
                        app.reset("ota")        # main.py switches to the staged update
                    else:
                        app.reboot("cmd")
                    return
                # 2. publish the queue in order, up to `window` unacked
                if pause_until is not None and time.ticks_diff(pause_until, now) <= 0:
                    pause_until = None
                if pause_until is None:
                    out = self._publishes(inflight, now)
                    if out:
                        await self._write(out)
                # 2b. an update being fetched: its next piece (lockapp/ota.py)
                if app.ota is not None:
                    out = app.ota.request(self._sess.seal, app.sn, self.max_frame, now, tmo)
                    if out:
                        await self._write(out)
                # 3. heartbeat
                if time.ticks_diff(now, last_hb) >= hb_ms:
                    last_hb = now
                    await self._send(_OP_HEARTBEAT, app.heartbeat(), 1)
                    app.log_mem()
                    app.session_ok()
                # 4. liveness: Wi-Fi lost, silent broker, unanswered publish
                if not app.hw.net_ok():
                    raise LinkError("wifi")
                if time.ticks_diff(now, last_rx) > dead_ms:
                    raise LinkError("silent")
                for v in inflight.values():
                    if time.ticks_diff(now, v[1]) > tmo:
                        raise LinkError("ack_timeout")
                # 5. sleep until something happens (new event, frame) or 200 ms
                self.signal.clear()
                if not self._rx_frames and self._err is None:
                    try:
                        await asyncio.wait_for_ms(self.signal.wait(), 200)
                    except asyncio.TimeoutError:
                        pass
        finally:
            rx.cancel()

    async def _rx_loop(self):
        try:
            data = b""     # first: frames that came in the same read as CONNECT_ACK
            while True:
                if data:
                    self._dec.feed(data)
                while True:
                    try:
                        f = self._dec.next_frame()
                    except ProtocolError as e:
                        if e.fatal:
                            raise
                        continue      # a frame newer than this firmware: skipped
                    if f is None:
                        break
                    self._rx_frames.append(f)
                    if len(self._rx_frames) > 64:
                        raise LinkError("rx_overflow")
                if self._rx_frames:
                    self.signal.set()
                if not self._dec.buffered():
                    self._dec.feed(b"")   # all decoded: let the last chunk read go
                data = None               # ... and not hold it while waiting
                data = await self._r.read(512)
                if not data:
                    raise LinkError("closed")
        except asyncio.CancelledError:
            pass
        except Exception as e:
            self._err = e
            self.signal.set()

    async def _on_frame(self, f, inflight):
        # Handle one frame from the broker; returns a pause in ms (BUSY) or 0.
        app = self.app
        op = f.opcode
        try:
            self._sess.receive(f)       # a frame the broker may not send unasked: ignored
        except SessionError as e:
            if e.fatal:                 # a bad frame tag: altered or injected on the path
                log.error("net refused op=%d code=%d" % (op, e.code))
                raise LinkError("mac" if e.code == _E_BAD_MAC else "error%d" % e.code)
            log.warn("net ignored op=%d code=%d" % (op, e.code))
            return 0
        if op == _OP_PUBLISH_ACK:
            v = inflight.pop(f.opaque, None)
            if v is not None:
                status = publish_ack_fields(f.body)[0]   # a malformed ack ends the session
                app.q.ack(v[0])
                log.info("evt acked seq=%d%s" % (v[0], " dup" if status else ""))
            return 0
        if op == _OP_FW_CHUNK:
            if app.ota is not None and app.ota.on_chunk(f.body):
                app.reboot_pending = "ota"
            return 0
        if op == _OP_ERROR:
            code, _, retry_after_ms = error_fields(f.body)
            ota = app.ota
            if ota is not None and ota.opaque and f.opaque == ota.opaque:
                ota.on_error(code, retry_after_ms)      # the bundle's fetch refused
                return 0
            v = inflight.pop(f.opaque, None) if f.flags & _FLAG_RESPONSE else None
            if v is None or code == _E_BAD_MAC:
                # BAD_MAC: the frame was altered on the path, not refused for what it
                # says -- keep the event queued; it goes again on a new session
                raise LinkError("error%d" % code, retry_after_ms)
            if code in _RETRY_CODES:
                ms = within(retry_after_ms or 1000, 1, app.cfg["backoff_max_ms"])
                log.warn("evt busy retry_ms=%d seq=%d code=%d" % (ms, v[0], code))
                return ms
            # Refused for good (malformed, forbidden...): drop it, counted, logged.
            app.q.reject(v[0])
            log.error("evt rejected seq=%d code=%d total=%d" % (v[0], code, app.q.dropped))
            return 0
        if op == _OP_COMMAND:
            cmd_id, status, detail = app.handle_command(f.body)
            await self._send(_OP_COMMAND_RESULT,
                             command_result_body(app.sn, cmd_id, status, detail[:200]),
                             f.opaque, _FLAG_RESPONSE)
            return 0
        if op == _OP_HEARTBEAT and app.ota is not None:
            app.ota.session_ok()        # the broker answered: an update on trial is kept
            return 0
        if op == _OP_DISCONNECT:
            raise LinkError("disconnect")
        # HEARTBEAT answers, OK and anything else: liveness only.
        return 0
