# ESP32 hardware layer: relay, door/tamper inputs, LEDs, buzzer, battery ADC, a UART
# card reader (one hex card id per line, e.g. an RDM6300/Wiegand bridge), Wi-Fi,
# watchdog, reset, unique id. Pin numbers come from config "pins". Only this module
# touches machine/network; everything else runs on the unix port too.
import asyncio
import machine
from lockapp import log

try:
    import network
except ImportError:  # pragma: no cover - boards without Wi-Fi
    network = None


# Default pins; config "pins" overrides any of them.
PINS = {"relay": 4, "door": 5, "tamper": 18, "led_green": 2, "led_red": 15,
        "buzzer": 19, "battery_adc": 34, "reader_uart": 2, "reader_rx": 16}


class Esp32Hw:
    name = "esp32"

    def __init__(self, cfg):
        self.cfg = cfg
        p = dict(PINS)
        p.update(cfg.get("pins", {}))
        Pin = machine.Pin
        self._relay = Pin(p["relay"], Pin.OUT, value=0)
        self._door = Pin(p["door"], Pin.IN, Pin.PULL_UP)
        self._tamper = Pin(p["tamper"], Pin.IN, Pin.PULL_UP)
        self._green = Pin(p["led_green"], Pin.OUT, value=0)
        self._red = Pin(p["led_red"], Pin.OUT, value=0)
        self._buzzer = Pin(p["buzzer"], Pin.OUT, value=0)
        self._adc = None
        try:
            self._adc = machine.ADC(Pin(p["battery_adc"]))
            self._adc.atten(machine.ADC.ATTN_11DB)
        except Exception:
            pass
        self._uart = None
        try:
            self._uart = machine.UART(p["reader_uart"], 9600, rx=p["reader_rx"])
        except Exception:
            pass
        self._wdt = None
        self._wlan = None

    def start(self, sink, guard):
        # guard(where, coro): the app's task guard (App.guard): an input task that
        # dies (MemoryError) is said and rebooted, not left dead with the lock blind
        self._sink_raw = sink
        asyncio.create_task(guard("inputs", self._poll_inputs()))
        if self._uart is not None:
            asyncio.create_task(guard("inputs", self._read_cards()))

    def _sink(self, cmd, args):
        # An input whose handling fails must not stop the input task.
        try:
            self._sink_raw(cmd, args)
        except Exception as e:
            log.warn("hw input err=%s cmd=%s" % (log.clean(e), cmd))

    async def _poll_inputs(self):
        # Debounced polling (50 ms) of door and tamper contacts, battery each minute.
        door = self._door.value()
        tamper = self._tamper.value()
        n = 0
        while True:
            await asyncio.sleep_ms(50)
            d = self._door.value()
            if d != door:
                door = d
                self._sink("door", ["open" if d else "close"])
            t = self._tamper.value()
            if t != tamper:
                tamper = t
                if t:
                    self._sink("tamper", [])
            n += 1
            if n % 1200 == 1 and self._adc is not None:
                mv = self._adc.read_uv() // 1000
                # 2:1 divider on a 1S Li-ion cell: 3.3 V empty .. 4.2 V full
                pct = max(0, min(100, (2 * mv - 3300) * 100 // 900))
                self._sink("battery", [str(pct)])

    async def _read_cards(self):
        r = asyncio.StreamReader(self._uart)
        while True:
            line = await r.readline()
            try:
                card = line.strip().decode()
            except UnicodeError:    # reader noise: not a card, and not the reader's end
                log.warn("hw input err=undecodable cmd=card")
                continue
            if card:
                self._sink("card", [card])

    def unique_id(self):
        return machine.unique_id()

    def relay(self, on):
        self._relay.value(1 if on else 0)
        log.info("hw relay " + ("on" if on else "off"))

    def led(self, color):
        self._green.value(1 if color == "green" else 0)
        self._red.value(1 if color == "red" else 0)
        log.info("hw led " + color)

    def buzzer(self, ms):
        self._buzzer.value(1)
        asyncio.create_task(self._buzz_off(ms))
        log.info("hw buzzer ms=%d" % ms)

    async def _buzz_off(self, ms):
        await asyncio.sleep_ms(ms)
        self._buzzer.value(0)

    def wdt_start(self, timeout_ms):
        self._wdt = machine.WDT(timeout=timeout_ms)
        log.info("hw wdt start timeout_ms=%d" % timeout_ms)

    def wdt_feed(self):
        if self._wdt is not None:
            self._wdt.feed()

    def reset(self):
        machine.reset()

    async def net_up(self):
        # Bring Wi-Fi up (bounded wait); True when connected.
        if network is None:
            return True
        if self._wlan is None:
            self._wlan = network.WLAN(network.STA_IF)
            self._wlan.active(True)
        if self._wlan.isconnected():
            return True
        w = self.cfg["wifi"]
        try:
            self._wlan.connect(w["ssid"], w["password"])
        except OSError as e:
            log.warn("net wifi err=%s" % log.clean(e))
        for _ in range(100):
            if self._wlan.isconnected():
                log.info("net wifi up ip=%s" % self._wlan.ifconfig()[0])
                return True
            await asyncio.sleep_ms(100)
        log.warn("net wifi down ssid=%s" % log.clean(w["ssid"]))
        return False

    def net_ok(self):
        return network is None or (self._wlan is not None and self._wlan.isconnected())

    def stop(self):
        pass
