"""A small CA for one gateway: the CA, a server certificate, the CA as DER for locks.

``lockmq certs init DIR --host gw.local --ip 192.168.1.10`` writes::

    ca.pem ca.der ca.key      the CA (ca.key 0600: keep it offline after use)
    server.pem server.key     the broker's certificate (SANs: hosts, IPs) and key

``lockmq certs renew DIR`` signs a new server certificate and key with the same CA
(the locks trust the CA, not the server certificate, so none is reflashed).

ECDSA P-256 keys, SHA-256 signatures.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    """Paths written by :func:`init_ca_and_server`."""

    ca_pem: str
    ca_der: str
    ca_key: str
    server_pem: str
    server_key: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lockmq"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: str, data: bytes, mode: int = 0o644, keep: bool = False) -> None:
    """Write ``path`` whole or not at all: a temporary file, fsync, rename (a broker
    restarted meanwhile never reads half a key).

    ``keep``: a file replaced keeps its owner, group and mode (a key an operator made
    ``root:lockmq 0640`` for the broker's user stays readable by it); ``mode`` is for
    a new file."""
    old = os.stat(path) if keep and os.path.exists(path) else None
    tmp = f"{path}.tmp"
    # created owner-only: the key is never readable by others, not even for a moment
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    if old is not None:
        if (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
            os.chown(tmp, old.st_uid, old.st_gid)   # root renewing the service's files
        mode = stat.S_IMODE(old.st_mode)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def make_ca(common_name: str = "lockmq gateway CA", days: int = 3650
            ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def make_server_cert(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                     hosts: list[str], ips: list[str], days: int = 825
                     ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server certificate for ``hosts`` (DNS names) and ``ips``, signed by the CA."""
    if not hosts and not ips:
        raise ValueError("a server certificate needs at least one host name or IP")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    sans: list[x509.GeneralName] = [x509.DNSName(h) for h in hosts]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (x509.CertificateBuilder()
            .subject_name(_name(hosts[0] if hosts else ips[0]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def init_ca_and_server(out_dir: str, hosts: list[str], ips: list[str],
                       ca_name: str = "lockmq gateway CA", force: bool = False) -> CertFiles:
    """Create a CA and a server certificate in ``out_dir``; refuse to overwrite unless forced."""
    os.makedirs(out_dir, exist_ok=True)
    files = CertFiles(*(os.path.join(out_dir, n) for n in
                        ("ca.pem", "ca.der", "ca.key", "server.pem", "server.key")))
    if not force:
        for path in files.__dict__.values():
            if os.path.exists(path):
                raise FileExistsError(f"{path} exists (use --force to replace)")
    ca_cert, ca_key = make_ca(ca_name)
    cert, key = make_server_cert(ca_cert, ca_key, hosts, ips)
    _write(files.ca_pem, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(files.ca_der, ca_cert.public_bytes(serialization.Encoding.DER))
    _write(files.ca_key, _key_pem(ca_key), 0o600)
    _write(files.server_pem, cert.public_bytes(serialization.Encoding.PEM))
    _write(files.server_key, _key_pem(key), 0o600)
    return files


def pem_to_der(pem_path: str, der_path: str) -> None:
    """Export a PEM certificate as DER (what MicroPython's ssl takes as ``cadata``)."""
    with open(pem_path, "rb") as fh:
        cert = x509.load_pem_x509_certificate(fh.read())
    _write(der_path, cert.public_bytes(serialization.Encoding.DER))


def server_names(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    """The DNS names and IP addresses a server certificate is valid for."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    return (list(sans.get_values_for_type(x509.DNSName)),
            [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)])


def renew_server(out_dir: str, hosts: list[str] | None = None, ips: list[str] | None = None,
                 days: int = 825) -> tuple[CertFiles, x509.Certificate]:
    """Sign a new server certificate and key in ``out_dir`` with its existing CA.

    The CA (``ca.pem``, ``ca.der``, ``ca.key``) is not touched, so every lock that
    trusts it accepts the new certificate. The names are the old certificate's
    unless ``hosts``/``ips`` are given. Returns the files and the new certificate.
    Raises ``FileNotFoundError`` naming a missing CA file, ``ValueError`` if the CA
    key does not match the CA certificate.
    """
    files = CertFiles(*(os.path.join(out_dir, n) for n in
                        ("ca.pem", "ca.der", "ca.key", "server.pem", "server.key")))
    for path in (files.ca_pem, files.ca_key):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} is missing: renew needs the CA that the "
                                    "locks trust (lockmq certs init made it)")
    with open(files.ca_pem, "rb") as fh:
        ca_cert = x509.load_pem_x509_certificate(fh.read())
    with open(files.ca_key, "rb") as fh:
        ca_key = serialization.load_pem_private_key(fh.read(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or \
            ca_key.public_key().public_numbers() != ca_cert.public_key().public_numbers():
        raise ValueError(f"{files.ca_key} is not the key of {files.ca_pem}")
    if not hosts and not ips:
        if not os.path.exists(files.server_pem):
            raise FileNotFoundError(f"{files.server_pem} is missing: give --host/--ip")
        with open(files.server_pem, "rb") as fh:
            hosts, ips = server_names(x509.load_pem_x509_certificate(fh.read()))
    cert, key = make_server_cert(ca_cert, ca_key, list(hosts or []), list(ips or []), days)
    _write(files.server_key, _key_pem(key), 0o600, keep=True)
    _write(files.server_pem, cert.public_bytes(serialization.Encoding.PEM), keep=True)
    return files, cert
