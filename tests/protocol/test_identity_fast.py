"""``identity_problem`` answers a well-formed id in one ``str.strip``: it must give
exactly the answer of the character walk it short-cuts, for any string."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lockmq.protocol._constants import MAX_SN
from lockmq.protocol._identity import _FIRST, _REST, identity_problem


def walk(name: str) -> str | None:
    """The rule as a plain walk over the characters (the slow path alone)."""
    if not name:
        return "an empty id"
    if len(name) > MAX_SN:
        return "an id of %d characters" % len(name)
    if name[0] not in _FIRST:
        return "an id starting with %r" % name[0]
    for ch in name:
        if ch not in _REST:
            return "an id containing %r" % ch
    return None


near_ids = st.text(alphabet=_REST + "$: \x00é\u212a", max_size=MAX_SN + 3)


@settings(max_examples=500, deadline=None)
@given(st.one_of(near_ids, st.text(max_size=70)))
def test_fast_path_agrees_with_the_walk(name):
    assert identity_problem(name) == walk(name)


def test_edges():
    assert identity_problem("BENCH-000001") is None
    assert identity_problem("a" * MAX_SN) is None
    assert identity_problem("a" * (MAX_SN + 1)) == walk("a" * (MAX_SN + 1))
    assert identity_problem("-a") == walk("-a")
    assert identity_problem("a.") is None
    assert identity_problem("a$") == "an id containing '$'"
