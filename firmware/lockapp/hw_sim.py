# Simulated hardware for the unix port and the HIL rig: inputs are line commands on
# stdin (read without blocking the app), outputs are log lines. The command list is
# in firmware/README.md.
import sys
import asyncio
from lockapp import log


class SimHw:
    name = "sim"

    def __init__(self, cfg):
        self.cfg = cfg
        self.wifi = True
        self._task = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self, sink, guard):
        # sink(cmd, args) receives every input line as a word and its arguments;
        # guard(where, coro) is the app's task guard (App.guard).
        self._sink = sink
        self._task = asyncio.create_task(guard("inputs", self._read_stdin()))

    async def _read_stdin(self):
        try:
            s = asyncio.StreamReader(sys.stdin)
        except Exception:
            return
        while True:
            try:
                line = await s.readline()
            except UnicodeError:    # (the text stdin checks it) line noise: said, skipped
                log.warn("hw input err=undecodable line=?")
                continue
            if not line:
                return  # stdin closed: the board keeps running without inputs
            words = line.decode().strip().split()
            if not words:
                continue
            try:
                self._sink(words[0], words[1:])
            except Exception as e:
                log.warn("hw input err=%s line=%s" % (log.clean(e), log.clean(" ".join(words))))

    def unique_id(self):
        return b"\x00\x00sim"

    # -- outputs -------------------------------------------------------------------
    def relay(self, on):
        log.info("hw relay " + ("on" if on else "off"))

    def led(self, color):
        log.info("hw led " + color)

    def buzzer(self, ms):
        log.info("hw buzzer ms=%d" % ms)

    # -- watchdog ------------------------------------------------------------------
    def wdt_start(self, timeout_ms):
        log.info("hw wdt start timeout_ms=%d" % timeout_ms)

    def wdt_feed(self):
        pass

    def reset(self):
        pass  # the app soft-reboots in-process (see app.py)

    # -- network -------------------------------------------------------------------
    async def net_up(self):
        # True when the network (Wi-Fi) is usable; waits a little when it is not.
        if not self.wifi:
            await asyncio.sleep_ms(200)
        return self.wifi

    def net_ok(self):
        return self.wifi

    def stop(self):
        if self._task:
            self._task.cancel()
