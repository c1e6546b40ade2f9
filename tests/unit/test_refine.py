"""Unit tests for transforms/refine.py (Beam-free): coarsening, targets, raking, resampling,
planning and the select → measure → rake loop on small seeded data."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from beamsynth.transforms import refine
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.measure import NoisyMarginal
from beamsynth.transforms.noise import RandomSource, discrete_laplace_scale
from beamsynth.transforms.privbayes import (
    DEFAULT_DEGREE,
    DEFAULT_REFINED_DEGREE,
    PrivBayesMeasurement,
    PrivBayesModel,
    fit_privbayes,
    plan_privbayes,
    spend_privbayes,
)
from beamsynth.transforms.refine import (
    RakeTarget,
    RefinedModel,
    coarse_groups,
    coarse_table,
    measure_refinement,
    pair_group_counts,
    plan_refinement,
    rake_weights,
    systematic_resample,
    target_from_noisy,
)


# -- coarse_groups -----------------------------------------------------------------------------------
def _check_grouping(g: np.ndarray, k: int, groups: int) -> None:
    assert g.shape == (k,) and g.dtype == np.int64
    used = np.unique(g)
    assert used.tolist() == list(range(used.size))  # every group number 0..g-1 used
    assert used.size <= groups


def test_ordered_groups_are_contiguous_runs_of_equal_mass():
    g = coarse_groups(np.full(10, 7.0), 5, ordered=True)
    assert g.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    # a heavy cell swallows its quantile run: mid-points 1/32, 3/32, 5/32, 1/2, 27/32, ... → 0,0,0,2,3,3,3
    g = coarse_groups(np.array([1, 1, 1, 10, 1, 1, 1]), 4, ordered=True)
    assert g.tolist() == [0, 0, 0, 1, 2, 2, 2]
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(2, 40))
        groups = int(rng.integers(2, 9))
        p = rng.dirichlet(np.full(k, 0.7))
        g = coarse_groups(p * 1000, groups, ordered=True)
        _check_grouping(g, k, groups)
        if k <= groups:
            assert g.tolist() == list(range(k))
            continue
        assert np.all(np.diff(g) >= 0)  # contiguous runs in declared order
        mass = np.bincount(g, weights=p)
        # a group spans its 1/groups quantile band plus at most half a cell on each side
        assert mass.max() <= 1.0 / groups + p.max() + 1e-12


def test_unordered_groups_keep_the_heaviest_alone_and_pool_the_rest():
    g = coarse_groups(np.array([5, 1, 9, 3, 7, 2]), 3, ordered=False)
    assert g.tolist() == [2, 2, 0, 2, 1, 2]
    # ties broken by declared order
    assert coarse_groups(np.ones(4), 3, ordered=False).tolist() == [0, 1, 2, 2]
    rng = np.random.default_rng(1)
    for _ in range(100):
        k = int(rng.integers(7, 30))
        groups = int(rng.integers(2, 7))
        p = rng.permutation(np.arange(1, k + 1, dtype=float))  # distinct masses
        g = coarse_groups(p, groups, ordered=False)
        _check_grouping(g, k, groups)
        heavy = np.argsort(-p)[: groups - 1]
        assert [int(g[i]) for i in heavy] == list(range(groups - 1))
        rest = np.setdiff1d(np.arange(k), heavy)
        assert np.all(g[rest] == groups - 1)


def test_small_domains_are_unchanged_and_zero_mass_is_uniform():
    for ordered in (True, False):
        assert coarse_groups(np.array([0.0, 9.0, 1.0]), 5, ordered=ordered).tolist() == [0, 1, 2]
        assert coarse_groups(np.array([3.0, 1.0]), 2, ordered=ordered).tolist() == [0, 1]
    # all-zero (or all-negative noisy) mass: treated as uniform
    assert coarse_groups(np.zeros(10), 5, ordered=True).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert coarse_groups(np.zeros(6), 3, ordered=False).tolist() == [0, 1, 2, 2, 2, 2]
    assert coarse_groups(-np.ones(6), 3, ordered=False).tolist() == [0, 1, 2, 2, 2, 2]


def test_coarse_table_sums_cells_into_groups_exactly():
    t = np.arange(12, dtype=float).reshape(3, 4)
    ga, gb = np.array([0, 0, 1]), np.array([0, 1, 1, 0])
    got = coarse_table(t, ga, gb)
    want = np.zeros((2, 2))
    for i, j in itertools.product(range(3), range(4)):
        want[ga[i], gb[j]] += t[i, j]
    assert np.array_equal(got, want)
    assert got.sum() == t.sum()
    assert np.array_equal(coarse_table(t, np.arange(3), np.arange(4)), t)  # identity grouping


# -- target_from_noisy -------------------------------------------------------------------------------
def test_target_is_the_estimate_when_the_difference_is_within_noise():
    est = np.array([[30.0, 10.0], [20.0, 40.0]])
    for noisy in (est, est + np.array([[1, -1], [-1, 1]])):  # ‖N − B‖² = 0 or 4 ≤ cells·Var = 16
        got = target_from_noisy(noisy, est, variance=4.0, total=100.0)
        np.testing.assert_allclose(got, est / 100.0, atol=1e-9)


def test_target_moves_toward_a_real_difference_keeping_the_estimate_margins():
    est = np.full((2, 2), 25.0)
    noisy = np.array([[50.0, 0.0], [0.0, 50.0]])
    got = target_from_noisy(noisy, est, variance=1.0, total=100.0)
    # λ = 1 − 4·1/2500: almost all the way to the noisy table
    np.testing.assert_allclose(got, (est + (1 - 4 / 2500) * (noisy - est)) / 100.0, atol=1e-9)
    assert np.abs(got - noisy / 100).sum() < 0.01 < np.abs(est / 100 - noisy / 100).sum()


def test_target_is_a_distribution_with_the_estimate_margins():
    rng = np.random.default_rng(3)
    for _ in range(100):
        shape = tuple(int(s) for s in rng.integers(2, 6, 2))
        est = rng.uniform(50, 500, shape)
        noisy = np.round(est * rng.uniform(0.6, 1.4, shape) + rng.laplace(0, 5, shape))
        got = target_from_noisy(noisy, est, variance=50.0, total=float(noisy.sum()))
        assert np.all(got >= 0)
        assert got.sum() == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(got.sum(axis=1), est.sum(axis=1) / est.sum(), atol=1e-6)
        np.testing.assert_allclose(got.sum(axis=0), est.sum(axis=0) / est.sum(), atol=1e-6)
    # negative noisy cells: still a distribution
    got = target_from_noisy(np.array([[-5.0, 40.0], [60.0, -3.0]]), np.full((2, 2), 25.0), 1.0, 100.0)
    assert np.all(got >= 0) and got.sum() == pytest.approx(1.0, abs=1e-12)


def test_target_has_the_estimate_margins_when_norm_sub_zeroes_cells():
    est = np.array([[5.0, 120.0], [820.0, 55.0]])  # rows 125/875, columns 825/175
    noisy = np.array([[0.0, 86.0], [1061.0, 18.0]])  # Norm-Sub keeps only the anti-diagonal
    got = target_from_noisy(noisy, est, variance=200.0, total=1000.0)
    np.testing.assert_allclose(got.sum(axis=1), est.sum(axis=1) / est.sum(), atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=0), est.sum(axis=0) / est.sum(), atol=1e-6)


# -- rake_weights ------------------------------------------------------------------------------------
def _weighted_table(codes, w, a, b, shape):
    t = np.zeros((shape[a], shape[b]))
    np.add.at(t, (codes[:, a], codes[:, b]), w)
    return t / t.sum()


def test_rake_matches_a_consistent_target_and_keeps_one_way_margins():
    rng = np.random.default_rng(4)
    shape = (3, 4, 2)
    codes = np.column_stack([rng.integers(0, s, 6000) for s in shape])
    # a target with the pool's own (0, 1) margins but a strong dependence (IPF of a tilted table)
    own = _weighted_table(codes, np.ones(len(codes)), 0, 1, shape)
    tilt = own * np.exp(2.0 * np.subtract.outer(np.arange(3), np.arange(4) / 1.5) ** 2 * -1)
    target = tilt.copy()
    for _ in range(500):
        target *= (own.sum(axis=1) / target.sum(axis=1))[:, None]
        target *= (own.sum(axis=0) / target.sum(axis=0))[None, :]
    ident = (np.arange(3), np.arange(4))
    w = rake_weights(codes, shape, [RakeTarget((0, 1), ident, target)], iterations=30)
    assert np.all(w > 0)
    np.testing.assert_allclose(_weighted_table(codes, w, 0, 1, shape), target, atol=1e-6)
    for j, s in enumerate(shape):  # 1-way margins of the pool kept
        np.testing.assert_allclose(np.bincount(codes[:, j], weights=w, minlength=s) / w.sum(),
                                   np.bincount(codes[:, j], minlength=s) / len(codes), atol=1e-6)
    # the target's flat keys follow its own coarse shape
    assert np.array_equal(RakeTarget((0, 1), ident, target).keys(codes), codes[:, 0] * 4 + codes[:, 1])


def test_rake_without_targets_leaves_weights_alone():
    codes = np.zeros((5, 2), dtype=np.int64)
    assert np.array_equal(rake_weights(codes, (2, 2), []), np.ones(5))
    w0 = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    got = rake_weights(codes, (2, 2), [], weights=w0)
    assert np.array_equal(got, w0) and got is not w0
    assert rake_weights(np.zeros((0, 2), dtype=np.int64), (2, 2), []).shape == (0,)


def test_rake_ends_on_the_rows_own_one_way_margins():
    """Issue 18 (H44): a target that disagrees with the rows' 1-way margins (a noisy pair) must
    not have the last word: the raking ends with a sweep of the 1-way margins, so after a few
    iterations the weighted margins are the rows' own (the last column exactly)."""
    rng = np.random.default_rng(7)
    shape = (3, 4)
    codes = np.column_stack([rng.integers(0, s, 4000) for s in shape])
    # a pair target whose margins are far from the pool's (as a noisy coarse pair can be)
    target = np.outer([0.6, 0.3, 0.1], [0.1, 0.2, 0.3, 0.4])
    ident = (np.arange(3), np.arange(4))
    w = rake_weights(codes, shape, [RakeTarget((0, 1), ident, target)], iterations=2)
    own = [np.bincount(codes[:, j], minlength=s) / len(codes) for j, s in enumerate(shape)]
    got = [np.bincount(codes[:, j], weights=w, minlength=s) / w.sum() for j, s in enumerate(shape)]
    np.testing.assert_allclose(got[-1], own[-1], atol=1e-12)
    np.testing.assert_allclose(got[0], own[0], atol=1e-12)  # this target is a product: one sweep fits


# -- systematic_resample -----------------------------------------------------------------------------
def test_systematic_resample_draws_each_row_in_proportion_to_its_weight():
    pool = np.array([[0, 0], [1, 1]])
    for seed in range(20):
        got = systematic_resample(pool, np.array([1.0, 3.0]), 100, RandomSource(seed=seed), (2, 2))
        assert got.shape == (100, 2)
        assert abs(int((got[:, 0] == 0).sum()) - 25) <= 1
    rng = np.random.default_rng(5)
    pool = np.array(list(itertools.product(range(3), range(4))))  # 12 distinct rows
    for seed in range(20):
        w = rng.random(12) * (rng.random(12) > 0.2)
        w[0] += 0.1
        n = int(rng.integers(1, 200))
        got = systematic_resample(pool, w, n, RandomSource(seed=seed), (3, 4))
        counts = np.array([int(np.all(got == row, axis=1).sum()) for row in pool])
        expect = n * w / w.sum()
        assert counts.sum() == n
        assert np.all(counts >= np.floor(expect) - 1e-9) and np.all(counts <= np.ceil(expect) + 1e-9)
        assert np.all(counts[w == 0] == 0)


def test_systematic_resample_edge_cases():
    pool = np.array([[0, 1], [1, 0]])
    assert systematic_resample(pool, np.ones(2), 0, RandomSource(seed=0), (2, 2)).shape == (0, 2)
    with pytest.raises(ValueError, match="positive total"):
        systematic_resample(pool, np.zeros(2), 5, RandomSource(seed=0), (2, 2))
    a = systematic_resample(pool, np.array([1.0, 2.0]), 50, RandomSource(seed=3), (2, 2))
    b = systematic_resample(pool, np.array([1.0, 2.0]), 50, RandomSource(seed=3), (2, 2))
    assert np.array_equal(a, b)


# -- plan_refinement ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "echo"), [
    ({"pairs": 0}, r"pairs \(0\)"),
    ({"pairs": True}, r"pairs \(True\)"),
    ({"pairs": 2.5}, r"pairs \(2\.5\)"),
    ({"rounds": 0}, r"rounds \(0\)"),
    ({"pairs": 3, "rounds": 4}, r"rounds \(4\).*pairs \(3\)"),
    ({"groups": 1}, r"groups \(1\)"),
    ({"groups": 65}, r"groups \(65\)"),
    ({"max_contributions": 0}, r"max_contributions \(0\)"),
    ({"pool_rows": 999}, r"pool_rows \(999\)"),
    ({"rake_iterations": 0}, r"rake_iterations \(0\)"),
])
def test_plan_refinement_rejects_bad_values_naming_them(kwargs, echo):
    with pytest.raises(ValueError, match=echo):
        plan_refinement(PureDP(epsilon=1.0), **kwargs)


def test_plan_refinement_budget_type_is_checked():
    with pytest.raises(TypeError, match="float"):
        plan_refinement(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ApproxDP"):
        plan_refinement(ApproxDP(epsilon=1.0, delta=1e-6))


def test_plan_refinement_splits_one_fifth_to_selection():
    for eps in (0.1, 0.25, 1.0, 3.7):
        plan = plan_refinement(PureDP(epsilon=eps), pairs=7, rounds=3, max_contributions=2)
        assert math.isclose(plan.selection_budget.epsilon, eps / 5, rel_tol=1e-12)
        assert math.isclose(plan.measure_budget.epsilon, 4 * eps / 5, rel_tol=1e-12)
        assert math.isclose(plan.selection_budget.epsilon + plan.measure_budget.epsilon, eps,
                            rel_tol=1e-12)
        assert math.isclose(plan.pick_epsilon, eps / 5 / 7, rel_tol=1e-12)
        assert math.isclose(plan.table_epsilon, 4 * eps / 5 / 7, rel_tol=1e-12)
        assert plan.table_scale == discrete_laplace_scale(sensitivity=2, epsilon=plan.table_epsilon)
    for pairs, rounds in itertools.product(range(1, 20), range(1, 6)):
        if rounds > pairs:
            continue
        per = plan_refinement(PureDP(epsilon=1.0), pairs=pairs, rounds=rounds).per_round()
        assert len(per) == rounds and sum(per) == pairs
        assert max(per) - min(per) <= 1 and per == sorted(per, reverse=True)
    assert plan_refinement(PureDP(epsilon=1.0), pairs=15, rounds=3).per_round() == [5, 5, 5]
    assert plan_refinement(PureDP(epsilon=1.0), pairs=7, rounds=3).per_round() == [3, 2, 2]


# -- plan_privbayes with the refinement --------------------------------------------------------------
def test_privbayes_plan_budget_parts_sum_to_epsilon():
    for shape, eps, fraction in (((3, 4, 5), 1.0, 0.25), ((2,) * 6, 0.3, 0.5), ((9, 9, 9), 7.0, 0.1)):
        plan = plan_privbayes(shape, PureDP(epsilon=eps), refine_fraction=fraction)
        assert plan.refine is not None
        parts = (plan.structure_budget.epsilon, plan.marginal_budget.epsilon,
                 plan.refine.selection_budget.epsilon, plan.refine.measure_budget.epsilon)
        assert math.isclose(sum(parts), eps, rel_tol=1e-12)
        assert math.isclose(parts[2] + parts[3], eps * fraction, rel_tol=1e-12)
        acc = PrivacyAccountant(total=PureDP(epsilon=eps))
        spend_privbayes(acc, plan)  # would raise BudgetExceededError if the parts overspent
        assert math.isclose(acc.spent_epsilon, eps, rel_tol=1e-12)
        assert plan.details()["refine"]["pairs"] == plan.refine.pairs


def test_privbayes_plan_refines_only_as_many_pairs_as_get_the_minimum_table_epsilon():
    from beamsynth.transforms.refine import REFINE_MIN_PAIRS, REFINE_MIN_TABLE_EPSILON

    shape = (5,) * 15  # 105 pairs
    for eps, m, want in ((1.0, 1, 15), (0.5, 1, 10), (0.3, 1, 6), (0.2, 1, 4), (0.15, 1, 3),
                         (0.1, 1, 0), (1.0, 2, 10), (0.3, 2, 3), (0.2, 2, 0)):
        plan = plan_privbayes(shape, PureDP(epsilon=eps), max_contributions=m)
        afford = int(eps * 0.25 * 0.8 / (m * REFINE_MIN_TABLE_EPSILON) + 1e-9)
        assert want == (min(15, afford) if afford >= REFINE_MIN_PAIRS else 0)
        if want == 0:
            # dropped: the whole ε to the network, which then gets the default k = 2
            assert plan.refine is None and plan.degree == DEFAULT_DEGREE
        else:
            assert plan.refine.pairs == want and plan.degree == DEFAULT_REFINED_DEGREE
            assert plan.refine.table_epsilon / m >= REFINE_MIN_TABLE_EPSILON - 1e-12


def test_privbayes_plan_degree_and_when_the_refinement_is_dropped():
    eps = PureDP(epsilon=1.0)
    assert plan_privbayes((3, 4, 5), eps).degree == DEFAULT_REFINED_DEGREE == 1
    assert plan_privbayes((3, 4, 5), eps, refine_pairs=0).degree == DEFAULT_DEGREE == 2
    assert plan_privbayes((3, 4, 5), eps, refine_pairs=0).refine is None
    assert plan_privbayes((3, 4, 5), eps, degree=2).refine is not None
    # never more tables than countable pairs (each table's ε would be wasted otherwise)
    small = plan_privbayes((3, 4, 5), eps)
    assert small.refine.pairs == 3 and small.refine.rounds == 3
    assert plan_privbayes((2,) * 7, eps).refine.pairs == 15
    # one column, fewer than REFINE_MIN_PAIRS pairs, or no parents: nothing to refine, the whole
    # ε goes to the network
    for plan in (plan_privbayes((5,), eps), plan_privbayes((3, 4), eps),
                 plan_privbayes((3, 4, 5), eps, degree=0)):
        assert plan.refine is None and plan.details()["refine"] is None
        total = plan.marginal_budget.epsilon + (
            plan.structure_budget.epsilon if plan.structure_budget is not None else 0.0)
        assert math.isclose(total, 1.0, rel_tol=1e-12)
    assert plan_privbayes((5,), eps).structure_budget is None
    # the refinement's parameters are validated even when unused
    with pytest.raises(ValueError, match=r"groups \(1\)"):
        plan_privbayes((5,), eps, refine_groups=1)
    with pytest.raises(ValueError, match=r"refine_pairs \(-1\)"):
        plan_privbayes((3, 4), eps, refine_pairs=-1)
    for bad in (0, 1, 1.5):
        with pytest.raises(ValueError, match=rf"refine_fraction \({bad}\)"):
            plan_privbayes((3, 4), eps, refine_fraction=bad)


# -- measure_refinement ------------------------------------------------------------------------------
SHAPE = (8, 8, 4, 3)
ORDERED = (True, True, False, False)
NAMES = ("a", "b", "c", "d")


def _dependent_data(n: int = 3000) -> np.ndarray:
    """Columns 0 and 1 strongly dependent (b = a ± 1), 2 and 3 independent of everything."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 8, n)
    b = np.clip(a + rng.integers(-1, 2, n), 0, 7)
    return np.column_stack([a, b, rng.integers(0, 4, n), rng.integers(0, 3, n)])


def _pair_counts(codes):
    def counts(a, b):
        t = np.zeros((SHAPE[a], SHAPE[b]), dtype=np.int64)
        np.add.at(t, (codes[:, a], codes[:, b]), 1)
        return t
    return counts


def _ones(codes) -> tuple[NoisyMarginal, ...]:
    """Exact 1-way tables dressed as releases (tiny scale)."""
    return tuple(NoisyMarginal(columns=(j,), names=(NAMES[j],), shape=(s,),
                               values=np.bincount(codes[:, j], minlength=s), scale=1e-3,
                               budget=PureDP(epsilon=1000.0)) for j, s in enumerate(SHAPE))


def _independent_network(codes) -> PrivBayesModel:
    """The network a degree-0 PrivBayes fits: no parents, exact 1-way tables."""
    m = PrivBayesMeasurement(tuple((j, ()) for j in range(len(SHAPE))), _ones(codes))
    model = fit_privbayes(m, SHAPE, NAMES)
    assert isinstance(model, PrivBayesModel)  # no refinement in the measurement
    return model


def _refine(codes, *, seed=0, max_contributions=1, candidates=None, pair_counts=None, pairs=2):
    plan = plan_refinement(PureDP(epsilon=50.0), pairs=pairs, rounds=2, groups=4,
                           max_contributions=max_contributions, pool_rows=5000)
    network = _independent_network(codes)
    m = measure_refinement(pair_counts or _pair_counts(codes), network, total=float(len(codes)),
                           ordered=ORDERED, names=NAMES, plan=plan, rs=RandomSource(seed=seed),
                           candidates=candidates)
    return plan, network, m


def _corr(codes):
    return float(np.corrcoef(codes[:, 0], codes[:, 1])[0, 1])


def test_refinement_selects_the_missed_dependence_and_the_sample_reproduces_it():
    codes = _dependent_data()
    plan, network, m = _refine(codes)
    assert m.tables[0].columns == (0, 1) and m.details["selected"][0] == ["a", "b"]
    assert len(m.tables) == len(m.targets) == plan.pairs
    refined = RefinedModel(network, m.targets, names=NAMES)
    assert refined.base is network and refined.shape == SHAPE
    assert refined.describe()["refined_with"][0] == ["a", "b"]
    rs = RandomSource(seed=1)
    plain = network.sample_codes(3000, rs.child("plain"))
    got = refined.sample_codes(3000, rs.child("refined"))
    assert got.shape == (3000, 4) and np.all((got >= 0) & (got < np.array(SHAPE)))
    real = _corr(codes)
    assert real > 0.9 and abs(_corr(plain)) < 0.1
    assert _corr(got) > 0.75  # most of the dependence is back (4 coarse groups per column)

    def tvd(x, y):  # of the (0, 1) table
        return 0.5 * np.abs(_pair_counts(x)(0, 1) / len(x) - _pair_counts(y)(0, 1) / len(y)).sum()
    assert tvd(got, codes) < 0.5 * tvd(plain, codes)
    # 1-way margins stay close to the network's
    for j, s in enumerate(SHAPE):
        p = np.bincount(got[:, j], minlength=s) / len(got)
        q = np.bincount(codes[:, j], minlength=s) / len(codes)
        assert 0.5 * np.abs(p - q).sum() < 0.05


def test_released_tables_carry_the_planned_noise_and_budget():
    codes = _dependent_data()
    plan, _, m = _refine(codes, max_contributions=2, pairs=3)
    assert len(m.tables) == 3
    for t in m.tables:
        assert t.sensitivity == plan.max_contributions == 2
        assert t.budget.epsilon == plan.table_epsilon and t.budget.delta == 0
        assert t.scale == plan.table_scale
        assert t.values.dtype.kind == "i" and t.meta["coarse"]
        ga, gb = (np.asarray(g) for g in t.meta["groups"])
        assert t.shape == t.values.shape == (ga.max() + 1, gb.max() + 1)
        assert t.names == tuple(NAMES[c] for c in t.columns)
    assert sum(t.budget.epsilon for t in m.tables) == pytest.approx(plan.measure_budget.epsilon)


def test_data_is_read_only_through_pair_counts_of_candidates():
    codes = _dependent_data()
    calls: list[tuple[int, int]] = []
    inner = _pair_counts(codes)

    def recording(a, b):
        calls.append((a, b))
        return inner(a, b)

    candidates = [(0, 1), (1, 2), (2, 3)]
    _, _, m = _refine(codes, candidates=candidates, pair_counts=recording)
    assert calls and set(calls) <= set(candidates)
    assert len(calls) == len(set(calls))  # each exact table read once
    assert {t.columns for t in m.tables} <= set(candidates)
    calls.clear()
    _refine(codes, pair_counts=recording)  # default: all pairs a < b
    assert set(calls) <= set(itertools.combinations(range(4), 2)) and len(calls) == len(set(calls))


def test_pair_group_counts_leave_a_small_columns_cells_to_the_other():
    assert pair_group_counts(2, 14, 5) == (2, 12)  # Adult sex × age: 2 × 12, not 2 × 5
    assert pair_group_counts(14, 2, 5) == (12, 2)
    assert pair_group_counts(3, 40, 8) == (3, 21)
    assert pair_group_counts(14, 16, 5) == (5, 5)  # both wide: groups each
    assert pair_group_counts(5, 14, 5) == (5, 5)  # not smaller than groups
    assert pair_group_counts(3, 4, 5) == (5, 5)  # both whole (coarse_groups keeps them)
    # the θ-useful cap: fewer cells than the small column × groups keeps the old layout
    assert pair_group_counts(2, 14, 5, max_cells=6) == (2, 5)
    assert pair_group_counts(2, 14, 5, max_cells=16) == (2, 8)
    assert pair_group_counts(2, 14, 5, max_cells=1000) == (2, 12)
    for a, b in itertools.product(range(1, 30), repeat=2):
        ga, gb = pair_group_counts(a, b, 5)
        assert min(ga, a) * min(gb, b) <= 25


def test_a_pair_with_a_small_column_is_measured_finer_on_the_other(monkeypatch):
    # d (3 cells) is below groups (4): the pair (a, d) gets a in ⌊16/3⌋ = 5 groups, d whole
    codes = _dependent_data()
    _, _, off = _refine(codes, candidates=[(0, 3), (0, 1)], pairs=2)
    assert {t.columns: t.values.shape for t in off.tables}[(0, 3)] == (4, 3)  # default: off
    monkeypatch.setattr(refine, "PAIR_CELLS", True)
    _, _, m = _refine(codes, candidates=[(0, 3), (0, 1)], pairs=2)
    shapes = {t.columns: t.values.shape for t in m.tables}
    assert shapes == {(0, 3): (5, 3), (0, 1): (4, 4)}
    target = next(t for t in m.targets if t.columns == (0, 3))
    assert target.proportions.shape == (5, 3) and np.array_equal(target.groups[1], np.arange(3))
    # where n̂ < θ·cells·b the table keeps groups per column (4 × 3): b = 62.5, n̂ = 3000
    plan = plan_refinement(PureDP(epsilon=0.04), pairs=2, rounds=2, groups=4, pool_rows=5000)
    assert len(codes) / (4.0 * plan.table_scale) < 5 * 3
    low = measure_refinement(_pair_counts(codes), _independent_network(codes),
                             total=float(len(codes)), ordered=ORDERED, names=NAMES, plan=plan,
                             rs=RandomSource(seed=0), candidates=[(0, 3)])
    assert low.tables[0].values.shape == (4, 3)


def test_refinement_is_deterministic_for_a_seed():
    codes = _dependent_data()
    _, network, m1 = _refine(codes, seed=4)
    _, _, m2 = _refine(codes, seed=4)
    assert [t.columns for t in m1.tables] == [t.columns for t in m2.tables]
    assert all(np.array_equal(x.values, y.values) for x, y in zip(m1.tables, m2.tables))
    model = RefinedModel(network, m1.targets)
    a = model.sample_codes(500, RandomSource(seed=9))
    assert np.array_equal(a, RefinedModel(network, m2.targets).sample_codes(500, RandomSource(seed=9)))
    assert not np.array_equal(a, model.sample_codes(500, RandomSource(seed=10)))


def test_refined_model_edge_cases():
    codes = _dependent_data(500)
    network = _independent_network(codes)
    _, _, m = _refine(codes)
    assert RefinedModel(network, m.targets).sample_codes(0, RandomSource(seed=0)).shape == (0, 4)
    # without targets it is the network
    bare = RefinedModel(network, [])
    assert np.array_equal(bare.sample_codes(50, RandomSource(seed=2)),
                          network.sample_codes(50, RandomSource(seed=2)))
    # nothing to refine: no candidates, or one column
    plan = plan_refinement(PureDP(epsilon=1.0), pairs=2, rounds=1)
    empty = measure_refinement(_pair_counts(codes), network, total=500.0, ordered=ORDERED,
                               names=NAMES, plan=plan, rs=RandomSource(seed=0), candidates=[])
    assert empty.tables == () and empty.targets == ()
    # fit_privbayes wraps the network only when there are targets
    structure = tuple((j, ()) for j in range(4))
    fitted = fit_privbayes(PrivBayesMeasurement(structure, _ones(codes), m), SHAPE, NAMES)
    assert isinstance(fitted, RefinedModel) and isinstance(fitted.base, PrivBayesModel)
    assert len(fitted.targets) == len(m.targets)
    assert isinstance(fit_privbayes(PrivBayesMeasurement(structure, _ones(codes), empty), SHAPE,
                                    NAMES), PrivBayesModel)


# -- multi-column targets and zero-safe raking (the network's own tables as targets) ---------------
def test_rake_target_keys_for_three_columns_are_the_row_major_cell():
    from beamsynth.transforms.refine import RakeTarget

    codes = np.array([[0, 1, 2, 9], [1, 0, 1, 9], [1, 1, 0, 9]])
    groups = (np.arange(2), np.array([0, 0]), np.array([0, 1, 1]))
    t = RakeTarget((0, 1, 2), groups, np.full((2, 1, 2), 0.25))
    assert t.keys(codes).tolist() == [1, 3, 2]


def test_smoothed_proportions_fill_empty_cells_from_the_independence_table():
    from beamsynth.transforms.refine import smoothed_proportions

    t = np.array([[0.0, 5.0], [3.0, 0.0]])
    got = smoothed_proportions(t, floor=1e-3)
    assert got.sum() == pytest.approx(1.0, abs=1e-12)
    rows, cols = t.sum(axis=1) / 8, t.sum(axis=0) / 8
    raw = np.where(t > 0, t / 8, 1e-3 * np.outer(rows, cols))
    np.testing.assert_allclose(got, raw / raw.sum(), rtol=1e-12)
    assert np.all(got > 0)
    np.testing.assert_allclose(smoothed_proportions(np.zeros((2, 3))), np.full((2, 3), 1 / 6))
    # three axes: positive wherever every 1-way margin is positive
    t3 = np.zeros((2, 2, 2))
    t3[0, 1, 1], t3[1, 0, 0] = 4.0, 2.0
    p3 = smoothed_proportions(t3)
    assert p3.sum() == pytest.approx(1.0) and np.all(p3 > 0)


def test_rake_weights_skips_a_target_that_would_zero_every_row():
    from beamsynth.transforms.refine import RakeTarget, rake_weights

    codes = np.array([[0, 0], [0, 1], [1, 0]])
    # all target mass on cell (1, 1), which no row reaches: applying it would zero every weight
    t = RakeTarget((0, 1), (np.arange(2), np.arange(2)), np.array([[0.0, 0.0], [0.0, 1.0]]))
    w = rake_weights(codes, (2, 2), [t], iterations=3)
    assert np.all(np.isfinite(w)) and w.sum() > 0


def test_refined_model_describes_kept_network_tables_apart_from_refined_pairs():
    """Three-column network tables (k = 2 with the refinement) must not break ``describe``."""
    from beamsynth.transforms.privbayes import fit_privbayes, measure_privbayes, plan_privbayes

    rng = np.random.default_rng(3)
    a = rng.integers(0, 3, 2000)
    codes = np.stack([a, (a + rng.integers(0, 2, 2000)) % 3, rng.integers(0, 4, 2000),
                      (a * 2 + rng.integers(0, 2, 2000)) % 4], axis=1)
    shape = (3, 3, 4, 4)
    plan = plan_privbayes(shape, PureDP(epsilon=20.0), degree=2, refine_pairs=3)
    families = [tuple(f) for f in itertools.combinations(range(4), 3)]
    counts = []
    for f in families:
        idx = np.ravel_multi_index(tuple(codes[:, c] for c in f), [shape[c] for c in f])
        counts.append(np.bincount(idx, minlength=math.prod(shape[c] for c in f)).reshape([shape[c] for c in f]))
    m = measure_privbayes(counts, families, shape=shape, names=list("abcd"), plan=plan,
                          rs=RandomSource(seed=4), ordered=[False] * 4)
    model = fit_privbayes(m, shape, list("abcd"))
    desc = model.describe()
    assert len(desc["refined_with"]) == 3 and all(len(c) == 2 for c in desc["refined_with"])
    assert desc["kept_tables"] and any(len(c) == 3 for c in desc["kept_tables"])
    assert model.sample_codes(50, RandomSource(seed=5)).shape == (50, 4)
    with pytest.raises(ValueError, match=r"base_targets \(9\)"):
        RefinedModel(model.base, model.targets, base_targets=9)


def test_refined_model_sampling_modes():
    """``balanced`` (default) rows match the raked pool's pair tables more closely than ``iid``
    draws from the same pool; bad modes are refused with the value."""
    codes = _dependent_data()
    _, network, m = _refine(codes)
    balanced = RefinedModel(network, m.targets)
    iid = RefinedModel(network, m.targets, sampling="iid")
    assert balanced.describe()["sampling"] == "balanced" and iid.describe()["sampling"] == "iid"
    n = 2000
    # the model's own (0, 1) table, from a large balanced draw
    ref = _pair_counts(balanced.sample_codes(40_000, RandomSource(seed=1)))(0, 1) / 40_000

    def err(model, seed):
        got = model.sample_codes(n, RandomSource(seed=seed))
        assert got.shape == (n, 4) and np.all((got >= 0) & (got < np.array(SHAPE)))
        return 0.5 * np.abs(_pair_counts(got)(0, 1) / n - ref).sum()
    e_bal = np.mean([err(balanced, s) for s in range(5)])
    e_iid = np.mean([err(iid, s) for s in range(5)])
    assert e_bal < 0.8 * e_iid, (e_bal, e_iid)
    with pytest.raises(ValueError, match=r"sampling \('stratified'\)"):
        RefinedModel(network, m.targets, sampling="stratified")


def test_pair_cells_switch_is_the_plans_not_the_workers(monkeypatch):
    """``PAIR_CELLS`` is read when the plan is made (``RefinePlan.pair_cells``): a plan made with
    it on measures the finer pair cells in a worker whose fresh module says off (fifteenth
    session; fails when the measuring step reads the module)."""
    codes = _dependent_data()
    monkeypatch.setattr(refine, "PAIR_CELLS", True)  # the launcher
    plan = plan_refinement(PureDP(epsilon=50.0), pairs=2, rounds=2, groups=4, pool_rows=5000)
    assert plan.pair_cells
    monkeypatch.setattr(refine, "PAIR_CELLS", False)  # a worker's fresh module
    m = measure_refinement(_pair_counts(codes), _independent_network(codes), total=float(len(codes)),
                           ordered=ORDERED, names=NAMES, plan=plan, rs=RandomSource(seed=0),
                           candidates=[(0, 3), (0, 1)])
    assert {t.columns: t.values.shape for t in m.tables}[(0, 3)] == (5, 3)
