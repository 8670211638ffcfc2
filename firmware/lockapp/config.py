# config.json: the device's settings. Missing keys take DEFAULTS; unknown keys are
# kept. A downlink config change rewrites the file atomically.
import json
from binascii import unhexlify
from lockapp import atomic

PATH = "config.json"

DEFAULTS = {
    "sn": "",
    "key": "",
    "brokers": [["127.0.0.1", 6800]],
    "wifi": {"ssid": "", "password": ""},
    "heartbeat_s": 30,
    "topic": "lock.events",
    "tls": {"enabled": False, "ca": "ca.der", "server_hostname": ""},
    "hw": "auto",
    "unlock_s": 5,
    "door_open_alarm_s": 60,
    "battery_low_pct": 20,
    "queue_max": 256,
    "seq_block": 64,
    "backoff_min_ms": 500,
    "backoff_max_ms": 60000,
    "io_timeout_ms": 10000,
    "window": 8,
    "wdt_ms": 30000,
    "pins": {"relay": 4, "door": 5, "tamper": 18, "led_green": 2, "led_red": 15,
             "buzzer": 19, "battery_adc": 34, "reader_uart": 2, "reader_rx": 16},
}

# Keys a downlink "config change" may set, with their type and allowed range.
SETTABLE = {
    "heartbeat_s": (5, 3600),
    "unlock_s": (1, 600),
    "door_open_alarm_s": (5, 86400),
    "battery_low_pct": (1, 99),
    "backoff_min_ms": (10, 60000),
    "backoff_max_ms": (100, 3600000),
    "io_timeout_ms": (1000, 120000),
}


class ConfigError(ValueError):
    pass


def load(path=PATH):
    raw = atomic.read(path)
    if raw is None:
        raise ConfigError("no " + path)
    try:
        cfg = json.loads(raw)
    except ValueError:
        raise ConfigError(path + " is not valid JSON")
    return check(merged(cfg))


def merged(cfg):
    out = {}
    for k in DEFAULTS:
        out[k] = DEFAULTS[k]
    for k in cfg:
        out[k] = cfg[k]
    return out


def check(cfg):
    if not cfg["sn"] or len(cfg["sn"]) > 64:
        raise ConfigError("config: sn must be 1..64 characters")
    try:
        key = unhexlify(cfg["key"])
    except Exception:
        raise ConfigError("config: key must be hex")
    if len(key) < 16:
        raise ConfigError("config: key must be at least 16 bytes")
    if not cfg["brokers"]:
        raise ConfigError("config: brokers is empty")
    for b in cfg["brokers"]:
        if len(b) != 2 or not (0 < int(b[1]) < 65536):
            raise ConfigError("config: broker entries are [host, port]")
    for k in SETTABLE:
        lo, hi = SETTABLE[k]
        if not (lo <= cfg[k] <= hi):
            raise ConfigError("config: %s out of range %d..%d" % (k, lo, hi))
    if cfg["backoff_min_ms"] > cfg["backoff_max_ms"]:
        raise ConfigError("config: backoff_min_ms above backoff_max_ms")
    return cfg


def key_bytes(cfg):
    return unhexlify(cfg["key"])


def apply_change(cfg, changes, path=PATH):
    # Validate and persist a downlink change; returns the new config. Only SETTABLE
    # keys and "brokers" may change; anything else is refused as a whole.
    new = merged(cfg)
    for k in changes:
        if k == "brokers":
            new[k] = changes[k]
        elif k in SETTABLE:
            v = changes[k]
            if not isinstance(v, int):
                raise ConfigError("config: %s must be an integer" % k)
            new[k] = v
        else:
            raise ConfigError("config: %s cannot be changed remotely" % k)
    check(new)
    atomic.write(path, json.dumps(new).encode())
    return new
