"""PrivBayes' budget-aware model size (issue 18): a pure function of (n̂, ε, declared shape)."""

import math

import numpy as np
import pytest

from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    SIZE_COUNT_FRACTION,
    SIZING_THETA,
    candidate_families,
    choose_network_degree,
    fit_privbayes,
    measure_privbayes,
    network_usefulness,
    plan_privbayes,
    spend_privbayes,
)

ADULT_SHAPE = (14, 9, 14, 16, 16, 7, 15, 6, 5, 2, 12, 10, 14, 42, 2)


def test_usefulness_is_signal_per_cell_over_noise_scale():
    # shape (4, 4, 4): g = 4, d = 3; k = 1 tables have 16 cells, scale m·d/ε = 3/ε
    assert network_usefulness(4800, 1.0, (4, 4, 4), 1) == pytest.approx(4800 / 16 / 3)
    assert network_usefulness(4800, 0.5, (4, 4, 4), 2, max_contributions=2) == pytest.approx(
        4800 / 64 / (2 * 3 / 0.5))
    # geometric mean of the declared sizes; a huge column counts with at most 1,000 cells
    assert network_usefulness(1000, 1.0, (2, 8), 1) == pytest.approx(1000 / 16 / 2)
    assert network_usefulness(1000, 1.0, (10**6, 10**6), 0) == pytest.approx(1000 / 1000 / 2)
    assert network_usefulness(-5, 1.0, (4, 4), 1) == 0.0


def test_degree_follows_n_epsilon_and_falls_back_to_independent():
    # threshold: n·ε/(d·g²) >= θ for k = 1 on (4, 4, 4): n·ε >= 48·θ
    edge = 48 * SIZING_THETA
    assert choose_network_degree(edge * 1.001, 1.0, (4, 4, 4), max_degree=2) == 1
    assert choose_network_degree(edge * 0.999, 1.0, (4, 4, 4), max_degree=2) == 0
    assert choose_network_degree(edge * 4.001, 1.0, (4, 4, 4), max_degree=2) == 2
    assert choose_network_degree(edge * 4.001, 1.0, (4, 4, 4), max_degree=1) == 1
    assert choose_network_degree(10**9, 1.0, (5,), max_degree=2) == 0  # nothing to condition on
    # only n·ε matters, and more of it never gives a smaller model
    assert choose_network_degree(edge * 2, 0.5, (4, 4, 4), max_degree=2) == 1
    degrees = [choose_network_degree(n, 1.0, ADULT_SHAPE, max_degree=2)
               for n in (0, 500, 1000, 3000, 5000, 30000, 10**6)]
    assert degrees == sorted(degrees) and degrees[0] == 0 and degrees[-1] == 2
    # Adult (15 columns): 1,000 rows fall back at every ε ≤ 2; 30k rows keep the network at 0.5
    assert all(choose_network_degree(1000, e, ADULT_SHAPE, max_degree=1) == 0 for e in (0.5, 1, 2))
    assert choose_network_degree(30000, 0.5, ADULT_SHAPE, max_degree=1) == 1


def test_plan_with_public_rows_decides_at_build_time():
    eps = PureDP(epsilon=1.0)
    # no θ-useful network at 1,000 rows: 1-way tables + a forest of affordable pairs
    # (tests/unit/test_privbayes_forest.py); at 20 rows no pair is affordable: independent
    small = plan_privbayes(ADULT_SHAPE, eps, sizing="auto", rows=1000)
    assert small.forest is not None and small.refine is None
    d = small.details()["sizing"]
    assert d["chosen_degree"] == 0 and d["rows"] == 1000 and "forest" in d["chosen"]
    assert "count_epsilon" not in d
    tiny = plan_privbayes(ADULT_SHAPE, eps, sizing="auto", rows=20)
    assert tiny.degree == 0 and tiny.structure_budget is None and tiny.refine is None
    assert tiny.marginal_budget.epsilon == pytest.approx(1.0)  # the whole ε on the 1-way tables
    big = plan_privbayes(ADULT_SHAPE, eps, sizing="auto", rows=30000)
    off = plan_privbayes(ADULT_SHAPE, eps)
    assert big.degree == off.degree == 1 and big.refine == off.refine
    assert big.marginal_budget == off.marginal_budget and big.structure_budget == off.structure_budget
    assert off.sizing is None and off.details()["sizing"] is None


def test_plan_without_rows_sets_aside_the_count_and_spends_exactly_epsilon():
    plan = plan_privbayes(ADULT_SHAPE, PureDP(epsilon=2.0), sizing="auto")
    assert plan.sizing.count_budget.epsilon == pytest.approx(2.0 * SIZE_COUNT_FRACTION)
    assert plan.degree == 1 and plan.refine is not None  # the planned network, sized at run time
    acc = PrivacyAccountant(total=PureDP(epsilon=2.0))
    spend_privbayes(acc, plan)
    assert math.isclose(acc.spent_epsilon, 2.0, rel_tol=1e-9)
    assert [s.step for s in acc.spends][0] == "privbayes.size_count"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sizing": "maybe"}, r"sizing \('maybe'\) must be one of \('auto', 'off'\)"),
    ({"rows": -1}, r"rows \(-1\) must be None or an int >= 0"),
    ({"rows": True}, r"rows \(True\) must be None or an int >= 0"),
])
def test_sizing_parameters_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_privbayes((3, 4), PureDP(epsilon=1.0), **kwargs)


def _measure(codes, shape, plan, seed=3):
    fams = candidate_families(len(shape), plan.degree, shape=shape,
                              max_family_cells=plan.max_family_cells)
    counts = [t.reshape([shape[c] for c in f]) for t, f in zip(count_marginals(codes, fams, shape), fams)]
    return measure_privbayes(counts, fams, shape=shape, names=[f"c{i}" for i in range(len(shape))],
                             plan=plan, rs=RandomSource(seed=seed))


def test_run_time_fallback_releases_one_way_tables_with_the_whole_network_epsilon():
    shape = (4, 4, 4)
    plan = plan_privbayes(shape, PureDP(epsilon=1.0), sizing="auto", refine_pairs=0)
    assert plan.degree == 2 and plan.structure_budget is not None
    codes = np.random.default_rng(0).integers(0, 4, size=(30, 3))
    m = _measure(codes, shape, plan)
    assert m.sizing["degree"] == 0 and abs(m.sizing["rows_hat"] - 30) < 2000
    assert all(not ps for _, ps in m.structure) and [t.columns for t in m.marginals] == [(0,), (1,), (2,)]
    # nothing wasted: the 1-way tables get the structure share too (ε − the count's share)
    spent = sum(t.budget.epsilon for t in m.marginals)
    assert spent == pytest.approx(1.0 - SIZE_COUNT_FRACTION)
    model = fit_privbayes(m, shape)
    assert model.sample_codes(5, RandomSource(seed=1)).shape == (5, 3)


def test_run_time_sizing_keeps_the_network_on_large_inputs():
    shape = (2, 2, 2)  # k = 1 needs n·ε >= 3·4·θ = 30: 20,000 rows are far above
    plan = plan_privbayes(shape, PureDP(epsilon=1.0), sizing="auto", refine_pairs=0)
    codes = np.random.default_rng(1).integers(0, 2, size=(20000, 3))
    m = _measure(codes, shape, plan)
    assert m.sizing["degree"] == 2 and abs(m.sizing["rows_hat"] - 20000) < 2000
    assert any(ps for _, ps in m.structure)
