# Over-the-air update of the lock app, A/B with rollback (docs/firmware.md,
# "Updates over the air"). A signed FW_UPDATE command names a bundle by version, size
# and SHA-256; the digest is in the signed command, so the bytes need no signature of
# their own. The lock fetches the bundle over its own link (FW_FETCH / FW_CHUNK, each
# piece within its frame limit) into ota.bin, resuming from what it holds after a
# power cut; verifies the whole file; unpacks it into lib.new/ beside the running app
# (lib/); marks it "staged" and resets. lockboot (never updated) switches at boot:
# lib -> lib.old, lib.new -> lib, state "trial". The new app must connect and hold a
# session for a heartbeat within ota_trial_s, or reboot at most MAX_BOOTS times, or
# lockboot puts lib.old back ("revert") and the lock reports why at its next CONNECT.
# State, ota.dat (JSON, atomic): st = fetch | staged | trial | revert | ok | failed,
# v (version), size, sha, id (command id), why, boots.
import os
import json
import time
import struct
import asyncio
import hashlib
import binascii
from micropython import const
from lockmq.protocol._firmware import fetch_body, chunk_fields
from lockapp import atomic, log, VERSION

# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
_E_INVALID_ARGUMENT = const(8)
_OP_FW_FETCH = const(0x34)
# -- end of generated protocol numbers --

STATE = "ota.dat"
BIN = "ota.bin"
MAGIC = b"LKB1"
MAX_BOOTS = 3
MAX_SIZE = 1048576
# the opaque of the fetch in flight: apart from the link's publishes (from 100 up)
OPAQUE = 0x7FFFFF00


def state():
    # ota.dat as a dict, or None (none, or unreadable: no update under way)
    raw = atomic.read(STATE)
    if raw is None:
        return None
    try:
        s = json.loads(raw.decode())
    except ValueError:
        return None
    return s if isinstance(s, dict) else None


def note(s):
    # What CONNECT's client name adds to "lockapp/<version>": the last update's state.
    if not s or not s.get("st"):
        return ""
    out = ";ota=" + s["st"]
    if s.get("why"):
        out += ":" + s["why"]
    if s.get("v"):
        out += ";target=" + s["v"]
    return out


def rm(p):
    # lockboot's (beside main.py, never updated: the one copy), loaded for the call:
    # kept, its bytecode would hold ~1 KB of a frozen board's heap through an update
    import sys
    had = "lockboot" in sys.modules     # (on trial it runs the app: it stays)
    import lockboot
    lockboot.rm(p)
    if not had:
        sys.modules.pop("lockboot", None)


def _mkdirs(path):
    # the folders of a file path, made as needed
    i = path.find("/")
    while i > 0:
        try:
            os.mkdir(path[:i])
        except OSError:
            pass
        i = path.find("/", i + 1)


def file_sha(path):
    h = hashlib.sha256()
    buf = bytearray(512)
    f = open(path, "rb")
    try:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(memoryview(buf)[:n])
    finally:
        f.close()
    return binascii.hexlify(h.digest()).decode()


def check_args(a):
    # FW_UPDATE args -> (version, size, sha256 hex); ValueError says what is wrong
    o = json.loads(bytes(a).decode())
    v = o.get("version") if isinstance(o, dict) else None
    size = o.get("size")
    sha = str(o.get("sha256", "")).lower()
    if not isinstance(v, str) or not 0 < len(v) <= 32 or " " in v or ";" in v:
        raise ValueError("version must be 1..32 characters without spaces")
    if not isinstance(size, int) or not 0 < size <= MAX_SIZE:
        raise ValueError("size must be 1..%d" % MAX_SIZE)
    if len(sha) != 64:
        raise ValueError("sha256 must be 64 hex digits")
    binascii.unhexlify(sha)
    try:
        st = os.statvfs("/")
        free = st[0] * st[4]
    except (OSError, AttributeError):
        free = -1
    if 0 <= free < 2 * size + 16384:        # ota.bin and lib.new side by side
        raise ValueError("no room: %d bytes free for a %d-byte bundle" % (free, size))
    return v, size, sha


class Ota:
    def __init__(self, app, s):
        self.app = app
        self.s = s or {}
        self.opaque = 0          # a fetch in flight (its answer not in yet)
        self.sent = 0
        self.retry_at = None
        self.refused = False     # refused in this session: the link reconnects to say so

    def save(self):
        atomic.write(STATE, json.dumps(self.s).encode())
        self.app.client_note = note(self.s)

    # -- boot and trial ------------------------------------------------------------
    def started(self):
        # Called once the app's tasks run: a trial boot is counted and watched.
        s = self.s
        st = s.get("st")
        if st == "trial":
            s["boots"] = s.get("boots", 0) + 1
            if s["boots"] > MAX_BOOTS:
                self.revert("boot_loop")
                return
            self.save()
            ms = self.app.cfg.get("ota_trial_s", 300) * 1000
            log.info("ota trial v=%s boots=%d deadline_ms=%d" % (VERSION, s["boots"], ms))
            asyncio.create_task(self.app.guard("ota", self._watch(ms)))
        elif st == "fetch":
            log.info("ota resume v=%s at=%d size=%d" % (s["v"], max(0, atomic.size(BIN)), s["size"]))
        elif st == "staged":          # staged, then cut before the reset: reset now
            self.app.reset("ota")

    async def _watch(self, ms):
        await asyncio.sleep_ms(ms)
        if self.s.get("st") == "trial":
            self.revert("deadline")

    def revert(self, why):
        self.s["st"] = "revert"
        self.s["why"] = why
        self.save()
        log.error("ota trial failed v=%s why=%s" % (VERSION, why))
        self.app.reset("ota")

    def on_trial(self):
        return self.s.get("st") == "trial"

    def session_ok(self):
        # The new app reached the broker, which answered its heartbeat: it stays.
        if self.s.get("st") == "trial":
            self.s["st"] = "ok"
            self.s.pop("boots", None)
            self.save()
            rm("lib.old")
            log.info("ota confirmed v=%s" % VERSION)

    # -- the command -----------------------------------------------------------------
    def begin(self, cmd_id, v, size, sha):
        s = self.s
        if s.get("st") in ("trial", "staged"):
            raise ValueError("busy: update %s is %s" % (s.get("v"), s.get("st")))
        if v == VERSION and s.get("st") != "fetch":
            return "running %s already" % v
        if s.get("st") == "fetch" and s.get("sha") == sha:
            return "fetching %s (resumed)" % v          # the same bundle: keep what we hold
        atomic.remove(BIN)
        self.s = {"st": "fetch", "v": v, "size": size, "sha": sha, "id": cmd_id}
        self.save()
        log.info("ota fetch v=%s size=%d" % (v, size))
        self.app.link.signal.set()
        return "fetching %s" % v

    def fetching(self):
        return self.s.get("st") == "fetch"

    # -- the download, driven by the link -------------------------------------------
    def request(self, seal, sn, max_frame, now, tmo):
        # The next FW_FETCH frame, or None (not fetching, one in flight, or waiting).
        if not self.fetching():
            return None
        if self.opaque and time.ticks_diff(now, self.sent) < tmo:
            return None
        if self.retry_at is not None and time.ticks_diff(self.retry_at, now) > 0:
            return None
        self.retry_at = None
        self.opaque = OPAQUE
        self.sent = now
        off = max(0, atomic.size(BIN))
        n = max(256, max_frame - 96)      # header, SN, chunk header and frame tag fit
        return seal(_OP_FW_FETCH, sn, fetch_body(binascii.unhexlify(self.s["sha"]), off, n), OPAQUE)

    def on_chunk(self, body):
        # One piece in; True when the bundle is staged (the app then resets).
        self.opaque = 0
        s = self.s
        if not self.fetching():
            return False
        off, total, data = chunk_fields(body)
        if total != s["size"]:
            self.fail("size")
            return False
        have = max(0, atomic.size(BIN))
        if off != have or have + len(data) > total:
            return False                  # a stale answer: asked again
        f = open(BIN, "ab")
        try:
            f.write(data)
        finally:
            f.close()
        data = body = None
        if atomic.size(BIN) < total:
            self.app.link.signal.set()
            return False
        return self._finish()

    def on_error(self, code, retry_ms):
        self.opaque = 0
        if code == _E_INVALID_ARGUMENT:
            self.fail("unknown_bundle")
        else:
            self.retry_at = time.ticks_add(time.ticks_ms(), max(retry_ms, 1000))

    def _finish(self):
        s = self.s
        got = file_sha(BIN)
        if got != s["sha"]:
            atomic.remove(BIN)
            self.fail("digest")
            return False
        log.info("ota verified v=%s size=%d" % (s["v"], s["size"]))
        try:
            self._unpack()
        except (OSError, ValueError, IndexError) as e:
            rm("lib.new")
            self.fail("unpack_" + log.clean(e))
            return False
        s["st"] = "staged"
        self.save()
        atomic.remove(BIN)
        log.info("ota staged v=%s" % s["v"])
        return True

    def fail(self, why):
        self.s["st"] = "failed"
        self.s["why"] = why
        self.save()
        self.refused = True
        log.error("ota refused v=%s why=%s" % (self.s.get("v"), why))

    def _unpack(self):
        # ota.bin -> lib.new/: MAGIC | u8 len, version | u16 n | n x (u8 len, path | u32 size | data)
        rm("lib.new")
        buf = bytearray(512)
        f = open(BIN, "rb")
        try:
            if f.read(4) != MAGIC:
                raise ValueError("magic")
            n = f.read(1)[0]
            if f.read(n).decode() != self.s["v"]:
                raise ValueError("version")
            count = struct.unpack(">H", f.read(2))[0]
            os.mkdir("lib.new")
            for _ in range(count):
                n = f.read(1)[0]
                path = f.read(n).decode()
                if not path or path[0] == "/" or ".." in path:
                    raise ValueError("path")
                size = struct.unpack(">I", f.read(4))[0]
                dst = "lib.new/" + path
                _mkdirs(dst)
                out = open(dst, "wb")
                try:
                    while size:
                        k = f.readinto(memoryview(buf)[:min(512, size)])
                        if not k:
                            raise ValueError("short")
                        out.write(memoryview(buf)[:k])
                        size -= k
                finally:
                    out.close()
            if f.read(1):
                raise ValueError("trailing")
        finally:
            f.close()
