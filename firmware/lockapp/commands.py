# Downlink commands: verify, then execute, then answer.
# A command runs only if its MAC (HMAC-SHA256 under this lock's key, see
# protocol command_mac) is right, it is addressed to this lock, it has not expired
# (broker time, synced at connect) and its id is above the last one run. The last
# id and its result are persisted BEFORE the command runs (at most once); a
# redelivery of that same id gets the stored answer again without running twice.
import json
import struct
from micropython import const
from lockmq.protocol._lockbodies import command_fields
from lockmq.protocol._auth import command_mac
from lockmq.protocol._hmac import compare_digest
from lockmq.protocol._errors import ProtocolError
from lockapp import atomic, log, cards

# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
_K_CARDS_SET = const(2)
_K_CONFIG = const(3)
_K_FW_UPDATE = const(5)
_K_REBOOT = const(4)
_K_UNLOCK = const(1)
_S_EXPIRED = const(3)
_S_FAILED = const(1)
_S_OK = const(0)
_S_REFUSED = const(2)
_S_UNSUPPORTED = const(5)
# -- end of generated protocol numbers --

PATH = "cmd.dat"
NAMES = {_K_UNLOCK: "unlock", _K_CARDS_SET: "cards",
         _K_CONFIG: "config", _K_REBOOT: "reboot",
         _K_FW_UPDATE: "fw-update"}


class Commands:
    def __init__(self, app, path=PATH):
        self.app = app
        self.path = path
        self.last_id = 0
        self.last_status = _S_OK
        raw = atomic.read(path)
        if raw is not None and len(raw) == 5:
            self.last_id, self.last_status = struct.unpack(">IB", raw)

    def handle(self, body, now_ms):
        # body: the COMMAND frame body. Returns (cmd_id, status, detail).
        try:
            target, cmd_id, expires_ms, kind, args, mac = command_fields(body)
        except ProtocolError:
            log.warn("cmd refused id=0 reason=malformed")
            return 0, _S_REFUSED, "malformed"
        app = self.app
        name = NAMES.get(kind, "kind%d" % kind)
        if target != app.sn or not compare_digest(
                command_mac(app.key, app.sn, cmd_id, expires_ms, kind, args), mac):
            return self._refuse(cmd_id, "bad_sig")
        if cmd_id == self.last_id and cmd_id:
            log.info("cmd %s id=%d dup status=%d" % (name, cmd_id, self.last_status))
            return cmd_id, self.last_status, "duplicate"
        if cmd_id < self.last_id:
            return self._refuse(cmd_id, "replay")
        if now_ms >= expires_ms:
            log.warn("cmd refused id=%d reason=expired" % cmd_id)
            return cmd_id, _S_EXPIRED, "expired"
        status, detail = self._check(kind, args)
        if status == _S_OK:
            self._persist(cmd_id, status)
            try:
                detail = self._run(kind, args, cmd_id)
            except Exception as e:
                status, detail = _S_FAILED, str(e)
                self._persist(cmd_id, status)
        else:
            self._persist(cmd_id, status)
        if status == _S_OK:
            log.info("cmd %s id=%d ok" % (name, cmd_id))
        else:
            log.warn("cmd %s id=%d failed err=%s" % (name, cmd_id, log.clean(detail)))
        return cmd_id, status, detail

    def _refuse(self, cmd_id, reason):
        log.warn("cmd refused id=%d reason=%s" % (cmd_id, reason))
        return cmd_id, _S_REFUSED, reason

    def _persist(self, cmd_id, status):
        atomic.write(self.path, struct.pack(">IB", cmd_id, status))
        self.last_id = cmd_id
        self.last_status = status

    def _check(self, k, a):
        # Parse/validate arguments (kind, args) without side effects.
        try:
            if k == _K_UNLOCK:
                if len(a) != 2 or not 1 <= struct.unpack(">H", a)[0] <= 600:
                    return _S_FAILED, "unlock seconds must be 1..600"
            elif k == _K_CARDS_SET:
                n = struct.unpack(">H", a[:2])[0]
                if cards.count(memoryview(a)[2:]) != n:     # no copy of the list
                    return _S_FAILED, "card count does not match the list"
            elif k == _K_CONFIG:
                obj = json.loads(bytes(a).decode())
                if not isinstance(obj, dict):
                    return _S_FAILED, "config must be a JSON object"
                # Repointing the lock (brokers, TLS) must be marked in the signed
                # command itself; cfgchange checks it again before writing.
                if ("brokers" in obj or "tls" in obj) and obj.get("network") is not True:
                    return _S_REFUSED, "network_unmarked"
            elif k == _K_REBOOT:
                pass
            elif k == _K_FW_UPDATE:
                from lockapp.ota import check_args
                check_args(a)
            else:
                return _S_UNSUPPORTED, "unsupported"
        except (ValueError, IndexError) as e:
            return _S_FAILED, "bad args: %s" % e
        return _S_OK, ""

    def _run(self, k, args, cmd_id=0):
        app = self.app
        if k == _K_UNLOCK:
            seconds = struct.unpack(">H", args)[0]
            app.lock.unlock(seconds)
            app.emit("unlock", value=seconds, remote=True)
            return "unlocked %ds" % seconds
        if k == _K_CARDS_SET:
            cards.save(memoryview(args)[2:])
            return "%d cards" % struct.unpack(">H", args[:2])[0]
        if k == _K_CONFIG:
            app.change_config(json.loads(bytes(args).decode()))
            return "applied"
        if k == _K_REBOOT:
            app.reboot_pending = True
            return "rebooting"
        if k == _K_FW_UPDATE:
            return app.begin_update(cmd_id, args)
        return ""
