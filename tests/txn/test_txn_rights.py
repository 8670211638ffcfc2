"""Who may do what with transactions (auth required): a half message needs the
publish right on its topic, only its own token ends or is asked about it, and a
token's undecided transactions are capped."""

from __future__ import annotations

import pytest

from lockmq.protocol import ErrorCode, Op
from lockmq.security import Permissions
from lockmq.testing import Peer, SecureBroker, refusal

from .helpers import FAST_CHECKS, end, half, join


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = SecureBroker(tmp_path_factory.mktemp("txn-rights"),
                       {"transactions": {**FAST_CHECKS, "max_pending_per_principal": 3}},
                       tokens={"grants": Permissions(publish=("cards.*",)),
                               "other": Permissions(publish=("cards.*",)),
                               "reader": Permissions(consume=("*",))})
    yield env.start(), env.tok
    env.close()


def _peer(broker, tokens, name: str, client: str) -> Peer:
    p = Peer(broker.port, client)
    p.auth_token(tokens[name])
    return p


def test_a_half_message_needs_the_publish_right(env):
    broker, tok = env
    with _peer(broker, tok, "reader", "svc-reader") as r:
        assert refusal(lambda: half(r, "cards.granted", 1, b"x")).code == ErrorCode.FORBIDDEN
    with _peer(broker, tok, "grants", "svc-grants") as g:
        assert refusal(lambda: half(g, "doors.open", 1, b"x")).code == ErrorCode.FORBIDDEN
        assert refusal(lambda: half(g, "$sys.txn.half", 1, b"x")).code == ErrorCode.FORBIDDEN


def test_only_the_owning_token_ends_or_is_asked_about_a_transaction(env):
    broker, tok = env
    with _peer(broker, tok, "grants", "svc-grants-1") as g, \
            _peer(broker, tok, "other", "svc-other") as o, \
            _peer(broker, tok, "grants", "svc-grants-2") as g2:
        join(o, "g")                                 # another token in the same group name
        txn = half(g, "cards.granted", 1, b"mine")
        assert refusal(lambda: end(o, txn, commit=True)).code == ErrorCode.FORBIDDEN
        g.close()                                    # the producer goes: its token's peer is asked
        join(g2, "g")
        assert g2.wait_unsolicited(Op.TXN_CHECK).txn_id == txn
        assert not [f for f in o.unsolicited if f.opcode == Op.TXN_CHECK]
        assert end(g2, txn, commit=False) == b""     # same token, another producer id


def test_undecided_transactions_are_capped_per_token(env):
    broker, tok = env
    with _peer(broker, tok, "other", "svc-other-cap") as o:
        txns = [half(o, "cards.cap", i, b"x") for i in range(3)]
        assert refusal(lambda: half(o, "cards.cap", 3, b"x")).code == ErrorCode.LIMIT_EXCEEDED
        end(o, txns[0], commit=False)                # room again
        half(o, "cards.cap", 4, b"x")
