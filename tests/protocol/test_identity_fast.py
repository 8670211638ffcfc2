"""``identity_problem`` answers a well-formed id in one ``str.strip`` (anything else
goes on to the character walk that names the problem): it must accept exactly the
ids of the rule, for any string -- held against the rule written as a regex."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from lockmq.protocol._constants import MAX_SN
from lockmq.protocol._identity import _REST, identity_problem

#: the identity rule (SPEC: 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit)
RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,%d}" % (MAX_SN - 1))

near_ids = st.text(alphabet=_REST + "$: \x00\n\u00e9\u212a", max_size=MAX_SN + 3)


@settings(max_examples=500, deadline=None)
@given(st.one_of(near_ids, st.text(max_size=70)))
def test_accepts_exactly_the_ids_of_the_rule(name):
    problem = identity_problem(name)
    assert (problem is None) == (RULE.fullmatch(name) is not None), (name, problem)


def test_edges():
    assert identity_problem("BENCH-000001") is None
    assert identity_problem("a" * MAX_SN) is None
    assert identity_problem("a" * (MAX_SN + 1)) == "an id of %d characters" % (MAX_SN + 1)
    assert identity_problem("-a") == "an id starting with '-'"
    assert identity_problem("a.") is None
    assert identity_problem("a$") == "an id containing '$'"
    assert identity_problem("a\n") == "an id containing '\\n'"
    assert identity_problem("") == "an empty id"
