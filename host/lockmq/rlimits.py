"""The open-file limit: thousands of lock connections need thousands of sockets."""

from __future__ import annotations

import resource


def raise_nofile_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to the hard limit (about a million
    when the hard limit is unlimited); return (soft, hard) as they are afterwards.
    A limit the system refuses to raise is left as it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, 1 << 20) if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft, hard
