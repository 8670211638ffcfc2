"""What every table of the configuration shares: the error that names a setting, the
checks each table's keys get, and the values they are written with.

Below ``lockmq.config`` (which re-exports these names) and below each table that
lives with its package -- ``lockmq.security.config``, ``lockmq.replication.settings``
-- and the start-up checks (``lockmq.preflight``), so that the aggregate imports
them and none of them imports the aggregate: no circle.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: RocketMQ's delay levels, in seconds: 1s 5s 10s 30s 1m 2m 3m ... 10m 20m 30m 1h 2h.
#: The one copy: the default of ``[consumers] retry_levels_s`` (a nack's backoff) and
#: the client's delay-level shorthand (``lockmq.client.scheduled``, level n = entry n-1).
ROCKETMQ_LEVELS_S: tuple[float, ...] = (
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)

#: ``status_port`` / ``[security] tls_port`` value for "any free port": the broker binds
#: port 0 and logs the port it got in ``broker_started`` (tests run many brokers at
#: once). 0 keeps its old meaning there (no status page; TLS on the main port).
ANY_FREE_PORT = -1

#: The only values of ``[broker] auth`` (one switch; see BrokerSection.auth).
AUTH_MODES: tuple[str, ...] = ("required", "off")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the file (when there is one),
    the ``[table]`` and the key, so that a typo never silently falls back."""

    def __init__(self, message: str, *, table: str = "", key: str = "",
                 file: str = "") -> None:
        super().__init__(f"{file}: {message}" if file else message)
        self.table, self.key, self.file = table, key, file

    def in_file(self, file: str) -> "ConfigError":
        """The same error, its message prefixed with ``file`` (once)."""
        if self.file:
            return self
        return ConfigError(str(self), table=self.table, key=self.key, file=file)


def check_auth_mode(value: Any) -> None:
    """``[broker] auth`` must be spelt exactly ``"required"`` or ``"off"``: a boolean, an
    upper-case or a made-up value is refused rather than guessed at (auth silently off
    on a door-lock broker is the worst default there is)."""
    if not isinstance(value, str) or value not in AUTH_MODES:
        raise ConfigError(f"[broker] auth = {_toml_value_safe(value)} is not valid: write "
                          f'auth = "required" (every peer authenticates) or auth = "off" '
                          f"(tests and development only) (broker.auth)",
                          table="broker", key="auth")


def _toml_value_safe(v: Any) -> str:
    try:
        return _toml_value(v)
    except TypeError:
        return repr(v)


def _apply(section: Any, table: dict[str, Any], prefix: str) -> None:
    known = {f.name: f for f in dataclasses.fields(section)}
    for key, value in table.items():
        if key not in known:
            raise ValueError(f"unknown setting {prefix}.{key}")
        if prefix == "broker" and key == "auth":
            check_auth_mode(value)   # before the type check: its message says what to write
        default = getattr(section, key)
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"{prefix}.{key} must be true or false")
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) \
                and value.is_integer():
            value = int(value)
        if default is not None and not isinstance(value, type(default)):
            raise ValueError(f"{prefix}.{key} must be of type {type(default).__name__}, "
                             f"not {type(value).__name__}")
        if isinstance(default, list) and default:
            value = _list_of(type(default[0]), value, f"{prefix}.{key}")
        setattr(section, key, value)


def _list_of(kind: type, values: list[Any], name: str) -> list[Any]:
    """``values`` if every item is of the default items' kind (numbers: int or float)."""
    kinds: tuple[type, ...] = (int, float) if kind in (int, float) else (kind,)
    for item in values:
        if not isinstance(item, kinds) or isinstance(item, bool):
            raise ValueError(f"{name} must be a list of "
                             f"{'numbers' if float in kinds else kind.__name__}, "
                             f"not contain {_toml_value_safe(item)}")
    return values


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(type(v))
