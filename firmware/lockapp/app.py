# Wiring: loads config and state from flash, starts the tasks, runs until a reboot
# or quit. run() is the board's main loop: a soft reboot builds everything again
# from the files (on an ESP32 a reboot is machine.reset()).
import gc
import sys
import time
import asyncio
from micropython import const
from lockmq.protocol._event import LockEvent
from lockmq.protocol._lockbodies import heartbeat_body
from lockapp import VERSION, log, config, atomic, hw as hwmod, backoff
from lockapp.clock import Clock
from lockapp.seqno import SeqNo, CEILING
from lockapp.oqueue import OQueue
from lockapp.events import Lock, TYPES
from lockapp.link import Link

# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
_M_CARD = const(1)
_M_NONE = const(0)
_M_REMOTE = const(3)
_NO_SEQ = const(0xFFFFFFFF)
_R_DENIED_UNKNOWN = const(1)
# -- end of generated protocol numbers --


class App:
    def __init__(self):
        self.cfg = cfg = config.load()
        self.sn = cfg["sn"]
        self.key = config.key_bytes(cfg)
        self.clock = Clock()
        self.hw = hwmod.make(cfg)
        backoff.seed(self.sn.encode() + self.hw.unique_id())
        self.q = OQueue("queue.dat", cfg["queue_max"])
        self.seq = SeqNo("seq.dat", cfg["seq_block"])
        self.seq.raise_floor(max(self.q.max_seq, self.q.head) + 1)
        self.reboot_pending = False
        # Consecutive fatal reboots (App.fatal), on flash beside the queue: a lock that
        # runs out of memory at every session would otherwise reconnect at boot speed,
        # and a fleet of them is a reconnect storm. The link's first connect waits a
        # backoff for them. (The file name is a literal: an interned string, no heap.)
        n = atomic.read("fatal.dat")
        try:
            n = int(n.decode()) if n else 0
        except ValueError:
            n = 1                   # written, then damaged: at least one fatal reboot
        self.fatal_count = n
        # An update over the air under way (ota.dat): its code is loaded only then;
        # the last update's state is said at CONNECT ("lockapp/<ver>;ota=<st>...").
        self.ota = None
        self.client_note = ""
        if atomic.size("ota.dat") >= 0:
            self._load_ota()
        self.lock = Lock(self)
        self.link = Link(self)
        self.peak = 0
        self._started = time.ticks_ms()
        self._stop = asyncio.Event()
        self.stop_reason = None
        log.info("sys boot fw=%s sn=%s hw=%s" % (VERSION, self.sn, self.hw.name))
        log.info("q loaded len=%d next_seq=%d dropped=%d torn=%d"
                 % (len(self.q), self.seq.next, self.q.dropped, self.q.torn))
        if not self.seq.ok:
            log.warn("sys seq provisional next_seq=%d" % self.seq.next)

    # -- events --------------------------------------------------------------------------
    def emit(self, name, credential=b"", value=0, result=0, remote=False):
        # Queue one event durably (flash) before anyone may send it.
        if name == "failed_attempt":
            result = _R_DENIED_UNKNOWN
        method = _M_REMOTE if remote else (_M_CARD if credential else _M_NONE)
        ts = self.clock.now_ms()
        payload = LockEvent(TYPES[name], ts, method, result, value, credential).encode()
        try:
            seq = self.seq.take()
            dropped = self.q.append(seq, payload)
        except OSError as e:
            # Flash full or failing: the event cannot be kept. Counted and said.
            self.q.dropped += 1
            log.error("evt lost type=%s err=%s total=%d" % (name, log.clean(e), self.q.dropped))
            return None
        if dropped is not None:
            log.warn("evt dropped seq=%d total=%d" % (dropped, self.q.dropped))
        log.info("evt queued seq=%d type=%s" % (seq, name))
        self.link.signal.set()
        return seq

    def handle_command(self, body):
        # A downlink command (rare: a few a day). Its code is loaded for it and
        # unloaded after (module and package attribute), so its heap is not held in
        # service; the last id and result are read from cmd.dat each time, the
        # state that matters across power cuts anyway.
        import lockapp.commands
        try:
            return lockapp.commands.Commands(self).handle(body, self.clock.now_ms())
        finally:
            sys.modules.pop("lockapp.commands", None)
            del lockapp.commands

    def _load_ota(self):
        from lockapp import ota
        s = ota.state()
        self.client_note = ota.note(s)
        if s and s.get("st") in ("fetch", "staged", "trial"):
            self.ota = ota.Ota(self, s)

    def begin_update(self, cmd_id, args):
        # A verified FW_UPDATE command: fetch the bundle it names (lockapp/ota.py).
        from lockapp import ota
        v, size, sha = ota.check_args(args)
        if self.ota is None:
            self.ota = ota.Ota(self, ota.state())
        return self.ota.begin(cmd_id, v, size, sha)

    def client_name(self):
        # CONNECT's client: the running version, and the last update's state
        return "lockapp/" + VERSION + self.client_note

    def confirm_seq(self, last_seq):
        # First CONNECT_ACK with provisional numbers (fresh file system or damaged
        # seq files): move the queued events above what the broker already stored
        # for this lock, so none is taken for a retransmission and dropped.
        q = self.q
        base = 1 if last_seq == _NO_SEQ else last_seq + 1
        if base > CEILING:
            # (a number that would leave too few before the end: not taken, SeqNo)
            log.warn("seq floor_ignored broker_last=%d next=%d" % (last_seq, self.seq.next))
            base = self.seq.next
        if len(q) and q.seq_at(0) < base:
            log.warn("sys seq renumbered from=%d to=%d n=%d" % (q.seq_at(0), base, len(q)))
            q.renumber(base)
        self.seq.confirm(max(base, q.max_seq + 1))
        log.info("sys seq confirmed next_seq=%d" % self.seq.next)

    def session_ok(self):
        # The link kept a session up for a heartbeat interval (past whatever the broker
        # sends on connect: acks, a redelivered command): the fatal reboots before it
        # were not a loop, the next one counts from one again.
        n = self.fatal_count
        if n:
            self.fatal_count = 0
            atomic.remove("fatal.dat")
            log.info("sys fatal_count cleared n=%d" % n)

    def heartbeat(self):
        return heartbeat_body(self.clock.now_ms(), time.ticks_diff(time.ticks_ms(), self._started) // 1000,
                         len(self.q), self.q.dropped, self.lock.battery, gc.mem_free())

    def change_config(self, changes):
        from lockapp.cfgchange import apply_change
        self.cfg = apply_change(self.cfg, changes)
        self.lock.cfg = self.cfg

    # -- status ----------------------------------------------------------------------------
    def _sample_mem(self):
        # Live heap = what is allocated right after a collection; peak = its maximum.
        gc.collect()
        a = gc.mem_alloc()
        if a > self.peak:
            self.peak = a
        return a

    def log_mem(self):
        a = self._sample_mem()
        log.info("mem peak=%d alloc=%d free=%d" % (self.peak, a, gc.mem_free()))

    def log_status(self):
        log.info("sys status q=%d next_seq=%d dropped=%d link=%s"
                 % (len(self.q), self.seq.next, self.q.dropped, "up" if self.link.up else "down"))

    # -- lifecycle -------------------------------------------------------------------------
    def reboot(self, reason):
        try:
            log.info("sys reboot reason=" + reason)
        finally:                    # (even when the heap is too short for the line)
            if self.hw.name != "sim":
                time.sleep_ms(100)
                self.hw.reset()
            self.stop("reboot")

    def reset(self, reason):
        # A board reset: main.py runs again (an update is switched or reverted there).
        # The simulator ends the process with status 3, which the rig's virtual board
        # takes for a reset and boots again.
        try:
            log.info("sys reboot reason=" + reason)
        finally:
            if self.hw.name != "sim":
                time.sleep_ms(100)
                self.hw.reset()
            self.stop("reset")

    def stop(self, reason):
        self.stop_reason = reason
        self._stop.set()

    async def _watchdog(self):
        # Fed from the event loop: a blocked loop (hung call) stops the feeding and the
        # hardware watchdog resets the board. Also samples the heap.
        ms = self.cfg["wdt_ms"]
        self.hw.wdt_start(ms)
        while True:
            self.hw.wdt_feed()
            self._sample_mem()
            await asyncio.sleep_ms(min(1000, ms // 4))

    async def guard(self, where, coro):
        # Every task of the app runs under this: a task must not die quietly (the
        # lock would go on half alive: no link, or no inputs, or no watchdog feed).
        try:
            await coro
        except Exception as e:      # (cancelling, a BaseException, goes through)
            self.fatal(where, e)

    def fatal(self, where, e):
        # Out of memory (or a firmware bug) in a task or an input handler: said
        # loudly, then a reboot with a fresh heap -- never a retry loop that keeps
        # failing the same allocation. The queue and the sequence numbers are on
        # flash: an event reported queued is not lost.
        name = type(e).__name__
        e = None
        gc.collect()                # the failed task's garbage: room for the log line
        try:
            log.error("sys fatal where=%s err=%s free=%d" % (where, name, gc.mem_free()))
        finally:
            try:                    # counted before the reboot; a failed write must not stop it
                atomic.write("fatal.dat", str(min(self.fatal_count + 1, 99)).encode())
            except Exception:
                pass
            self.reboot("oom" if name == "MemoryError" else "fatal")

    async def main(self):
        tasks = [asyncio.create_task(self.guard("wdt", self._watchdog())),
                 asyncio.create_task(self.guard("inputs", self.lock.watch())),
                 asyncio.create_task(self.guard("link", self.link.run()))]
        self.hw.start(self._input, self.guard)
        log.info("sys ready")
        if self.ota is not None:
            self.ota.started()
        await self._stop.wait()
        for t in tasks:
            t.cancel()
        self.hw.stop()
        await asyncio.sleep_ms(0)
        return self.stop_reason

    def _input(self, cmd, args):
        try:
            self.lock.on_input(cmd, args)
        except MemoryError as e:     # (other input errors are the hardware layer's to log)
            self.fatal("input", e)


def run():
    while True:
        gc.collect()
        try:
            app = App()
        except config.ConfigError as e:
            log.error("sys config err=" + log.clean(e))
            raise
        reason = asyncio.run(app.main())
        asyncio.new_event_loop()
        app = None
        if reason == "reset":
            sys.exit(3)
        if reason != "reboot":
            sys.exit(0)
