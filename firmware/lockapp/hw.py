# Picks the hardware layer: ESP32 (machine.Pin exists and hw != "sim") or simulated.


def make(cfg):
    want = cfg.get("hw", "auto")
    if want != "sim":
        try:
            import machine
            has_pin = hasattr(machine, "Pin")
        except ImportError:
            has_pin = False
        if has_pin:
            from lockapp.hw_esp32 import Esp32Hw
            return Esp32Hw(cfg)
        if want == "esp32":
            raise RuntimeError("hw=esp32 but machine.Pin is missing")
    from lockapp.hw_sim import SimHw
    return SimHw(cfg)
