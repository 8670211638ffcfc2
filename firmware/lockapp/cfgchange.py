# A downlink "config change": validated, merged and written atomically. Loaded only
# when such a command arrives.
import json
from lockapp import atomic
from lockapp.config import ConfigError, merged, check, PATH

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


# Keys that change where the lock connects. Changing one needs "network": true in the
# command itself (MAC'd by the broker, which grants that only to the config.network
# right): defence in depth, so a plain config change can never repoint the lock.
NETWORK = ("brokers", "tls")
_TLS_KEYS = {"enabled": bool, "ca": str, "server_hostname": str}


def apply_change(cfg, changes, path=PATH):
    # Validate and persist a downlink change; returns the new config. Only SETTABLE
    # keys, and NETWORK keys when marked "network": true, may change; anything else
    # is refused as a whole.
    new = merged(cfg)
    net = changes.get("network") is True
    for k in changes:
        if k == "network":
            continue
        if k in NETWORK:
            if not net:
                raise ConfigError("config: %s is a network change, refused without network=true" % k)
            v = changes[k]
            if k == "tls":
                if not isinstance(v, dict):
                    raise ConfigError("config: tls must be an object")
                t = dict(new["tls"])
                for tk in v:
                    if tk not in _TLS_KEYS or not isinstance(v[tk], _TLS_KEYS[tk]):
                        raise ConfigError("config: bad tls setting %s" % tk)
                    t[tk] = v[tk]
                v = t
            new[k] = v
        elif k in SETTABLE:
            v = changes[k]
            if not isinstance(v, int):
                raise ConfigError("config: %s must be an integer" % k)
            new[k] = v
        else:
            raise ConfigError("config: %s cannot be changed remotely" % k)
    for k in SETTABLE:
        lo, hi = SETTABLE[k]
        if not (lo <= new[k] <= hi):
            raise ConfigError("config: %s out of range %d..%d" % (k, lo, hi))
    check(new)
    atomic.write(path, json.dumps(new).encode())
    return new
