"""The ESP32 hardware layer cannot meet its hardware here. This runs it under
MicroPython against stand-in `machine` and `network` modules that record what the
code asks of them: it catches API misuse and typos in the one module the other
tests cannot reach, not the hardware's behaviour."""

from __future__ import annotations


FAKES = '''
# machine / network stand-ins (tests only)
class Pin:
    OUT = 1; IN = 0; PULL_UP = 2
    pins = {}
    def __init__(self, n, mode=0, pull=None, value=None):
        self.n = n; self.v = 0 if value is None else value; Pin.pins[n] = self
    def value(self, v=None):
        if v is None:
            return self.v
        self.v = v
class ADC:
    ATTN_11DB = 3
    def __init__(self, pin): pass
    def atten(self, a): pass
    def read_uv(self): return 1950000        # 3.9 V cell behind a 2:1 divider
class UART:
    # no card reader fitted (a Python object cannot stand in for a pollable stream)
    def __init__(self, n, baud, rx=None): raise OSError(19)
class WDT:
    fed = 0
    def __init__(self, timeout): WDT.timeout = timeout
    def feed(self): WDT.fed += 1
def unique_id(): return b"\\x24\\x0a\\xc4\\x01\\x02\\x03"
def reset(): raise SystemExit("reset")
'''

NETWORK = '''
STA_IF = 0
class WLAN:
    def __init__(self, i): self.on = False; self.conn = False
    def active(self, on): self.on = on
    def isconnected(self): return self.conn
    def connect(self, ssid, pw): self.conn = ssid == "good"
    def ifconfig(self): return ("10.0.0.7", "255.255.255.0", "10.0.0.1", "10.0.0.1")
'''


def test_esp32_layer_drives_pins_wifi_and_watchdog(run_app, tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "machine.py").write_text(FAKES)
    (fake / "network.py").write_text(NETWORK)
    out = run_app("""
import sys
sys.path.insert(0, "fake")
import asyncio, machine
from lockapp import hw
got = []
cfg = {"hw": "auto", "wifi": {"ssid": "good", "password": "x"}, "pins": {"relay": 21}}
h = hw.make(cfg)
print(h.name, h.unique_id() == machine.unique_id())
h.relay(True); h.led("green"); h.wdt_start(8000); h.wdt_feed()
print(machine.Pin.pins[21].v, machine.Pin.pins[2].v, machine.Pin.pins[15].v, machine.WDT.timeout, machine.WDT.fed)
async def guard(where, coro):
    await coro
async def main():
    h.start(lambda cmd, args: got.append((cmd, args)), guard)
    print(await h.net_up(), h.net_ok())
    await asyncio.sleep_ms(120)
    machine.Pin.pins[5].v = 1        # door contact opens
    machine.Pin.pins[18].v = 1       # tamper switch
    await asyncio.sleep_ms(200)
    h.buzzer(50)
    await asyncio.sleep_ms(100)
    print(machine.Pin.pins[19].v)
    h.cfg["wifi"]["ssid"] = "bad"
    h._wlan.conn = False
    print(h.net_ok())
asyncio.run(main())
print(got)
""", tmp_path)
    lines = out.splitlines()
    assert "esp32 True" in lines
    assert "1 1 0 8000 1" in lines
    assert "True True" in lines
    assert lines[-1] == "[('battery', ['66']), ('door', ['open']), ('tamper', [])]"  # 3.9 V: 66 %
    assert "I hw relay on" in lines and "I hw wdt start timeout_ms=8000" in lines
    assert "I net wifi up ip=10.0.0.7" in lines and "I hw buzzer ms=50" in lines
    assert lines[lines.index("I hw buzzer ms=50") + 1] == "0"   # buzzer off again after 50 ms
    assert lines[-2] == "False"                                  # Wi-Fi lost is seen


def test_an_input_task_that_dies_goes_to_the_apps_guard(run_app, tmp_path):
    """Out of memory in the polling task itself (not in an input's handling): the
    app's guard hears of it (and reboots the board), the lock is not left blind."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "machine.py").write_text(FAKES.replace(
        "def read_uv(self): return 1950000", "def read_uv(self): raise MemoryError()"))
    (fake / "network.py").write_text(NETWORK)
    out = run_app("""
import sys
sys.path.insert(0, "fake")
import asyncio
from lockapp import hw
async def guard(where, coro):
    try:
        await coro
    except Exception as e:
        print("guard", where, type(e).__name__)
async def main():
    hw.make({"hw": "auto", "wifi": {"ssid": "good", "password": "x"}}).start(
        lambda cmd, args: None, guard)
    await asyncio.sleep_ms(200)
asyncio.run(main())
""", tmp_path)
    assert "guard inputs MemoryError" in out.splitlines(), out
