"""What the broker opens at start, tried before it starts: ports and paths.

:func:`lockmq.config.validate_config` calls these (``lockmq broker
--check-config`` and the broker's own start), so a file that passes the check does
not fail a moment later on a port two listeners share, a log directory that is not
there or a data directory the broker cannot write. Run as the service's user
(``--check-config --as-user lockmq``), the path checks are what that user can do.
Each raises :class:`~lockmq.config.ConfigError` naming the setting.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from lockmq.config_base import ANY_FREE_PORT, ConfigError


def check_ports(cfg: Any) -> None:
    """No two listeners on one fixed port (the main one, the status page, TLS)."""
    b = cfg.broker
    ports = [("broker.port", b.port)]
    if b.status_port not in (0, ANY_FREE_PORT):
        ports.append(("broker.status_port", b.status_port))
    if cfg.security.get("tls_cert"):
        tls_port = cfg.security.get("tls_port", 6843)
        if tls_port not in (0, ANY_FREE_PORT):
            ports.append(("security.tls_port", tls_port))
    seen: dict[int, str] = {}
    for name, port in ports:
        if port and port in seen:
            table, key = name.split(".")
            raise ConfigError(f"{name} = {port} is also {seen[port]}: two listeners cannot "
                              f"share a port; give {name} another one", table=table, key=key)
        seen[port] = name


def check_paths(cfg: Any) -> None:
    """The data directory can be created and written, the log file opened for
    appending, and an existing master key and registry read (by whoever runs this)."""
    _check_data_dir(cfg.broker.data_dir)
    if cfg.broker.log_file:
        _check_log_file(cfg.broker.log_file)
    sec = cfg.security_config()
    key_setting = "security.master_key_file" if sec.master_key_file else \
        "broker.data_dir (its master.key)"
    for setting, path, mode, what in (
            (key_setting, sec.master_key_path, os.R_OK, "readable"),
            ("broker.data_dir (its security.db)", sec.registry_path, os.R_OK | os.W_OK,
             "readable and writable")):
        if os.path.exists(path) and not os.access(path, mode):
            raise ConfigError(f"{setting}: {path} is not {what} by {_whoami()}",
                              table="broker", key="data_dir")


def _whoami() -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(os.getuid()).pw_name}"
    except (ImportError, KeyError):
        return f"uid {os.getuid()}"


def _check_data_dir(path: str) -> None:
    """Create ``path`` as the store would (removing what only the check made) and
    write a file in it."""
    made: list[str] = []
    try:
        head = os.path.abspath(path)
        missing = []
        while not os.path.exists(head):
            missing.append(head)
            head = os.path.dirname(head)
        for d in reversed(missing):
            os.mkdir(d, 0o700)
            made.append(d)
        if not os.path.isdir(path):
            raise OSError(errno.ENOTDIR, "not a directory")
        probe = os.path.join(path, f".lockmq-check-{os.getpid()}")
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f'broker.data_dir = "{path}" cannot be used by {_whoami()}: '
                          f"{exc.strerror or exc}", table="broker", key="data_dir") from None
    finally:
        for d in reversed(made):
            try:
                os.rmdir(d)
            except OSError:
                pass


def _check_log_file(path: str) -> None:
    """``log_file`` can be opened for appending (its directory must exist: the
    broker does not create it)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f'broker.log_file = "{path}": directory {folder} does not exist '
                          f"(create it, or leave log_file empty for stderr/journald)",
                          table="broker", key="log_file")
    existed = os.path.exists(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.close(fd)
    except OSError as exc:
        raise ConfigError(f'broker.log_file = "{path}" cannot be opened by {_whoami()}: '
                          f"{exc.strerror or exc}", table="broker", key="log_file") from None
    if not existed:
        os.unlink(path)
