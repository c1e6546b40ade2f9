"""PrivBayes' budget-aware model size (issue 18): a pure function of (n̂, ε, declared shape)."""

import dataclasses
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


CENSUS_KDD_SHAPE = (20, 9, 52, 47, 17, 9, 3, 7, 24, 15, 5, 10, 2, 3, 6, 8, 10, 8, 9, 6, 6, 51, 38,
                    8, 10, 9, 10, 3, 4, 7, 5, 43, 43, 43, 5, 3, 3, 3, 7, 2, 2)


def test_wide_tables_measure_more_refinement_pairs_when_public_rows_allow():
    from beamsynth.transforms.privbayes_sizing import (
        REFINE_NOISE_MASS,
        refine_pairs_for_rows,
        refine_rounds_for_pairs,
    )

    eps = PureDP(epsilon=1.0)
    n = 199_523  # census_kdd's train split: n̂·ε_meas/groups² = 199,523·0.2/25 = 1,596
    plan = plan_privbayes(CENSUS_KDD_SHAPE, eps, sizing="auto", rows=n)
    # ⌊√(0.9·1,596)⌋ = 37 pairs in ⌈37/5⌉ = 8 rounds (before: min(15, ε_t ≥ 0.01 → 20) = 15 in 3)
    assert (plan.refine.pairs, plan.refine.rounds) == (37, 8)
    assert refine_pairs_for_rows(n, 0.2, CENSUS_KDD_SHAPE, groups=5) == 37
    # the bound it keeps: P²·groups²·m/ε_meas (summed expected L1 noise) ≤ κ·n̂ < (P+1)²·...
    assert 37 ** 2 * 25 / 0.2 <= REFINE_NOISE_MASS * n < 38 ** 2 * 25 / 0.2
    # same refinement budget (1/5 selects, 4/5 measures), split over more picks and tables;
    # the spends still add up to ε
    assert plan.refine.selection_budget.epsilon == pytest.approx(0.05)
    assert plan.refine.measure_budget.epsilon == pytest.approx(0.2)
    assert plan.refine.table_epsilon == pytest.approx(0.2 / 37)
    acc = PrivacyAccountant(total=eps)
    spend_privbayes(acc, plan)
    assert math.isclose(acc.spent_epsilon, 1.0, rel_tol=1e-9)
    assert plan.details()["sizing"]["refine_pairs_for_rows"] == 37
    # capped at d (41 at ε = 2), monotone in n̂, nothing for one column
    assert plan_privbayes(CENSUS_KDD_SHAPE, PureDP(epsilon=2.0), sizing="auto",
                          rows=n).refine.pairs == 41
    got = [refine_pairs_for_rows(r, 0.2, CENSUS_KDD_SHAPE, groups=5) for r in (0, 10**3, 10**5, 10**7)]
    assert got == sorted(got) and got[0] == 0 and got[-1] == 41
    assert refine_pairs_for_rows(10**7, 0.2, (5,), groups=5) == 0
    assert [refine_rounds_for_pairs(p, 3) for p in (0, 3, 10, 15, 16, 41)] == [0, 3, 3, 3, 4, 9]
    # the rule only ever raises the default: Adult keeps 10 / 15 / 15 pairs in 3 rounds, and
    # without public rows, with sizing off or with the refinement off nothing changes
    for e, want in ((0.5, (10, 3)), (1.0, (15, 3)), (2.0, (15, 3))):
        adult = plan_privbayes(ADULT_SHAPE, PureDP(epsilon=e), sizing="auto", rows=32_561)
        assert (adult.refine.pairs, adult.refine.rounds) == want
    assert plan_privbayes(CENSUS_KDD_SHAPE, eps, sizing="auto").refine.pairs == 15
    assert plan_privbayes(CENSUS_KDD_SHAPE, eps, sizing="off", rows=n).refine.pairs == 15
    assert plan_privbayes(CENSUS_KDD_SHAPE, eps, sizing="auto", rows=n, refine_pairs=0).refine is None


def test_refinement_size_follows_the_dp_count_at_run_time():
    """Without public rows the plan keeps the requested 15 pairs and the measurement step applies
    refine_size to the DP count n̂ (post-processing), with the refinement's ε fixed at build time."""
    from beamsynth.transforms.privbayes_sizing import refine_size

    eps = PureDP(epsilon=1.0)
    plan = plan_privbayes(CENSUS_KDD_SHAPE, eps, sizing="auto")
    assert (plan.refine.pairs, plan.refine.rounds) == (15, 3)
    run = plan.sizing.refine_plan(199_523, plan.refine)  # n̂ of census_kdd's train split
    assert (run.pairs, run.rounds) == (37, 8)
    assert plan.sizing.refine_plan_for(plan.refine, 37) == run  # what the manifest reports
    # same ε, split over more picks and tables: P·(ε/P) = ε by sequential composition
    assert run.selection_budget == plan.refine.selection_budget
    assert run.measure_budget == plan.refine.measure_budget
    assert run.pick_epsilon * run.pairs == pytest.approx(plan.refine.selection_budget.epsilon)
    assert run.table_epsilon * run.pairs == pytest.approx(plan.refine.measure_budget.epsilon)
    # the same rule as with public rows
    pub = plan_privbayes(CENSUS_KDD_SHAPE, eps, sizing="auto", rows=199_523).refine
    assert (pub.pairs, pub.rounds) == (run.pairs, run.rounds)
    assert plan.sizing.refine_plan(1_000, plan.refine) is plan.refine  # small n̂: as planned
    acc = PrivacyAccountant(total=eps)
    spend_privbayes(acc, plan)
    assert math.isclose(acc.spent_epsilon, 1.0, rel_tol=1e-9)
    notes = [s.details.get("pairs_note") for s in acc.spends if s.step.startswith("privbayes.refine")]
    assert len(notes) == 2 and all(n and "DP count" in n for n in notes)
    assert plan.details()["sizing"]["refine_pairs_source"].startswith("the DP count")
    # Adult's shape: the plan the DP count gets is the planned one at every ε, n̂ around 32k
    # and the bundled 48,842 (the rule only raises pairs above the requested 15; d = 15)
    for e in (0.1, 0.25, 0.3, 0.5, 1.0, 2.0, 4.0, 8.0):
        adult = plan_privbayes(ADULT_SHAPE, PureDP(epsilon=e), sizing="auto")
        for n_hat in (30_000, 32_561, 35_000, 48_842):
            assert adult.sizing.refine_plan(n_hat, adult.refine) == adult.refine, (e, n_hat)
    # and with public rows Adult keeps the floor-capped count (not raised above it at small ε;
    # at ε 0.25 / 0.3 the network is below NETWORK_FOREST_THETA and the forest runs: H49)
    assert [plan_privbayes(ADULT_SHAPE, PureDP(epsilon=e), sizing="auto", rows=32_561).refine.pairs
            for e in (0.5, 1.0)] == [10, 15]
    assert refine_size(32_561, 0.05, ADULT_SHAPE, requested=15, planned=5, rounds=3,
                       countable=105, groups=5) == (5, 3)
    assert refine_size(199_523, 0.2, CENSUS_KDD_SHAPE, requested=15, planned=15, rounds=3,
                       countable=820, groups=5) == (37, 8)


def test_measurement_with_dp_count_measures_the_chosen_number_of_pairs():
    shape = (2,) * 20  # d = 20: at n̂ = 60,000, ε = 1: ⌊√(0.9·60,000·0.196/25)⌋ = 20 > 15 pairs
    plan = plan_privbayes(shape, PureDP(epsilon=1.0), sizing="auto")
    assert plan.refine.pairs == 15 and plan.sizing.count_budget is not None
    # a 20,000-row pool (the floor) instead of 200,000: the pool is post-processing, sampled
    # from released tables; the number of tables, their budgets and the sizing do not read it
    plan = dataclasses.replace(plan, refine=dataclasses.replace(plan.refine, pool_rows=20_000))
    rng = np.random.default_rng(5)
    base = rng.integers(0, 2, size=(60_000, 1))
    codes = np.where(rng.random((60_000, 20)) < 0.8, base, 1 - base)  # correlated columns
    m = _measure(codes, shape, plan)
    assert len(m.refinement.tables) == 20  # the old code measured the planned 15
    assert m.sizing["degree"] == 1 and abs(m.sizing["rows_hat"] - 60_000) < 2_000
    assert (m.sizing["refine_pairs"], m.sizing["refine_rounds"]) == (20, 4)
    # each table at ε_meas/20 (its budget), together the planned ε_meas
    assert sum(t.budget.epsilon for t in m.refinement.tables) == pytest.approx(
        plan.refine.measure_budget.epsilon)
