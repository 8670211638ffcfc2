"""The consumer bodies have one codec, ``_consume.py``, on CPython and MicroPython alike
(issue #38: the CPython-only tier that patched its classes at import is gone): the
shared vectors pass, random bodies round-trip, every cut or padded body is BadBody,
MicroPython decodes the same bodies to the same fields, and it never loads the host's
batch functions (``batch.py``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from lockmq import protocol as p
from lockmq.protocol import _consume
from lockmq.protocol import batch as py_batch
from lockmq.protocol._crc import crc16_table

from . import vector_checks
from lockmq.testing.micropython import PROTOCOL, build_mpy_lib, run_micropython


def test_the_consumer_bodies_are_not_patched() -> None:
    assert p.Ack.decode is _consume.Ack.decode
    assert p.Messages.encode is _consume.Messages.encode
    assert not hasattr(py_batch, "install")


def test_vectors_pass() -> None:
    passed, failures = vector_checks.run(str(PROTOCOL / "vectors.json"), [crc16_table])
    assert failures == []
    assert passed > 100


_leases = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 0xFFFF)), max_size=30)
_message = st.builds(p.Message, st.integers(0, 2**64 - 1), st.integers(0, 0xFFFF),
                     st.text("ABC-0123", min_size=1, max_size=20), st.integers(0, 2**32 - 1),
                     st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
                     st.sampled_from(["locks", "$devices", "a.b-c"]), st.binary(max_size=64),
                     st.sampled_from([b"", b'{"retries":1}']))


@given(st.integers(0, 2**32 - 1), _leases, st.integers(0, 2**32 - 1), st.text(max_size=30),
       st.data())
def test_lease_bodies_round_trip_and_every_cut_is_bad_body(sub_id, leases, delay, reason,
                                                           data) -> None:
    ack = p.Ack(sub_id, leases).encode()
    nack = p.Nack(sub_id, leases, delay, reason).encode()
    assert (p.Ack.decode(ack), p.Nack.decode(nack)) == (
        p.Ack(sub_id, leases), p.Nack(sub_id, leases, delay, reason))
    assert all(type(x) is tuple for x in p.Ack.decode(ack).leases)
    for body, cls in ((ack, p.Ack), (nack, p.Nack)):
        cut = data.draw(st.integers(0, len(body) - 1))
        for bad in (body[:cut], body + b"\x00"):
            with pytest.raises(p.BadBody):
                cls.decode(bad)


@given(st.integers(0, 2**32 - 1), st.lists(_message, max_size=10), st.data())
def test_messages_round_trip_whole_and_are_bad_body_cut_or_with_trailing_bytes(
        sub_id, messages, data) -> None:
    body = p.Messages(sub_id, messages).encode()
    assert p.Messages.decode(body) == p.Messages(sub_id, messages)
    assert p.Messages.decode(memoryview(body)) == p.Messages(sub_id, messages)
    cut = data.draw(st.integers(0, len(body) - 1))
    for bad in (body[:cut], body + b"\x00"):
        with pytest.raises(p.BadBody):
            p.Messages.decode(bad)


@given(st.sampled_from([p.Ack, p.Nack, p.Messages]), st.binary(max_size=200))
def test_any_bytes_are_a_body_that_encodes_back_to_them_or_bad_body(cls, data: bytes) -> None:
    """The broker decodes every ACK and NACK from the network with these (with or
    without the core): hostile bytes raise BadBody and nothing else."""
    try:
        body = cls.decode(data)
    except p.BadBody:
        return
    assert body.encode() == data


def test_messages_decode_refuses_a_name_that_is_not_utf8() -> None:
    body = bytearray(p.Messages(1, [p.Message(1, 1, "AB", 1, 0, 0, "t", b"x")]).encode())
    body[6 + 30 + 1] = 0xFF   # the SN's first byte (after the fixed fields)
    with pytest.raises(p.BadBody, match="UTF-8"):
        p.Messages.decode(bytes(body))


@pytest.mark.parametrize("body", [b"", b"\x00\x00\x00\x01\x00",
                                  b"\x00\x00\x00\x01\x00\x02" + b"\x00" * 19,
                                  b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x03ab"])
def test_truncated_lease_bodies_are_bad_body(body: bytes) -> None:
    with pytest.raises(p.BadBody):
        p.Ack.decode(body)
    with pytest.raises(p.BadBody):
        p.Nack.decode(body)


def test_micropython_decodes_the_consumer_bodies_alike(tmp_path: Path) -> None:
    leases = [(2**64 - 1, 0xFFFF), (0, 1), (12345, 7)]
    msgs = [p.Message(9, 2, "LOCK-1", 5, 1, 2, "lock.events", b"\x00\x01", b'{"a":1}'),
            p.Message(10, 1, "LOCK-2", 6, 3, 4, "$devices", b"", b"")]
    bodies = {"ack": p.Ack(7, leases).encode().hex(),
              "nack": p.Nack(7, leases, 250, "busy").encode().hex(),
              "messages": p.Messages(3, msgs).encode().hex(),
              "cut": p.Messages(3, msgs).encode()[:-1].hex()}
    lib = build_mpy_lib(tmp_path, compile_mpy=False)
    script = tmp_path / "bodies.py"
    script.write_text(
        "import json, binascii\n"
        "from lockmq.protocol._consume import Ack, Nack, Messages\n"
        "from lockmq.protocol import ProtocolError\n"
        "b = json.loads(%r)\n"
        "h = lambda k: binascii.unhexlify(b[k])\n"
        "a = Ack.decode(h('ack')); n = Nack.decode(h('nack')); m = Messages.decode(h('messages'))\n"
        "try:\n"
        "    Messages.decode(h('cut')); cut = 'decoded'\n"
        "except ProtocolError as e:\n"   # (BadBody is a function there: kind names it)
        "    cut = e.kind\n"
        "print(json.dumps([a.sub_id, [list(x) for x in a.leases], n.sub_id, n.delay_ms, n.reason,\n"
        "                  [list(x) for x in n.leases], m.sub_id,\n"
        "                  [[x.queue_offset, x.delivery, x.sn, x.seq, x.lock_ts_ms, x.broker_ts_us,\n"
        "                    x.topic, binascii.hexlify(x.headers).decode(),\n"
        "                    binascii.hexlify(x.payload).decode()] for x in m.messages], cut]))\n"
        % json.dumps(bodies))
    proc = run_micropython(script, [], tmp_path, [lib, tmp_path], "512K")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = [7, [list(x) for x in leases], 7, 250, "busy", [list(x) for x in leases], 3,
            [[m.queue_offset, m.delivery, m.sn, m.seq, m.lock_ts_ms, m.broker_ts_us, m.topic,
              m.headers.hex(), m.payload.hex()] for m in msgs], "BadBody"]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == want


def test_micropython_loads_neither_the_batch_api_nor_compiled_tags(tmp_path: Path) -> None:
    # (batch.py is CPython's: struct.Struct; a lock's frame tags are _mac.py's own)
    lib = build_mpy_lib(tmp_path, compile_mpy=False)
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys\n"
        "from lockmq import protocol\n"
        "import lockmq.protocol._consume\n"
        "from lockmq.protocol import _session, _mac\n"
        "print('fast' if 'lockmq.protocol.batch' in sys.modules\n"
        "      or _mac._tag is not _mac._padded_tag else 'portable')\n")
    proc = run_micropython(script, [], tmp_path, [lib, tmp_path], "512K")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "portable"


@given(st.integers(0, 1), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
def test_publish_ack_frame_is_the_generic_encoding(status: int, offset: int,
                                                   opaque: int) -> None:
    generic = p.encode_frame(p.Op.PUBLISH_ACK, "", p.PublishAck(status, offset).encode(),
                             opaque, p.Flag.RESPONSE)
    assert py_batch.publish_ack_frame(status, offset, opaque) == generic


@given(st.text(max_size=40), st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1),
       st.binary(max_size=64))
def test_publish_fields_match_publish_decode(topic: str, seq: int, ts: int,
                                             payload: bytes) -> None:
    if len(topic.encode()) > 255:
        return
    body = p.Publish(topic, seq, ts, payload).encode()
    d = p.Publish.decode(body)
    assert py_batch.publish_fields(body) == (d.topic, d.seq, d.lock_ts_ms, d.payload)
    for bad in (body[:12 + len(topic.encode())], b""):
        with pytest.raises(p.BadBody):
            p.Publish.decode(bad)
        with pytest.raises(p.BadBody):
            py_batch.publish_fields(bad)


def test_publish_fields_refuse_a_topic_that_is_not_utf8() -> None:
    body = b"\x02\xff\xfe" + bytes(12)
    with pytest.raises(p.BadBody, match="UTF-8"):
        py_batch.publish_fields(body)
