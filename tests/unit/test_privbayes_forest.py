"""PrivBayes' small-input model (issue 18): every column's 1-way table plus a private forest of
affordable 2-way tables, sized from (n̂, ε, declared shape) only."""

import itertools
import math

import numpy as np
import pytest

from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    FOREST_ONE_WAY_FRACTION,
    FOREST_SCORE,
    FOREST_STRUCTURE_FRACTION,
    FOREST_THETA,
    NETWORK_THETA,
    PrivBayesModel,
    candidate_families,
    choose_forest,
    fit_privbayes,
    measure_privbayes,
    network_usefulness,
    plan_forest,
    plan_privbayes,
    spend_privbayes,
)

ADULT_SHAPE = (14, 9, 14, 16, 16, 7, 15, 6, 5, 2, 12, 10, 14, 42, 2)
PUMS_SHAPE = (13, 2, 17, 7, 11, 2)  # benchmarks/schemas/pums_small.yaml


def test_plan_forest_shares_and_the_affordable_pair_rule():
    # pairs of (2, 2, 3, 10): 4, 6, 6 cells among columns 0-2, 20, 20, 30 with column 3
    shape = (2, 2, 3, 10)
    eps_2 = 1.0 - FOREST_ONE_WAY_FRACTION - FOREST_STRUCTURE_FRACTION

    def rows_for(cells, r):  # rows at which r edges sharing ε_2 make `cells` θ-useful
        return int(math.ceil(cells * r * FOREST_THETA / eps_2)) + 1

    # two edges need pairs of 6 cells (3 columns); a third edge needs a 20-cell pair
    p = plan_forest(rows_for(6, 2), 1.0, shape)
    assert p.steps == 2 and p.max_pair_cells == 6
    assert plan_forest(rows_for(6, 2) - 2, 1.0, shape).steps == 1
    assert plan_forest(rows_for(20, 3), 1.0, shape).steps == 3
    assert plan_forest(rows_for(4, 1) - 2, 1.0, shape).steps == 0
    assert p.structure_budget.epsilon + p.one_way_budget.epsilon + p.pair_budget.epsilon == (
        pytest.approx(1.0))
    # the default score (H102) releases the 1-way tables first and scores against them with
    # sensitivity m: a quarter of the structure share resolves as InDif's did, the rest is 1-way
    assert p.score == FOREST_SCORE == "margins" and p.score_sensitivity == 1.0
    assert p.one_way_budget.epsilon == pytest.approx(
        FOREST_ONE_WAY_FRACTION + 0.75 * FOREST_STRUCTURE_FRACTION)
    assert p.step_epsilon == pytest.approx(FOREST_STRUCTURE_FRACTION / 4 / 2)
    old = plan_forest(rows_for(6, 2), 1.0, shape, score="indif")  # the release before H102
    assert (old.steps, old.max_pair_cells, old.pair_budget) == (p.steps, p.max_pair_cells,
                                                                p.pair_budget)
    assert old.one_way_budget.epsilon == pytest.approx(FOREST_ONE_WAY_FRACTION)
    assert old.step_epsilon == pytest.approx(FOREST_STRUCTURE_FRACTION / 2)
    assert old.score_sensitivity == 4.0
    assert old.step_epsilon / old.score_sensitivity == pytest.approx(
        p.step_epsilon / p.score_sensitivity)  # the same resolution
    with pytest.raises(ValueError, match=r"score \('gini'\) must be one of"):
        plan_forest(1000, 1.0, shape, score="gini")
    # more n·ε never gives fewer edges; huge inputs get a spanning tree, tiny ones none
    steps = [plan_forest(n, 1.0, ADULT_SHAPE).steps for n in (0, 300, 1000, 5000, 30000, 10**7)]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == len(ADULT_SHAPE) - 1
    none = plan_forest(10, 1.0, ADULT_SHAPE)
    assert none.steps == 0 and none.one_way_budget.epsilon == pytest.approx(1.0)  # independent
    # m records per unit: as m times fewer rows
    two = plan_forest(4000, 1.0, ADULT_SHAPE, max_contributions=2)
    one = plan_forest(2000, 1.0, ADULT_SHAPE)
    assert (two.steps, two.max_pair_cells) == (one.steps, one.max_pair_cells)


def _tables(codes, shape, degree=1):
    fams = candidate_families(len(shape), degree)
    counts = [t.reshape([shape[c] for c in f]) for t, f in zip(count_marginals(codes, fams, shape), fams)]
    return fams, counts, {tuple(f): c for f, c in zip(fams, counts)}


def test_choose_forest_is_a_forest_of_affordable_pairs_and_finds_strong_edges():
    rng = np.random.default_rng(0)
    n = 20000
    a = rng.integers(0, 2, n)
    b = np.where(rng.random(n) < 0.95, a, 1 - a)  # b copies a
    c = rng.integers(0, 3, n)
    d = np.where(rng.random(n) < 0.9, c, rng.integers(0, 3, n))  # d copies c
    e = rng.integers(0, 40, n)  # large: 40×2 = 80 cells
    codes = np.stack([a, b, c, d, e], axis=1)
    shape = (2, 2, 3, 3, 40)
    _, _, tables = _tables(codes, shape)
    # the default score against released margins (here the exact ones), and InDif (before H102)
    margins = {c: np.bincount(codes[:, c], minlength=shape[c]) / n for c in range(5)}
    for score, seed in itertools.product(("margins", "indif"), range(5)):
        plan = plan_forest(n, 50.0, shape, score=score)
        assert plan.steps == 4
        small = plan.__class__(**{**plan.__dict__, "max_pair_cells": 9})
        order = choose_forest(tables, shape, plan=small, rs=RandomSource(seed=seed),
                              margins=margins if score == "margins" else None)
        assert sorted(x for x, _ in order) == list(range(5))
        placed = set()
        for x, ps in order:
            assert len(ps) <= 1 and set(ps) <= placed
            placed.add(x)
        edges = {tuple(sorted((x, *ps))) for x, ps in order if ps}
        assert all(shape[i] * shape[j] <= 9 for i, j in edges)  # column 4 joins nothing
        assert {(0, 1), (2, 3)} <= edges  # at ε = 50 the two real dependences are found


def test_forest_is_chosen_for_small_public_inputs_and_spends_exactly_epsilon():
    plan = plan_privbayes(ADULT_SHAPE, PureDP(epsilon=1.0), sizing="auto", rows=1000)
    assert plan.forest is not None and plan.forest.steps >= 1 and plan.refine is None
    assert plan.degree == 1  # the pair counts are the candidates
    acc = PrivacyAccountant(total=PureDP(epsilon=1.0))
    spend_privbayes(acc, plan)
    # the 1-way tables are released before the edges are chosen (H102): spends in that order
    assert [s.step for s in acc.spends] == ["privbayes.one_way", "privbayes.structure",
                                           "privbayes.marginals"]
    assert acc.spends[1].details["sensitivity"] == 1.0
    assert acc.spends[1].details["score"] == "margins"
    assert math.isclose(acc.spent_epsilon, 1.0, rel_tol=1e-9)
    assert plan.details()["forest"]["steps"] == plan.forest.steps
    # a large input keeps the network; a tiny one with no affordable pair is independent
    assert plan_privbayes(ADULT_SHAPE, PureDP(epsilon=1.0), sizing="auto", rows=30000).forest is None
    tiny = plan_privbayes(ADULT_SHAPE, PureDP(epsilon=1.0), sizing="auto", rows=20)
    assert tiny.forest is None and tiny.degree == 0
    assert tiny.marginal_budget.epsilon == pytest.approx(1.0)


def test_forest_measurement_releases_every_one_way_table_and_the_chosen_edges():
    rng = np.random.default_rng(2)
    n = 1000  # n·ε = 500: no θ-useful network (g = 7.7), one affordable pair (0, 1)
    x = rng.integers(0, 2, n)
    codes = np.stack([x, np.where(rng.random(n) < 0.9, x, 1 - x), rng.integers(0, 30, n),
                      rng.integers(0, 30, n)], axis=1)
    shape = (2, 2, 30, 30)
    plan = plan_privbayes(shape, PureDP(epsilon=0.5), sizing="auto", rows=n, refine_pairs=0)
    assert plan.forest is not None and plan.forest.steps == 1
    fams, counts, _ = _tables(codes, shape, plan.degree)
    m = measure_privbayes(counts, fams, shape=shape, names=["a", "b", "c", "d"], plan=plan,
                          rs=RandomSource(seed=1))
    one_way = [t for t in m.marginals if len(t.columns) == 1]
    pairs = [t for t in m.marginals if len(t.columns) == 2]
    assert sorted(t.columns for t in one_way) == [(0,), (1,), (2,), (3,)]
    assert len(pairs) == sum(1 for _, ps in m.structure if ps) <= plan.forest.steps
    spent = sum(t.budget.epsilon for t in m.marginals)
    expected = plan.forest.one_way_budget.epsilon + (plan.forest.pair_budget.epsilon if pairs else 0)
    assert spent == pytest.approx(expected if pairs else 0.5 - plan.forest.structure_budget.epsilon)
    model = fit_privbayes(m, shape)
    assert isinstance(model, PrivBayesModel)
    assert model.sample_codes(100, RandomSource(seed=2)).shape == (100, 4)


def test_run_time_fallback_uses_the_forest_when_a_pair_is_affordable():
    shape = (2, 2, 30, 30)
    plan = plan_privbayes(shape, PureDP(epsilon=0.5), sizing="auto", refine_pairs=0)
    assert plan.forest is None and plan.degree >= 1  # decided in the measurement step
    rng = np.random.default_rng(5)
    n = 750  # n̂ = 750 ± ~100: no θ-useful network (needs n̂ ≥ 60·4·θ/ε = 1200), one affordable
    # pair, (0, 1) (needs n̂ ≥ 4·θ/(0.1·ε) ≈ 330)
    x = rng.integers(0, 2, n)
    codes = np.stack([x, x, rng.integers(0, 30, n), rng.integers(0, 30, n)], axis=1)
    fams, counts, _ = _tables(codes, shape, plan.degree)
    m = measure_privbayes(counts, fams, shape=shape, names=list("abcd"), plan=plan,
                          rs=RandomSource(seed=4))
    model_eps = 0.5 - plan.sizing.count_budget.epsilon
    assert m.sizing["degree"] == 0 and abs(m.sizing["rows_hat"] - n) < 400
    assert m.sizing["forest_steps"] == plan_forest(m.sizing["rows_hat"], model_eps, shape).steps == 1
    assert sorted(t.columns for t in m.marginals if len(t.columns) == 1) == [(0,), (1,), (2,), (3,)]
    edges = [t.columns for t in m.marginals if len(t.columns) == 2]
    assert m.sizing["forest_edges"] == len(edges) <= 1 and all(set(e) == {0, 1} for e in edges)
    # the whole planned ε: structure + 1-way + pair tables (+ the count's share outside)
    spent = sum(t.budget.epsilon for t in m.marginals)
    forest = plan_forest(m.sizing["rows_hat"], model_eps, shape)
    assert spent == pytest.approx(model_eps - forest.structure_budget.epsilon)
    assert forest.structure_budget.epsilon == pytest.approx(model_eps * FOREST_STRUCTURE_FRACTION / 4)
    assert fit_privbayes(m, shape).sample_codes(10, RandomSource(seed=1)).shape == (10, 4)


def test_network_kept_only_from_network_theta():
    # PUMS 1k at ε = 1: k = 1 usefulness 4.2 < NETWORK_THETA → the forest; at ε = 3 (12.6) the
    # network (at ε = 2, 8.4 < NETWORK_FOREST_THETA, the resolving forest: H49's band)
    u1 = network_usefulness(1000, 1.0, PUMS_SHAPE, 1)
    assert 4.0 < u1 < NETWORK_THETA < 2 * u1
    at1 = plan_privbayes(PUMS_SHAPE, PureDP(epsilon=1.0), sizing="auto", rows=1000)
    at2 = plan_privbayes(PUMS_SHAPE, PureDP(epsilon=3.0), sizing="auto", rows=1000)
    assert at1.forest is not None and at1.details()["sizing"]["chosen_degree"] == 0
    assert at2.forest is None and at2.degree == 1 and at2.sizing.theta == NETWORK_THETA
