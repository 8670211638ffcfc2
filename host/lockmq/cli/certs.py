"""``lockmq certs``: a CA and a server certificate for one gateway's TLS port.

    lockmq certs init ./tls --host gateway.local --ip 192.168.1.10

writes ca.pem, ca.der (for the locks: MicroPython's ssl takes the CA as DER),
ca.key (0600; keep it offline), server.pem and server.key (0600). Before the server
certificate expires (825 days), or to add a name:

    lockmq certs renew ./tls [--host gateway.local --ip 192.168.1.10]

writes a new server.pem and server.key signed by the same CA (the locks trust the
CA, so none is reflashed); `systemctl reload lockmq` (SIGHUP) serves it. Then set in the broker
config::

    [security]
    tls_cert = "./tls/server.pem"
    tls_key = "./tls/server.key"
    tls_port = 6843          # 0 = TLS on the main port, no plain port
"""

from __future__ import annotations

import argparse
import sys

from lockmq.client.cliargs import add_group


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``lockmq certs``."""
    csub = add_group(sub, "certs", "TLS: create a gateway CA and server certificate", __doc__,
                     "certs_cmd")
    i = csub.add_parser("init", help="create ca.* and server.* in DIR")
    i.add_argument("dir")
    i.add_argument("--host", action="append", default=[], help="DNS name of the broker")
    i.add_argument("--ip", action="append", default=[], help="IP address of the broker")
    i.add_argument("--ca-name", default="lockmq gateway CA")
    i.add_argument("--force", action="store_true", help="replace existing files")
    i.set_defaults(func=cmd_init)
    r = csub.add_parser("renew", help="new server certificate and key in DIR, same CA")
    r.add_argument("dir", help="the directory of ca.pem and ca.key (certs init's DIR)")
    r.add_argument("--host", action="append", default=[],
                   help="DNS name of the broker (default: the old certificate's names)")
    r.add_argument("--ip", action="append", default=[], help="IP address of the broker")
    r.add_argument("--days", type=int, default=825, help="validity (default %(default)s)")
    r.set_defaults(func=cmd_renew)
    d = csub.add_parser("der", help="export a PEM certificate as DER (for a lock)")
    d.add_argument("pem")
    d.add_argument("der")
    d.set_defaults(func=cmd_der)


def cmd_init(args: argparse.Namespace) -> int:
    """Create the CA and the server certificate."""
    from lockmq.security.certs import init_ca_and_server

    hosts = args.host or ([] if args.ip else ["localhost"])
    ips = args.ip or ([] if args.host else ["127.0.0.1"])
    try:
        files = init_ca_and_server(args.dir, hosts, ips, args.ca_name, force=args.force)
    except (FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for label, path in files.__dict__.items():
        print(f"{label:<11} {path}")
    print(f"server certificate names: {', '.join(hosts + ips)}")
    return 0


def cmd_renew(args: argparse.Namespace) -> int:
    """Sign a new server certificate with the existing CA."""
    from lockmq.security.certs import renew_server, server_names

    try:
        files, cert = renew_server(args.dir, args.host, args.ip, args.days)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    hosts, ips = server_names(cert)
    print(f"{'server_pem':<11} {files.server_pem} ({_owner_mode(files.server_pem)})")
    print(f"{'server_key':<11} {files.server_key} ({_owner_mode(files.server_key)})")
    print(f"server certificate names: {', '.join(hosts + ips)}; valid until "
          f"{cert.not_valid_after_utc:%Y-%m-%d}; CA unchanged ({files.ca_pem})")
    print("reload the broker to serve it (systemctl reload lockmq, or SIGHUP)")
    return 0


def _owner_mode(path: str) -> str:
    """``owner:group 0640`` of ``path`` (renew keeps those of the file it replaces)."""
    import grp
    import os
    import pwd
    import stat

    st = os.stat(path)
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{owner}:{group} {stat.S_IMODE(st.st_mode):04o}"


def cmd_der(args: argparse.Namespace) -> int:
    """PEM to DER."""
    from lockmq.security.certs import pem_to_der

    pem_to_der(args.pem, args.der)
    print(args.der)
    return 0
