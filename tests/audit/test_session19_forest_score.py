"""Neighbour audit of the forest's edge step under the "margins" score (issue 18, H102).

Given the released 1-way tables (fixed: the step runs after their release, adaptive sequential
composition), the first step's permute-and-flip law on a dataset and on each neighbour (one
record added to any cell or removed) must differ by at most ``e^{ε_step}``; the scores come from
the real ``choose_forest`` path. The same audit with InDif at the margins' sensitivity (a broken
variant: InDif moves by up to 4) is caught."""

import itertools
import math

import numpy as np
import pytest

from beamsynth.transforms import privbayes_sizing
from beamsynth.transforms.noise import RandomSource, permute_and_flip_probabilities
from beamsynth.transforms.privbayes import choose_forest, plan_forest

pytestmark = pytest.mark.audit

SHAPE = (2, 2, 3)


def _tables(codes):
    return {p: np.asarray(np.histogram2d(codes[:, p[0]], codes[:, p[1]],
                                         bins=[np.arange(SHAPE[p[0]] + 1),
                                               np.arange(SHAPE[p[1]] + 1)])[0], dtype=np.int64)
            for p in itertools.combinations(range(len(SHAPE)), 2)}


def _first_step_scores(monkeypatch, tables, plan, margins):
    seen = []

    def record(rs, scores, *, epsilon, sensitivity):
        seen.append((np.asarray(scores, dtype=np.float64).copy(), epsilon, sensitivity))
        return len(scores) - 1  # 'no edge': the later steps are not audited here

    monkeypatch.setattr(privbayes_sizing, "permute_and_flip", record)
    choose_forest(tables, SHAPE, plan=plan, rs=RandomSource(seed=0), margins=margins)
    return seen[0]


def _worst_ratio(monkeypatch, plan, margins, codes, score_of=None):
    base = _first_step_scores(monkeypatch, _tables(codes), plan, margins)
    scores, eps, sens = base if score_of is None else (score_of(_tables(codes)), *base[1:])
    p = permute_and_flip_probabilities(scores, epsilon=eps, sensitivity=sens)
    worst = 0.0
    cells = list(itertools.product(*map(range, SHAPE)))
    neighbours = [np.vstack([codes, np.array([c])]) for c in cells]
    neighbours += [np.delete(codes, i, axis=0) for i in range(0, len(codes), 7)]
    for other in neighbours:
        o = (_first_step_scores(monkeypatch, _tables(other), plan, margins)[0]
             if score_of is None else score_of(_tables(other)))
        q = permute_and_flip_probabilities(o, epsilon=eps, sensitivity=sens)
        worst = max(worst, float(np.max(np.abs(np.log(p) - np.log(q)))))
    return worst, eps


def test_margins_step_is_epsilon_step_dp_and_indif_at_its_sensitivity_is_caught(monkeypatch):
    rng = np.random.default_rng(4)
    n = 60
    a = rng.integers(0, 2, n)
    codes = np.stack([a, np.where(rng.random(n) < 0.8, a, 1 - a), rng.integers(0, 3, n)], axis=1)
    plan = plan_forest(2000, 20.0, SHAPE)  # ε_step large enough that a wrong Δ shows
    assert plan.score == "margins" and plan.steps >= 1 and plan.max_pair_cells >= 6
    margins = {0: np.array([0.45, 0.55]), 1: np.array([0.5, 0.5]), 2: np.array([0.3, 0.3, 0.4])}
    worst, eps = _worst_ratio(monkeypatch, plan, margins, codes)
    assert worst <= eps + 1e-9, (worst, eps)
    assert worst > 0.3 * eps  # the audit sees the data at all

    def indif_scores(tables):  # broken: InDif scored at the margins' Δ = m
        pairs = sorted(tables)
        return np.array([privbayes_sizing.indif_score(tables[p])
                         - math.prod(SHAPE[c] for c in p) * plan.pair_scale for p in pairs] + [0.0])

    broken, _ = _worst_ratio(monkeypatch, plan, margins, codes, score_of=indif_scores)
    assert broken > eps, (broken, eps)
