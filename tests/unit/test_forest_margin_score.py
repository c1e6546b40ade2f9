"""The label-free forest's edge score against the released 1-way tables (issue 18, H102):
``margin_score`` moves by at most 1 per record, and the forest releases its 1-way tables first,
scores its steps against them with sensitivity m, and spends exactly the planned ε."""

import itertools

import numpy as np
import pytest

from beamsynth.transforms import privbayes_sizing
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    candidate_families,
    indif_score,
    margin_score,
    measure_privbayes,
    plan_privbayes,
)
from beamsynth.transforms.synthesis import norm_sub_probabilities


def _neighbours(table):
    """Every table one record away (add to any cell, remove from any non-empty cell)."""
    for idx in itertools.product(*map(range, table.shape)):
        for step in (1, -1):
            if step < 0 and table[idx] == 0:
                continue
            other = table.copy()
            other[idx] += step
            yield other


def test_margin_score_moves_by_at_most_one_per_record_where_indif_moves_more():
    rng = np.random.default_rng(0)
    worst_indif = 0.0
    for _ in range(20):
        t = rng.integers(0, 6, size=(3, 4))
        qa, qb = rng.dirichlet(np.ones(3)), rng.dirichlet(np.ones(4))  # released: fixed
        rows = float(rng.integers(20, 60))  # public or DP count: fixed
        s = margin_score(t, qa, qb, rows)
        for other in _neighbours(t):
            assert abs(margin_score(other, qa, qb, rows) - s) <= 1.0 + 1e-9
            worst_indif = max(worst_indif, abs(indif_score(other) - indif_score(t)))
    assert worst_indif > 1.0  # InDif's own margins move with the record (its bound is 4)
    assert margin_score(np.array([[2, 0], [0, 2]]), [0.5, 0.5], [0.5, 0.5], 4) == 4.0
    with pytest.raises(ValueError, match="do not match"):
        margin_score(np.ones((2, 3)), [0.5, 0.5], [0.5, 0.5], 4)


@pytest.mark.parametrize("m", [1, 2])
def test_margins_forest_releases_one_way_first_and_scores_with_sensitivity_m(monkeypatch, m):
    rng = np.random.default_rng(3)
    n = 1000  # n·ε = 500: no θ-useful network, a forest of one affordable pair (0, 1)
    x = rng.integers(0, 2, n)
    codes = np.stack([x, np.where(rng.random(n) < 0.9, x, 1 - x), rng.integers(0, 30, n),
                      rng.integers(0, 30, n)], axis=1)
    shape = (2, 2, 30, 30)
    plan = plan_privbayes(shape, PureDP(epsilon=0.5), sizing="auto", rows=n * m,
                          max_contributions=m, refine_pairs=0)
    forest = plan.forest
    assert forest is not None and forest.steps >= 1 and forest.score == "margins"
    calls = []
    real = privbayes_sizing.permute_and_flip

    def record(rs, scores, *, epsilon, sensitivity):
        calls.append((np.asarray(scores).copy(), epsilon, sensitivity))
        return real(rs, scores, epsilon=epsilon, sensitivity=sensitivity)

    monkeypatch.setattr(privbayes_sizing, "permute_and_flip", record)
    fams = candidate_families(len(shape), plan.degree)
    counts = [t.reshape([shape[c] for c in f]) for t, f in zip(count_marginals(codes, fams, shape), fams)]
    meas = measure_privbayes(counts, fams, shape=shape, names=list("abcd"), plan=plan,
                             rs=RandomSource(seed=1))
    d = len(shape)
    first = meas.marginals[:d]
    assert [t.columns for t in first] == [(c,) for c in range(d)]  # released before the edges
    assert sum(t.budget.epsilon for t in first) == pytest.approx(forest.one_way_budget.epsilon)
    assert calls and all(e == pytest.approx(forest.step_epsilon) and s == float(m)
                         for _, e, s in calls)
    # the first step's scores are margin_score against those released tables (n̂ = the rows)
    q = norm_sub_probabilities(first)
    pairs = [(a, b) for a, b in itertools.combinations(range(d), 2)
             if shape[a] * shape[b] <= forest.max_pair_cells]
    expected = [margin_score(counts[fams.index(p)] if p in fams else None, q[p[0]], q[p[1]],
                             forest.rows) - shape[p[0]] * shape[p[1]] * forest.pair_scale
                for p in pairs]
    assert np.allclose(calls[0][0], expected + [0.0])
    # sequential composition: 1-way + steps + edge (or second 1-way) tables = the model's ε
    spent = sum(t.budget.epsilon for t in meas.marginals) + forest.steps * forest.step_epsilon
    assert spent == pytest.approx(0.5)
    assert forest.structure_budget.epsilon == pytest.approx(
        0.5 * privbayes_sizing.FOREST_STRUCTURE_FRACTION / 4)
