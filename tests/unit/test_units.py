"""Contribution bounding: at most k rows per unit, uniform choice, order independence."""

import numpy as np
import pytest

from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.units import BoundContributions, bound_rows, pid_shards


def _data(n=3000, users=100, seed=0):
    rs = RandomSource(seed=seed)
    pids = np.array([f"u{i}" for i in rs.integers(users, n)], dtype=object)
    codes = np.stack([rs.child(1).integers(5, n), rs.child(2).integers(3, n)], axis=1)
    return codes, pids


def test_at_most_k_per_unit_and_all_small_units_kept():
    codes, pids = _data()
    keep = bound_rows(codes, pids, 3, RandomSource(seed=1))
    kept = pids[keep]
    _, counts = np.unique(kept, return_counts=True)
    assert counts.max() <= 3
    _, orig = np.unique(pids, return_counts=True)
    assert len(kept) == np.minimum(orig, 3).sum()


def test_independent_of_input_order():
    codes, pids = _data()
    rs = RandomSource(seed=2)
    a = bound_rows(codes, pids, 2, rs)
    perm = RandomSource(seed=9).uniform(len(pids)).argsort()
    b = bound_rows(codes[perm], pids[perm], 2, RandomSource(seed=2))
    rows_a = sorted(zip(pids[a], map(tuple, codes[a].tolist())))
    rows_b = sorted(zip(pids[perm][b], map(tuple, codes[perm][b].tolist())))
    assert rows_a == rows_b


def test_choice_is_uniform_within_a_unit():
    codes = np.arange(10).reshape(10, 1)
    pids = np.array(["p"] * 10, dtype=object)
    hits = np.zeros(10)
    for i in range(3000):
        hits[bound_rows(codes, pids, 1, RandomSource(seed=i))] += 1
    assert np.allclose(hits / 3000, 0.1, atol=0.025)


def test_pid_shards_stable():
    pids = np.array(["a", "b", "c"], dtype=object)
    assert pid_shards(pids, 64).tolist() == pid_shards(pids.copy(), 64).tolist()


def test_validation():
    with pytest.raises(ValueError, match=r"max_contributions \(0\) must be an int >= 1"):
        BoundContributions(max_contributions=0)
