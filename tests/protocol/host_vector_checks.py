# Checks of the host-only vectors (vectors.json "host_frames" and "host_invalid_bodies":
# transactional and scheduled messages) that run unchanged under CPython
# (test_host_vectors.py) and MicroPython (mpy_host_vectors.py). Kept apart from
# vector_checks.py: a lock never loads these bodies, so they stay out of its
# heap-sized run. MicroPython subset only.
import json

from lockmq import protocol as p
import lockmq.protocol._schedule  # noqa: F401  (registers the scheduled-delivery bodies)
import lockmq.protocol._txn  # noqa: F401  (registers the TXN_* bodies)

from vector_checks import _h, _plain, _expect_error, _decode_all


def run(path):
    """Check every host-only vector; returns (passed, [failure messages])."""
    with open(path) as fh:
        v = json.load(fh)
    passed = 0
    failures = []

    def check(ok, what):
        if ok:
            return 1
        failures.append(what)
        return 0

    parts = []
    for f in v["host_frames"]:
        data = _h(f["hex"])
        parts.append(data)
        enc = p.encode_frame(f["opcode"], f["sn"], _h(f["body_hex"]), f["opaque"], f["flags"])
        passed += check(enc == data, "encode %s" % f["name"])
        got, _ = _decode_all(data, 1)
        fr = got[0] if len(got) == 1 else None
        passed += check(fr is not None and fr.opcode == f["opcode"] and fr.sn == f["sn"]
                        and fr.body == _h(f["body_hex"]), "decode %s" % f["name"])
        if fr is not None:
            body = p.decode_body(fr.opcode, fr.body)
            passed += check(_plain(body) == f["fields"], "body fields %s" % f["name"])
            passed += check(body.encode() == fr.body, "body re-encode %s" % f["name"])
    stream = b"".join(parts)
    for chunk in (1, 5, 4096):
        got, dec = _decode_all(stream, chunk)
        passed += check(len(got) == len(v["host_frames"]) and dec.buffered() == 0,
                        "host stream in chunks of %d" % chunk)
    for bad in v["host_invalid_bodies"]:
        def decode_bad(op=bad["opcode"], data=_h(bad["body_hex"])):
            p.decode_body(op, data)
        err = _expect_error(decode_bad, bad["error"], bad["code"])
        passed += check(err is None, "invalid body %s: %s" % (bad["name"], err))
    return passed, failures
