"""A resolving forest replaces a barely useful k = 1 network on small inputs (issue 18, H49).

Under pure ε a k = 1 network's 1-way estimates come from its 2-way family tables, so on small
inputs its TVD1 was above independent marginals' (ACS 6,107 rows ε = 2, COMPAS 5,050 ε = 0.5,
Adult 5,000 ε = 2). Below ``NETWORK_FOREST_THETA`` (9 since H53) the plan now fits the
small-input forest wherever that forest resolves a pair, Laplace and zCDP plans alike, with
public rows at build time and from the DP count at run time (H53); the decision reads public
values only."""

import math

import numpy as np
import pytest

from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    candidate_families,
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
    spend_privbayes,
)
from beamsynth.transforms.privbayes_sizing import (
    BAND_FOREST_ONE_WAY_FRACTION,
    FOREST_ONE_WAY_FRACTION,
    NETWORK_FOREST_THETA,
    NETWORK_THETA,
    band_forest,
    network_usefulness,
    plan_forest,
)

ADULT_SHAPE = (14, 9, 14, 16, 16, 7, 15, 6, 5, 2, 12, 10, 14, 42, 2)
COMPAS_SHAPE = (2, 12, 3, 6, 5, 5, 5, 11, 3, 9, 10, 4, 10, 4, 2)  # benchmarks/schemas/compas.yaml
ACS_SHAPE = (31, 20, 2, 7, 5, 9, 7, 8, 3, 3, 11, 20, 20, 13, 18, 11, 28, 7, 3, 3, 2, 2, 11, 12)
NLTCS_SHAPE = (2,) * 16


@pytest.mark.parametrize("shape, rows, epsilon", [
    (ACS_SHAPE, 6107, 2.0), (COMPAS_SHAPE, 5050, 0.5), (ADULT_SHAPE, 5000, 2.0)])
def test_band_cells_fit_the_forest(shape, rows, epsilon):
    u = network_usefulness(rows, epsilon, shape, 1)
    assert NETWORK_THETA <= u < NETWORK_FOREST_THETA
    plan = plan_privbayes(shape, PureDP(epsilon=epsilon), sizing="auto", rows=rows)
    assert plan.forest is not None and plan.forest.steps >= 1 and plan.refine is None
    assert plan.sizing.details()["chosen_degree"] == 0
    # the switch off: the network as before
    assert plan.sizing.__class__(**{**plan.sizing.__dict__, "forest_theta": None}).degree(rows) == 1
    acc = PrivacyAccountant(total=PureDP(epsilon=epsilon))
    spend_privbayes(acc, plan)
    assert [s.step for s in acc.spends] == ["privbayes.one_way", "privbayes.structure",
                                            "privbayes.marginals"]  # 1-way tables first (H102)
    assert math.isclose(acc.spent_epsilon, epsilon, rel_tol=1e-9)


@pytest.mark.parametrize("shape, rows, epsilon", [
    (NLTCS_SHAPE, 1000, 0.5),  # in the band, but the forest does not resolve: keep the network
    (ADULT_SHAPE, 32561, 0.5), (ADULT_SHAPE, 30000, 1.0), (COMPAS_SHAPE, 5050, 1.0)])
def test_the_network_is_kept_elsewhere(shape, rows, epsilon):
    plan = plan_privbayes(shape, PureDP(epsilon=epsilon), sizing="auto", rows=rows)
    assert plan.forest is None and plan.degree == 1 and plan.refine is not None
    if network_usefulness(rows, epsilon, shape, 1) < NETWORK_FOREST_THETA:
        assert plan_forest(rows, epsilon, shape).steps == 0
        assert band_forest(rows, epsilon, shape) is None


def test_acs_national_at_half_epsilon_keeps_its_network():
    # H53: NETWORK_FOREST_THETA 10 -> 9. ACS national2019 (27,253 rows) at ε = 0.5 is 9.3-9.5
    # useful: at 10 the band took it (TVD2 0.084 -> 0.104, independent 0.107); at 9 it keeps k = 1
    assert NETWORK_FOREST_THETA == 9.0
    rows, eps = 27253, 0.5
    assert 9.0 <= network_usefulness(rows * 0.98, eps, ACS_SHAPE, 1) < 9.5
    assert band_forest(rows * 0.98, eps, ACS_SHAPE) is None
    assert band_forest(rows * 0.98, eps, ACS_SHAPE, forest_theta=10.0) is not None  # the old band
    plan = plan_privbayes(ACS_SHAPE, PureDP(epsilon=eps), sizing="auto", rows=rows)
    assert plan.forest is None and plan.degree == 1 and plan.refine is not None
    dp = plan_privbayes(ACS_SHAPE, PureDP(epsilon=eps), sizing="auto")  # DP count at run time
    assert dp.sizing.degree(rows * 0.98) == 1 and dp.sizing.degree(rows) == 1
    at_ten = dp.sizing.__class__(**{**dp.sizing.__dict__, "forest_theta": 10.0})
    assert at_ten.degree(rows * 0.98) == 0  # what this test pins against


@pytest.mark.parametrize("shape, rows, epsilon, small", [
    (COMPAS_SHAPE, 5050, 0.5, True), (ADULT_SHAPE, 5000, 2.0, True), (ACS_SHAPE, 6107, 2.0, True),
    (ADULT_SHAPE, 1000, 1.0, True),  # below NETWORK_THETA: the small-input forest either way
    (NLTCS_SHAPE, 1000, 0.5, False),  # in the band, no forest resolves: the network either way
    (ACS_SHAPE, 27253, 0.5, False), (ADULT_SHAPE, 32561, 1.0, False), (COMPAS_SHAPE, 5050, 1.0, False)])
def test_zcdp_plans_choose_the_same_model_at_build_and_run_time(shape, rows, epsilon, small):
    # H53: a Gaussian plan with public rows inside the band was the band's pure forest at build
    # time, while the same size from the DP count kept the Gaussian network at run time
    budget = ApproxDP(epsilon=epsilon, delta=1e-9)
    public = gaussian_plan(plan_privbayes(shape, budget, sizing="auto", rows=rows), budget)
    counted = gaussian_plan(plan_privbayes(shape, budget, sizing="auto"), budget)
    assert counted.zcdp is not None and counted.sizing.refine_noise == "gaussian"
    built_small = public.forest is not None
    assert built_small == small and (public.zcdp is None) == small  # the forest is pure
    assert (counted.sizing.degree(rows) == 0) == small  # the run-time decision, DP count = rows
    if small:  # the same forest rule, with the model ε the run gets (ε − ε_c)
        model_eps = counted.zcdp.budget.epsilon
        ran = counted.sizing.small_forest(rows, model_eps)
        assert ran.steps > 0
        assert ran.one_way_budget.epsilon / model_eps == pytest.approx(
            public.forest.one_way_budget.epsilon / epsilon)
    if network_usefulness(rows, epsilon, shape, 1) < NETWORK_THETA:
        return
    laplace = plan_privbayes(shape, PureDP(epsilon=epsilon), sizing="auto")
    assert laplace.sizing.degree(rows) == counted.sizing.degree(rows)  # Laplace and zCDP agree


def test_the_band_forest_gets_the_models_epsilon_after_the_size_count():
    # the run-time fallback fits the forest with ε − ε_c; the band's usefulness test uses ε
    rows, shape, eps = 5000, ADULT_SHAPE, 2.0
    for count in (0.0, 0.04, 0.3):
        forest = band_forest(rows, eps, shape, count_epsilon=count)
        parts = (forest.one_way_budget.epsilon + forest.structure_budget.epsilon
                 + forest.pair_budget.epsilon)
        assert parts == pytest.approx(eps - count)
    # usefulness from the whole ε: at 4.4 / 10.2 of it outside the band whatever the count
    u1 = network_usefulness(rows, 1.0, shape, 1)
    assert band_forest(rows, NETWORK_FOREST_THETA / u1 * 1.01, shape, count_epsilon=0.5) is None


@pytest.mark.parametrize("shape, rows, epsilon, one_way", [
    (ADULT_SHAPE, 5000, 2.0, BAND_FOREST_ONE_WAY_FRACTION),  # the 0.6 forest resolves
    (COMPAS_SHAPE, 5050, 0.5, FOREST_ONE_WAY_FRACTION),  # only the 0.8 forest resolves
])
def test_the_band_forest_prefers_more_edges_where_they_resolve(shape, rows, epsilon, one_way):
    forest = band_forest(rows, epsilon, shape)
    # the "margins" score (H102): a quarter of the 0.1 structure share, the rest on the 1-way tables
    assert forest.one_way_budget.epsilon == pytest.approx((one_way + 0.075) * epsilon)
    assert forest.structure_budget.epsilon == pytest.approx(0.025 * epsilon)
    parts = (forest.one_way_budget.epsilon + forest.structure_budget.epsilon
             + forest.pair_budget.epsilon)
    assert parts == pytest.approx(epsilon)
    plan = plan_privbayes(shape, PureDP(epsilon=epsilon), sizing="auto", rows=rows)
    assert plan.forest == forest  # the plan with public rows fits the same forest
    below = plan_privbayes(ADULT_SHAPE, PureDP(epsilon=1.0), sizing="auto", rows=5000)
    assert below.forest.one_way_budget.epsilon == pytest.approx(FOREST_ONE_WAY_FRACTION + 0.075)


def test_run_time_band_decision_fits_the_forest_with_the_whole_planned_epsilon():
    shape = COMPAS_SHAPE
    plan = plan_privbayes(shape, PureDP(epsilon=0.5), sizing="auto")  # no public rows
    assert plan.degree == 1 and plan.refine is not None  # decided in the measurement step
    rng = np.random.default_rng(5)
    # a strongly dependent pair (the first two columns copy one draw) so the forest has an edge
    base = rng.integers(0, 2, 5050)
    codes = np.stack([rng.integers(0, c, 5050) for c in shape], axis=1)
    codes[:, 0], codes[:, 14] = base, base
    fams = candidate_families(len(shape), plan.degree, shape=shape,
                              max_family_cells=plan.max_family_cells)
    counts = [t.reshape([shape[c] for c in f])
              for t, f in zip(count_marginals(codes, fams, shape), fams)]
    m = measure_privbayes(counts, fams, shape=shape, names=[f"c{i}" for i in range(len(shape))],
                          plan=plan, rs=RandomSource(seed=2))
    assert m.sizing["degree"] == 0 and m.sizing["forest_steps"] >= 1
    assert m.refinement is None and "forest_edges" in m.sizing
    model_eps = 0.5 - plan.sizing.count_budget.epsilon
    forest = plan.sizing.small_forest(m.sizing["rows_hat"], model_eps)
    assert forest == band_forest(m.sizing["rows_hat"], 0.5, shape, count_epsilon=0.01)
    structure = forest.structure_budget.epsilon
    released = sum(t.budget.epsilon for t in m.marginals)
    assert released + structure == pytest.approx(model_eps)
