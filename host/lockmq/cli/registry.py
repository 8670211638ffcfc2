"""``lockmq registry``: run the campus registry, or ask one what it knows.

``lockmq registry --port 6900 --tokens registry.tokens --state registry.json`` runs
the registry (gateways register with it through their ``[registry]`` table; it
evicts a gateway silent for ``--evict-after`` seconds). ``lockmq registry list
--registry HOST:PORT`` and ``lockmq registry lookup TOPIC --registry HOST:PORT``
print the gateways it knows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from lockmq.eventlog import EventLog
from lockmq.client.cliargs import fail, print_json, print_table
from lockmq.client.errors import LockmqError
from lockmq.signals import ignore_stop_signals, stop_on_signals

COLUMNS = ["name", "building", "role", "addresses", "topics", "silent_s"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``lockmq registry`` (serve), ``registry list`` and ``registry lookup``."""
    p = sub.add_parser("registry", help="run the campus registry (discovery of gateways)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="0.0.0.0", help="listen address (default %(default)s)")
    p.add_argument("--port", type=int, default=6900, help="listen port (default %(default)s)")
    p.add_argument("--tokens", metavar="FILE", default=None,
                   help="accepted tokens, one a line, each optionally followed by the "
                        "gateway names it owns (required unless --no-auth)")
    p.add_argument("--tls-cert", metavar="PEM", default="",
                   help="serve TLS with this certificate (and --tls-key): tokens never "
                        "cross the network in clear")
    p.add_argument("--tls-key", metavar="PEM", default="")
    p.add_argument("--no-auth", action="store_true",
                   help="trust every peer, names have no owner (development only)")
    p.add_argument("--state", metavar="FILE", default="",
                   help="where the table is saved, so a restarted registry answers at once")
    p.add_argument("--evict-after", type=float, default=120.0, metavar="SECONDS",
                   help="evict a gateway silent this long (default %(default)g)")
    p.add_argument("--sweep", type=float, default=5.0, metavar="SECONDS",
                   help="how often silent gateways are looked for (default %(default)g)")
    p.add_argument("--max-gateways", type=int, default=1000)
    p.add_argument("--max-topics", type=int, default=1000, help="per gateway")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=serve)
    ops = p.add_subparsers(dest="registry_op", metavar="OP")
    for name, text in (("list", "every gateway the registry knows"),
                       ("lookup", "the gateways serving a topic")):
        q = ops.add_parser(name, help=text)
        q.add_argument("--registry", "-r", required=not os.environ.get("LOCKMQ_REGISTRY"), metavar="HOST:PORT[,HOST:PORT]",
                       default=os.environ.get("LOCKMQ_REGISTRY"))
        q.add_argument("--token", default=os.environ.get("LOCKMQ_TOKEN"))
        q.add_argument("--json", action="store_true", help="print JSON")
        q.add_argument("--insecure", action="store_true",
                       help="allow the token in clear to a registry on another host")
        if name == "lookup":
            q.add_argument("topic", nargs="?", default=None)
            q.add_argument("--building", default=None)
        q.set_defaults(func=show)


def serve(args: argparse.Namespace) -> int:
    """Run the registry until SIGTERM / SIGINT."""
    from lockmq.registry.server import RegistryServer, load_token_names

    if not args.tokens and not args.no_auth:
        return fail("the registry authenticates its peers: give --tokens FILE (one token a "
                    "line), or --no-auth for development")
    try:
        tokens = load_token_names(args.tokens) if args.tokens else None
    except OSError as exc:
        return fail(f"cannot read --tokens: {exc}")
    if args.evict_after <= 0 or args.sweep <= 0 or args.max_gateways <= 0 \
            or args.max_topics <= 0:
        return fail("--evict-after, --sweep, --max-gateways and --max-topics must be positive")
    log = EventLog(args.log_level)
    if tokens is None:
        log("auth_off", level="warning", note="no --tokens: every peer is trusted")

    ctx = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            return fail("--tls-cert and --tls-key go together")
        import ssl
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            return fail(f"cannot load --tls-cert/--tls-key: {exc}")

    async def main() -> None:
        server = RegistryServer(host=args.host, port=args.port, tokens=tokens, ssl=ctx,
                                allow_anonymous=args.no_auth,
                                state_file=args.state, evict_after_s=args.evict_after,
                                sweep_s=args.sweep, max_gateways=args.max_gateways,
                                max_topics=args.max_topics, log=log)
        stop = stop_on_signals()   # before the port opens: systemd may signal at once
        try:
            await server.start()
            await stop.wait()
            await server.stop()
        finally:   # stopped (or failed): a signal from here to the exit changes nothing
            ignore_stop_signals()

    try:
        asyncio.run(main())
    except OSError as exc:
        log("registry_failed", level="error", error=str(exc))
        return 1
    return 0


def show(args: argparse.Namespace) -> int:
    """``registry list`` / ``registry lookup``."""
    from lockmq.client.registry import registry_request

    q = {}
    if args.registry_op == "lookup":
        q = {k: v for k, v in (("topic", args.topic), ("building", args.building)) if v}
    try:
        reply = asyncio.run(registry_request(args.registry, f"registry.{args.registry_op}",
                                             token=args.token, insecure=args.insecure, **q))
    except (LockmqError, OSError, ValueError) as exc:
        return fail(str(exc) or type(exc).__name__)
    gateways = reply["gateways"]
    if args.json:
        print_json(gateways)
        return 0
    rows = [{**g, "addresses": ",".join(g["addresses"]), "topics": ",".join(g["topics"])}
            for g in gateways]
    print_table(rows, COLUMNS)
    print(f"{len(gateways)} gateway(s)", file=sys.stderr)
    return 0
