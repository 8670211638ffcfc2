"""Byte layout of the protocol's ``LockEvent`` record (placeholder until protocol/SPEC.md lands)."""

from __future__ import annotations

import numpy as np


def candidates(arr: np.ndarray, pay_start: np.ndarray, pay_len: np.ndarray) -> np.ndarray:
    """Which payloads have the LockEvent layout."""
    return np.zeros(len(pay_start), dtype=bool)


def extract(arr: np.ndarray, pay_start: np.ndarray, pay_len: np.ndarray, valid: np.ndarray) -> dict:
    """The raw LockEvent fields as numpy arrays."""
    raise NotImplementedError
