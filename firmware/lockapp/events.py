# The lock's own logic: turns inputs (card, door, tamper, battery, injected events)
# into actions (relay, LEDs) and events for the offline queue.
import asyncio
from micropython import const
from lockapp import log, cards

# -- protocol numbers: generated from protocol/table.py (python scripts/gen_protocol.py) --
_EV_DOOR_LEFT_OPEN = const(3)
_EV_FAILED_ATTEMPT = const(2)
_EV_LOW_BATTERY = const(5)
_EV_TAMPER = const(4)
_EV_UNLOCK = const(1)
# -- end of generated protocol numbers --

# The events this lock emits, by their one name (protocol/table.py: the name the
# client, the CLI and Spark use too; tests/protocol/test_table.py holds them to it).
TYPES = {"unlock": _EV_UNLOCK, "failed_attempt": _EV_FAILED_ATTEMPT,
         "door_left_open": _EV_DOOR_LEFT_OPEN, "tamper": _EV_TAMPER,
         "low_battery": _EV_LOW_BATTERY}


class Lock:
    def __init__(self, app):
        self.app = app
        self.cfg = app.cfg
        self.hw = app.hw
        self.door_open = False
        self._door_since = 0
        self._door_alarmed = False
        self.battery = 255        # unknown until the first reading (HEARTBEAT: 255)
        self._unlock_until = 0
        self._relay_task = None

    # -- inputs ----------------------------------------------------------------------
    def on_input(self, cmd, args):
        app = self.app
        if cmd == "card":
            self.card(args[0].upper())
        elif cmd == "badcard":
            self._deny(args[0].upper())
        elif cmd == "door":
            self.door(args[0] == "open")
        elif cmd == "tamper":
            self.hw.buzzer(500)
            app.emit("tamper")
        elif cmd == "battery":
            self.battery_level(int(args[0]))
        elif cmd == "event":
            n = int(args[1]) if len(args) > 1 else 1
            if args[0] not in TYPES:
                raise ValueError("unknown event type")
            if n == 1:
                app.emit(args[0])
            else:
                asyncio.create_task(app.guard("input", self._burst(args[0], n)))
        elif cmd == "wifi":
            self.hw.wifi = args[0] == "up"
            log.info("hw wifi " + ("up" if self.hw.wifi else "down"))
        elif cmd == "mem":
            app.log_mem()
        elif cmd == "status":
            app.log_status()
        elif cmd == "reboot":
            app.reboot("stdin")
        elif cmd == "quit":
            app.stop("quit")
        else:
            raise ValueError("unknown command")

    async def _burst(self, name, n):
        # n injected events, one after the other. While the link is up the burst waits
        # for room (the rig injects far faster than doors open); with the link down
        # the queue fills and overflows exactly as with real events.
        app = self.app
        q = app.q
        for _ in range(n):
            while app.link.up and len(q) >= q.max_len * 3 // 4:
                await asyncio.sleep_ms(5)
            app.emit(name)
            await asyncio.sleep_ms(0)

    def card(self, card):
        cred = _cred(card)
        if cards.contains(cred):
            self.unlock(self.cfg["unlock_s"])
            self.app.emit("unlock", cred)
        else:
            self._deny(card)

    def _deny(self, card):
        self.hw.led("red")
        self.hw.buzzer(200)
        self.app.emit("failed_attempt", _cred(card))

    def door(self, is_open):
        if is_open == self.door_open:
            return
        self.door_open = is_open
        self._door_since = self.app.clock.now_ms()
        self._door_alarmed = False

    def battery_level(self, pct):
        low = self.cfg["battery_low_pct"]
        if pct < low <= self.battery:
            self.app.emit("low_battery", value=pct)
        self.battery = pct

    # -- actions ---------------------------------------------------------------------
    def unlock(self, seconds):
        # Relay on for `seconds`; a new unlock extends the open time.
        self._unlock_until = self.app.clock.now_ms() + seconds * 1000
        if self._relay_task is None:
            self.hw.relay(True)
            self.hw.led("green")
            self._relay_task = asyncio.create_task(self._relay_off())

    async def _relay_off(self):
        try:
            while True:
                left = self._unlock_until - self.app.clock.now_ms()
                if left <= 0:
                    break
                await asyncio.sleep_ms(min(left, 1000))
        finally:
            self.hw.relay(False)
            self.hw.led("off")
            self._relay_task = None

    async def watch(self):
        # Door-left-open alarm, checked once a second.
        while True:
            await asyncio.sleep_ms(1000)
            if self.door_open and not self._door_alarmed:
                if self.app.clock.now_ms() - self._door_since >= self.cfg["door_open_alarm_s"] * 1000:
                    self._door_alarmed = True
                    self.hw.buzzer(1000)
                    self.app.emit("door_left_open", value=self.cfg["door_open_alarm_s"])


def _cred(card):
    # Credential id as bytes: the reader's hex id (text when it is not hex).
    try:
        b = bytes.fromhex(card) if len(card) % 2 == 0 else card.encode()
    except ValueError:
        b = card.encode()
    return b[:32]
