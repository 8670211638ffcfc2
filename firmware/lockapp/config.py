# config.json: the device's settings. Missing keys take defaults(); unknown keys are
# kept. A downlink config change rewrites the file atomically.
import json
from binascii import unhexlify
from lockapp import atomic

# Pin numbers (config "pins", ESP32 only) have their defaults in hw_esp32.PINS.

PATH = "config.json"

def defaults():
    # Built when needed (boot, a config change), not kept as a module global: the
    # merged config holds the values, the table itself would cost ~0.4 KB of heap.
    return {
        "sn": "",
        "key": "",
        "brokers": [["127.0.0.1", 6800]],
        "wifi": {"ssid": "", "password": ""},
        "heartbeat_s": 30,
        "topic": "lock.events",
        "tls": {"enabled": False, "ca": "ca.der", "server_hostname": ""},
        "frame_mac": True,      # on plain TCP, ask for a MAC on every frame (TLS: not needed)
        "broker_id": "",        # the broker's [security] broker_id: no proof to any other
        "hw": "auto",
        "unlock_s": 5,
        "door_open_alarm_s": 60,
        "battery_low_pct": 20,
        "queue_max": 256,
        "seq_block": 64,
        "backoff_min_ms": 500,
        "backoff_max_ms": 60000,
        "io_timeout_ms": 10000,
        "window": 1,
        "wdt_ms": 30000,
        "ota_trial_s": 300,     # an updated app must hold a session within this, or rolls back
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
    out = defaults()
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
    for k in ("heartbeat_s", "unlock_s", "door_open_alarm_s", "battery_low_pct",
              "backoff_min_ms", "backoff_max_ms", "io_timeout_ms"):
        if not isinstance(cfg[k], int) or cfg[k] < 1:
            raise ConfigError("config: %s must be a positive integer" % k)
    if cfg["backoff_min_ms"] > cfg["backoff_max_ms"]:
        raise ConfigError("config: backoff_min_ms above backoff_max_ms")
    return cfg


def key_bytes(cfg):
    return unhexlify(cfg["key"])
