"""The refusal of an admin op, on the broker's side.

An op (``lockmq.broker.admin`` and the ops features declare there, such as
replication's) raises :class:`AdminError`; the admin handler answers
``{"ok": false, "error": code, "message": ...}``. It lives below both packages so that
a feature raises it without importing the broker. (A client sees the refusal as
``lockmq.client.errors.AdminError``.)
"""

from __future__ import annotations


class AdminError(Exception):
    """A refused admin request: ``code`` is the error's name (``INVALID_ARGUMENT``...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
