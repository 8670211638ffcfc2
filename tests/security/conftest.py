"""Fixtures for the security tests: a real registry in a temp dir, a fake clock."""

from __future__ import annotations

import os

import pytest

from lockmq.security import Guard, SecurityConfig


class FakeClock:
    """A monotonic clock the test moves by hand (no sleeps, no timed asserts)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(1_800_000_000.0)


@pytest.fixture
def cfg(tmp_path) -> SecurityConfig:
    return SecurityConfig(data_dir=str(tmp_path / "data"), limit_exempt_addresses=[],
                          allow_plain_tokens_from=["127.0.0.1"])


@pytest.fixture
def guard(cfg, clock, wall):
    os.makedirs(cfg.data_dir, exist_ok=True)
    g = Guard(cfg, clock=clock, wall=wall)
    yield g
    g.close()
