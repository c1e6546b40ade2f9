"""Fourteenth session, H59 (issue 18): a pure-ε network's ε split over its tables follows the
columns' 1-way margins as well as the tables' own noise (``split_network_budget``).

Exact arithmetic on public shapes, and the measurement step's released tables, which must carry
the split's ε (the √cells split before H59 fails the last tests)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from beamsynth.transforms import privbayes_sizing as sizing
from beamsynth.transforms.budget import ApproxDP, PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    candidate_families,
    measure_privbayes,
    plan_privbayes,
    split_marginal_budget,
)
from beamsynth.transforms.privbayes_sizing import split_network_budget

# ACS-like: a 7-cell column whose only table is 7 × 3, a 3-cell column joined to a 100-cell one
SHAPE = (7, 3, 100, 2)
SPECS = [(0, 1), (2, 1), (3, 2)]


def _one_way_noise(eps: list[float], specs, shape) -> float:
    """Σ_c c·(Σ_{t∋c} ε_t²·c/C_t)^(-1/2): the columns' summed 1-way noise (the split's J₁)."""
    prec = np.zeros(len(shape))
    for e, s in zip(eps, specs):
        cells = math.prod(shape[c] for c in s)
        for c in s:
            prec[c] += e * e * shape[c] / cells
    return float(sum(shape[c] / math.sqrt(prec[c]) for c in range(len(shape)) if prec[c] > 0))


def test_split_adds_up_and_favours_a_columns_only_table() -> None:
    """The ε_t add up to the budget; the 21-cell table (column 0's only source) gets more than
    its √cells share; the 1-way noise falls by more than the tables' summed noise rises."""
    budget = PureDP(epsilon=1.3)
    new = [b.epsilon for b in split_network_budget(budget, SPECS, SHAPE, table_weight=1.0)]
    old = [b.epsilon for b in split_marginal_budget(budget, [21, 300, 200])]
    assert sum(new) == pytest.approx(1.3, rel=1e-12)
    assert new[0] > 1.2 * old[0]
    j_new, j_old = _one_way_noise(new, SPECS, SHAPE), _one_way_noise(old, SPECS, SHAPE)
    t_new = sum(c / e for c, e in zip([21, 300, 200], new))
    t_old = sum(c / e for c, e in zip([21, 300, 200], old))
    assert j_new < 0.95 * j_old
    assert (t_new / t_old - 1) < (1 - j_new / j_old)


def test_no_weight_is_the_sqrt_cells_split(monkeypatch) -> None:
    """``table_weight=None`` (the plan's weight where ``NETWORK_SPLIT_TABLE_WEIGHT = None``, the
    A/B switch: read into the plan, never by the split itself, H78) restores the √cells split
    exactly, and so does a network of 1-way tables only."""
    budget = PureDP(epsilon=0.7)
    got = [b.epsilon for b in split_network_budget(budget, SPECS, SHAPE, table_weight=None)]
    assert got == [b.epsilon for b in split_marginal_budget(budget, [21, 300, 200])]
    monkeypatch.setattr(sizing, "NETWORK_SPLIT_TABLE_WEIGHT", None)  # not read by the split
    ones = [b.epsilon for b in split_network_budget(budget, [(0,), (1,), (2,)], SHAPE)]
    assert ones == [b.epsilon for b in split_marginal_budget(budget, [7, 3, 100])]


def test_split_is_deterministic_and_follows_the_weight() -> None:
    """Same inputs, same ε (a redrawn step gets the same scales); a huge table weight tends to
    the √cells split, a small one moves further toward the 1-way margins."""
    budget = PureDP(epsilon=2.0)
    a = split_network_budget(budget, SPECS, SHAPE, table_weight=1.0)
    assert a == split_network_budget(budget, SPECS, SHAPE, table_weight=1.0)
    far = split_network_budget(budget, SPECS, SHAPE, table_weight=1e9)
    old = split_marginal_budget(budget, [21, 300, 200])
    assert [b.epsilon for b in far] == pytest.approx([b.epsilon for b in old], rel=1e-4)
    near = split_network_budget(budget, SPECS, SHAPE, table_weight=0.2)
    assert near[0].epsilon > a[0].epsilon > old[0].epsilon


def _codes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x0 = rng.integers(0, 7, n)
    x1 = (x0 + rng.integers(0, 2, n)) % 3
    x2 = (x1 * 30 + rng.integers(0, 40, n)) % 100
    x3 = (x2 > 50).astype(np.int64) ^ (rng.random(n) < 0.1)
    return np.stack([x0, x1, x2, x3], axis=1).astype(np.int64)


@pytest.mark.parametrize("m", [1, 2])
def test_measured_laplace_network_carries_the_split(monkeypatch, m: int) -> None:
    """measure_privbayes (Laplace plan, public rows, k = 1) releases each table at the ε of
    split_network_budget over the chosen structure, and those ε add up to the marginal spend
    (fails with the √cells split: the small tables' ε differ)."""
    monkeypatch.setattr(sizing, "NETWORK_SPLIT_TABLE_WEIGHT", 1.0)
    codes = _codes(20_000, 3)
    plan = plan_privbayes(SHAPE, ApproxDP(epsilon=2.0, delta=0.0), sizing="auto", rows=len(codes),
                          max_contributions=m, refine_pairs=0, degree=1)
    assert plan.degree == 1 and plan.zcdp is None
    fams = candidate_families(len(SHAPE), plan.degree, shape=SHAPE,
                              max_family_cells=plan.max_family_cells)
    counts = [t.reshape([SHAPE[c] for c in f])
              for t, f in zip(count_marginals(codes, fams, SHAPE), fams)]
    out = measure_privbayes(counts, fams, shape=SHAPE, names=list("abcd"), plan=plan,
                            rs=RandomSource(seed=1))
    specs = [tuple(t.columns) for t in out.marginals]
    assert any(len(s) > 1 for s in specs)
    want = split_network_budget(plan.marginal_budget, specs, SHAPE)
    got = [t.budget.epsilon for t in out.marginals]
    assert got == pytest.approx([b.epsilon for b in want], rel=1e-12)
    assert sum(got) == pytest.approx(plan.marginal_budget.epsilon, rel=1e-12)
    for t in out.marginals:
        assert t.scale == pytest.approx(m / t.budget.epsilon, rel=1e-12)
    old = split_marginal_budget(plan.marginal_budget, [t.values.size for t in out.marginals])
    assert max(abs(g - o.epsilon) for g, o in zip(got, old)) > 1e-3


def test_split_is_on_a_grid_that_absorbs_last_bit_differences() -> None:
    """The optimized shares are whole multiples of ε/2²⁰ adding up to exactly 2²⁰ units, each
    table at least one unit; shares that differ in their last bits (another machine's solver)
    give the same units, so a recomputed measurement draws with the same scales (rule 4)."""
    budget = PureDP(epsilon=1.3)
    got = [b.epsilon for b in split_network_budget(budget, SPECS, SHAPE, table_weight=1.0)]
    units = [e / 1.3 * sizing.SPLIT_GRID for e in got]
    assert all(abs(u - round(u)) < 1e-6 and round(u) >= 1 for u in units)
    assert sum(round(u) for u in units) == sizing.SPLIT_GRID
    shares = np.asarray([0.2137, 0.4011, 0.3852])
    assert sum(sizing._grid_shares(shares)) == sizing.SPLIT_GRID
    for eps in (1e-13, -1e-13, 3e-12):
        assert sizing._grid_shares(shares * (1 + eps)) == sizing._grid_shares(shares)
    assert sizing._grid_shares(np.asarray([1e-9, 1 - 1e-9])) == [1, sizing.SPLIT_GRID - 1]
