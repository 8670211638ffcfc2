from ._constants import ErrorCode, MAX_SN
from ._session import SessionError

# Identities: a lock SN or a service's client (producer) id is 1-64 characters of
# A-Z a-z 0-9 . _ - starting with a letter or digit. So "$..." (the broker's own
# ids and system topics), spaces, control characters and ":" (the separator of a
# message id "SN:seq") can never be claimed.
_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_REST = _FIRST + "._-"
IDENTITY_RULE = "1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or digit"


def identity_problem(name):
    """Why ``name`` cannot be a lock SN or client id, or None when it can."""
    # the common case in one pass in C: every character allowed (nothing left once
    # they are stripped) and an allowed first one; anything else is named below
    if name and len(name) <= MAX_SN and name[0] in _FIRST and not name.strip(_REST):
        return None
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


def check_identity(name, what="client id"):
    """Raise SessionError(INVALID_ARGUMENT) unless ``name`` is a valid identity."""
    problem = identity_problem(name)
    if problem is not None:
        raise SessionError("%s %r refused: %s; an id is %s (ids starting with $ are the "
                           "broker's own)" % (what, name, problem, IDENTITY_RULE),
                           ErrorCode.INVALID_ARGUMENT)
