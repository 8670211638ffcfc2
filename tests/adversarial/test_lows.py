"""Trust round 2, item 7: the three lows, over real TCP against ``lockmq broker``.

* a ``--system '$*'`` token could write into ``$scheduled``, the scheduler's own topic;
* in a MAC session an untagged frame with an unknown opcode was answered with a validly
  tagged ERROR instead of being refused as a session violation;
* the status page and its JSON answered anyone who reached the port, with lock SNs
  (online and offline) and cluster names.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from lockmq.broker.scheduler import TOPIC as SCHEDULED_TOPIC
from lockmq.broker.transactions import COMMAND_TOPIC, HALF_TOPIC, OP_TOPIC
from lockmq.protocol import TAG_SIZE, ErrorCode, ErrorReply, Flag, Op, encode_frame
from lockmq.security import Permissions
from lockmq.security.identity import is_internal_topic
from lockmq.testing import Peer, Refused, SecureBroker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = SecureBroker(tmp_path_factory.mktemp("lows"),
                       tokens={"sys": Permissions(publish=("*",), system=("$*",)),
                               "ops": Permissions(admin=True),
                               "reader": Permissions(consume=("lock.*",))})
    yield env, env.start()
    env.close()


def _get(port: int, path: str, token: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_no_token_writes_a_broker_internal_topic(env):
    for topic in (SCHEDULED_TOPIC, COMMAND_TOPIC, HALF_TOPIC, OP_TOPIC, "$retry.c.0", "$dlq.c"):
        assert is_internal_topic(topic), topic          # every topic the broker writes itself
    secure, broker = env
    with Peer(broker.port, "") as w:
        w.auth_token(secure.tok["sys"])
        for topic in (SCHEDULED_TOPIC, COMMAND_TOPIC):
            with pytest.raises(Refused) as ei:
                w.publish(topic, 1)
            assert ei.value.code == ErrorCode.FORBIDDEN
        assert w.publish("$audit", 2).status == 0       # its own system topics: still fine


def test_an_untagged_unknown_opcode_in_a_mac_session_ends_it(env):
    secure, broker = env
    key = secure.add_locks("LOCK-7001")["LOCK-7001"]
    w = Peer(broker.port, "LOCK-7001")
    try:
        w.auth_lock(key, mac=True)
        mark = broker.mark()
        w.raw(encode_frame(0x7777, "LOCK-7001", b"x" * 8, 9))
        seen = []
        while (f := w.read(timeout=10)) is not None:
            seen.append(f)
        # not refused and carried on: a session violation -- ERROR BAD_MAC, then closed
        errors = [ErrorReply.decode(f.body[:-TAG_SIZE] if f.flags & Flag.MAC else f.body)
                  for f in seen if f.opcode == Op.ERROR]
        assert [e.code for e in errors] == [ErrorCode.BAD_MAC], errors
        broker.wait_log(r"code=17", start=mark)
    finally:
        w.close()
    # legitimate: the same lock with MACs goes on working
    with Peer(broker.port, "LOCK-7001") as w:
        w.auth_lock(key, mac=True)


def test_the_status_page_names_nothing_without_an_admin_token(env):
    secure, broker = env
    sp = broker.status_port
    for path in ("/", "/summary", "/stats", "/devices", "/clusters", "/topics", "/commands",
                 "/history"):
        status, body = _get(sp, path)
        assert status == 401, (path, body)
        assert _get(sp, path, secure.tok["reader"])[0] == 401      # not an admin token
        assert _get(sp, path, "lmq_0000000000000000_forged")[0] == 401
    assert _get(sp, "/health")[0] == 200
    assert _get(sp, "/metrics")[0] == 200                             # (metrics_token_required)
    status, body = _get(sp, "/devices", secure.tok["ops"])
    assert status == 200 and "devices" in json.loads(body)
    assert broker.metrics()["lockmq_status_unauthorized_total"] >= 24
