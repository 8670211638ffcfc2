# Wall-clock milliseconds for event timestamps. Starts from the board's RTC
# (time.time(); the ESP32 epoch is 2000-01-01) and is corrected from the broker's
# server time at connect. Uses ticks_ms with re-anchoring, so the 2**30 ms wrap of
# the ESP32 ticks counter never matters.
import time

_EPOCH_2000 = 946684800


def _rtc_ms():
    t = time.time()
    if t < 1000000000:  # ESP32 RTC: seconds since 2000
        t += _EPOCH_2000
    return int(t) * 1000


class Clock:
    def __init__(self):
        self.synced = False
        self._ref_ms = _rtc_ms()
        self._ref_ticks = time.ticks_ms()

    def now_ms(self):
        t = time.ticks_ms()
        now = self._ref_ms + time.ticks_diff(t, self._ref_ticks)
        self._ref_ms = now
        self._ref_ticks = t
        return now

    def sync(self, server_ms):
        self._ref_ms = server_ms
        self._ref_ticks = time.ticks_ms()
        self.synced = True
