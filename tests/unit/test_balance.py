"""Unit tests for transforms/balance.py (Beam-free): pair-balanced selection from a weighted pool."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from beamsynth.transforms.balance import balance_pairs, pair_balance_error
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.refine import systematic_indices

SHAPE = (6, 5, 4, 3)


def _pool(rows: int = 8000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A dependent pool (columns 0–1 and 2–3 related) with uneven weights."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 6, rows)
    b = np.where(rng.random(rows) < 0.6, a % 5, rng.integers(0, 5, rows))
    c = rng.integers(0, 4, rows)
    d = np.where(rng.random(rows) < 0.5, c % 3, rng.integers(0, 3, rows))
    codes = np.stack([a, b, c, d], axis=1)
    weights = rng.gamma(2.0, 1.0, rows) * (1 + (a == 0))
    return codes, weights


def _iid(weights: np.ndarray, n: int, seed: int) -> np.ndarray:
    p = weights / weights.sum()
    return np.random.default_rng(seed).choice(weights.size, n, p=p)


def _pair_l1(codes: np.ndarray, weights: np.ndarray, picked: np.ndarray) -> float:
    """Σ over pairs of ‖C − T‖₁ (in rows), computed independently of the module."""
    n = picked.size
    total = 0.0
    for a, b in itertools.combinations(range(codes.shape[1]), 2):
        cells = SHAPE[a] * SHAPE[b]
        key = codes[:, a] * SHAPE[b] + codes[:, b]
        target = np.bincount(key, weights=weights, minlength=cells) * n / weights.sum()
        total += np.abs(np.bincount(key[picked], minlength=cells) - target).sum()
    return total


def test_balancing_shrinks_the_pair_error_of_an_iid_and_of_a_systematic_sample():
    codes, w = _pool()
    n = 1500
    for start in (_iid(w, n, 1), systematic_indices(codes, w, n, RandomSource(seed=2), SHAPE)):
        before = _pair_l1(codes, w, start)
        got = balance_pairs(codes, w, start, RandomSource(seed=3))
        assert got.shape == (n,) and got.dtype == np.int64
        assert np.all((got >= 0) & (got < len(codes)))
        after = _pair_l1(codes, w, got)
        assert after < 0.6 * before, (before, after)
        # the diagnostic agrees in direction with the independent count
        assert pair_balance_error(codes, w, got) < pair_balance_error(codes, w, start)


def test_more_proposals_balance_further():
    codes, w = _pool()
    start = _iid(w, 1500, 4)
    few = _pair_l1(codes, w, balance_pairs(codes, w, start, RandomSource(seed=5), proposals=1))
    many = _pair_l1(codes, w, balance_pairs(codes, w, start, RandomSource(seed=5), proposals=20))
    assert many < few < _pair_l1(codes, w, start)


def test_rows_of_zero_weight_are_never_swapped_in():
    codes, w = _pool()
    w = w.copy()
    w[codes[:, 0] == 5] = 0.0  # the model gives value 5 of column 0 no mass
    start = systematic_indices(codes, w, 1000, RandomSource(seed=6), SHAPE)
    got = balance_pairs(codes, w, start, RandomSource(seed=7))
    assert np.all(w[got] > 0)


def test_an_exactly_balanced_sample_is_left_as_it_is():
    # every distinct row once, equal weights, n = pool: C = T in every cell, no swap can help
    codes = np.array(list(itertools.product(range(3), range(2), range(2))))
    w = np.ones(len(codes))
    start = np.arange(len(codes))
    got = balance_pairs(codes, w, start, RandomSource(seed=8), proposals=50)
    assert np.array_equal(got, start)


def test_input_is_not_modified_and_seeded_runs_repeat():
    codes, w = _pool(3000)
    start = _iid(w, 500, 9)
    keep = start.copy()
    a = balance_pairs(codes, w, start, RandomSource(seed=10))
    assert np.array_equal(start, keep)
    assert np.array_equal(a, balance_pairs(codes, w, start, RandomSource(seed=10)))
    assert not np.array_equal(a, balance_pairs(codes, w, start, RandomSource(seed=11)))


def test_limits_on_pairs_and_cells():
    codes, w = _pool(3000)
    start = _iid(w, 500, 12)
    # no pair within the per-pair cell limit: nothing to balance
    assert np.array_equal(balance_pairs(codes, w, start, RandomSource(seed=0), max_pair_cells=2), start)
    # one pair only: that pair improves
    one = balance_pairs(codes, w, start, RandomSource(seed=0), max_pairs=1)
    assert not np.array_equal(one, start)
    # a cell budget below any pair's size also leaves the sample alone
    assert np.array_equal(balance_pairs(codes, w, start, RandomSource(seed=0), max_cells=5), start)
    # trivial cases
    assert np.array_equal(balance_pairs(codes, w, start, RandomSource(seed=0), proposals=0), start)
    assert np.array_equal(balance_pairs(codes[:, :1], w, start, RandomSource(seed=0)), start)
    assert balance_pairs(codes, w, start[:1], RandomSource(seed=0)).tolist() == start[:1].tolist()


def test_codes_outside_a_small_range_are_compacted():
    # a declared domain of 10^9 cells per column: only the values present are tabulated
    codes, w = _pool(3000)
    wide = codes * 100_000_000
    start = _iid(w, 500, 13)
    a = balance_pairs(codes, w, start, RandomSource(seed=14))
    b = balance_pairs(wide, w, start, RandomSource(seed=14))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("kwargs, match", [
    ({"batch": 0}, "batch"),
    ({"batch": True}, "batch"),
    ({"proposals": -1}, "proposals"),
    ({"proposals": float("nan")}, "proposals"),
])
def test_bad_parameters_are_refused_with_the_value(kwargs, match):
    codes, w = _pool(200)
    with pytest.raises(ValueError, match=match):
        balance_pairs(codes, w, np.arange(10), RandomSource(seed=0), **kwargs)


def test_weights_must_match_the_pool():
    codes, w = _pool(200)
    with pytest.raises(ValueError, match="one weight per row"):
        balance_pairs(codes, w[:-1], np.arange(10), RandomSource(seed=0))
