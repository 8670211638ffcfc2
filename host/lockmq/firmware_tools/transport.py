"""Which transport a lock built here uses: TLS whenever its broker can serve it.

The broker's TOML (``lockmq firmware build --broker-config``) says whether it serves
TLS (``[security] tls_cert``) and on which ports. The CA the locks verify it with
lies beside the server certificate, as ``lockmq certs init DIR`` writes it
(``ca.der``, or ``ca.pem``). A plain-TCP lock for such a broker is an explicit,
warned choice (``--plaintext``); see docs/firmware.md, "Transport".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lockmq.config import load_config
from lockmq.security.tls import describe_listeners

from .build import BuildError

#: What ``lockmq certs init`` writes beside ``server.pem``, in the order tried.
CA_NAMES = ("ca.der", "ca.pem")

PLAINTEXT_WARNING = ("warning: --plaintext: this lock's events, card ids and commands cross "
                     "the network readable by anyone on the path; use TLS wherever the lock can "
                     "(docs/security.md, 'The plain-TCP port')")


@dataclass(frozen=True)
class BrokerTransport:
    """What one broker configuration offers locks."""

    config: str
    ca_file: Path | None       # the CA beside tls_cert; None: the broker has no TLS
    tls_ports: frozenset[int]
    plain_ports: frozenset[int]

    @property
    def has_tls(self) -> bool:
        return self.ca_file is not None


def broker_transport(config_file: str | os.PathLike[str]) -> BrokerTransport:
    """Read the broker's TOML: its listeners and, with TLS, the CA for the locks.

    Relative certificate paths are read as the broker reads them (from the current
    folder). Raises :class:`BuildError` naming what is missing.
    """
    try:
        cfg = load_config(config_file)
        security = cfg.security_config()
    except OSError as e:
        raise BuildError(f"cannot read the broker config {config_file}: {e.strerror}") from None
    except ValueError as e:
        raise BuildError(f"broker config: {e}") from None
    listeners = describe_listeners(security, cfg.broker.port)
    tls_ports = frozenset(x["port"] for x in listeners if x["tls"])
    plain_ports = frozenset(x["port"] for x in listeners if not x["tls"])
    if not security.tls_cert:
        return BrokerTransport(str(config_file), None, tls_ports, plain_ports)
    certs_dir = Path(security.tls_cert).parent
    for name in CA_NAMES:
        if (certs_dir / name).is_file():
            return BrokerTransport(str(config_file), certs_dir / name, tls_ports, plain_ports)
    raise BuildError(f"{config_file} serves TLS ([security] tls_cert = {security.tls_cert}) but "
                     f"no CA for the locks is beside it ({' or '.join(CA_NAMES)} in {certs_dir}); "
                     f"give it with --tls-ca FILE")


def check_ports(transport: BrokerTransport, brokers: list[tuple[str, int]], tls: bool) -> None:
    """Refuse a broker address whose port serves the other transport (a TLS lock that
    dials the plain port never connects, and the reverse)."""
    wrong = transport.plain_ports - transport.tls_ports if tls else transport.tls_ports - transport.plain_ports
    right = transport.tls_ports if tls else transport.plain_ports
    for host, port in brokers:
        if port in wrong:
            kind, other = ("TLS", "plain-TCP") if tls else ("plain-TCP", "TLS")
            serves = ", ".join(str(p) for p in sorted(right)) or "none"
            raise BuildError(f"broker {host}:{port} is the {other} port of {transport.config}; "
                             f"a {kind} lock dials its {kind} port ({serves})")
