"""The recovery fuzz, short (issue 34): a few seeded cases of random damage anywhere
in a stopped store; ``bench/fuzz_recovery.py`` runs thousands."""

from __future__ import annotations

import logging

import pytest

from lockmq.testing.store_fuzz import build_image, run_case


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    return [build_image(str(root / "clean")), build_image(str(root / "crash"), crashed=True)]


@pytest.mark.parametrize("seed", [3, 9, 27, 61, 129, 170, 248, 388, 1075, 1262, 3573, 5179])
def test_random_damage_costs_only_the_damaged_records(images, tmp_path, seed, caplog):
    caplog.set_level(logging.CRITICAL)
    r = run_case(images[seed % 2], str(tmp_path / "work"), seed)
    assert r.ok, (r.damage, r.failures)
