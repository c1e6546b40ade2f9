"""Unit tests for transforms/privbayes.py (Beam-free arithmetic)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.measure import NoisyMarginal, count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    INDIF_SENSITIVITY,
    PrivBayesMeasurement,
    PrivBayesModel,
    balanced_uniforms,
    candidate_families,
    choose_structure,
    conditional_from_table,
    family_specs,
    fit_privbayes,
    indif_score,
    make_consistent,
    marginalize,
    measure_privbayes,
    norm_sub,
    plan_privbayes,
    spend_privbayes,
    split_marginal_budget,
)


def _tables(codes, shape, degree):
    fams = candidate_families(len(shape), degree)
    counts = count_marginals(codes, fams, shape)
    return fams, [c.reshape([shape[i] for i in f]) for c, f in zip(counts, fams)]


# -- score sensitivity -----------------------------------------------------------------------------
def test_indif_exact_values():
    assert indif_score(np.array([[5, 0], [0, 5]])) == pytest.approx(10.0)  # |5-2.5|*4
    assert indif_score(np.array([[2, 2], [2, 2]])) == 0.0
    assert indif_score(np.zeros((3, 2))) == 0.0
    with pytest.raises(ValueError, match="2-d"):
        indif_score(np.zeros(3))


def test_indif_sensitivity_bound_add_remove_one_record():
    rng = np.random.default_rng(0)
    worst = 0.0
    for trial in range(3000):
        rows, cols = rng.integers(1, 6, 2)
        n = int(rng.integers(0, 12 if trial % 2 else 200))
        # skewed tables reach the largest changes
        p = rng.dirichlet(np.full(rows * cols, 0.3))
        t = rng.multinomial(n, p).reshape(rows, cols).astype(float)
        a, b = rng.integers(0, rows), rng.integers(0, cols)
        t2 = t.copy()
        t2[a, b] += 1  # add one record; reading (t2 → t) is the removal
        worst = max(worst, abs(indif_score(t2) - indif_score(t)))
    assert worst <= INDIF_SENSITIVITY
    assert worst > 2.0  # the bound is not vacuous: changes near it do occur


def test_indif_worst_case_construction_stays_below_4():
    # a large mass in one cell, the new record in an empty row/column
    for n in (1, 10, 1000):
        t = np.zeros((2, 2))
        t[0, 0] = n
        t2 = t.copy()
        t2[1, 1] += 1
        assert abs(indif_score(t2) - indif_score(t)) < INDIF_SENSITIVITY


# -- exponential mechanism structure ----------------------------------------------------------------
def test_structure_picks_the_copied_column_at_high_epsilon():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 3, 3000)
    codes = np.column_stack([a, rng.integers(0, 2, 3000), a.copy()])  # column 2 copies column 0
    shape = (3, 2, 3)
    fams, counts = _tables(codes, shape, 1)
    tables = dict(zip(fams, counts))
    hits = 0
    for seed in range(20):
        order = choose_structure(tables, shape, degree=1, epsilon=5.0, sensitivity=4.0,
                                 noise_scale=0.0, rs=RandomSource(seed=seed))
        assert sorted(x for x, _ in order) == [0, 1, 2]
        parents = dict(order)
        hits += (parents[2] == (0,)) or (parents[0] == (2,))
    assert hits == 20
    again = choose_structure(tables, shape, degree=1, epsilon=5.0, sensitivity=4.0, noise_scale=0.0,
                             rs=RandomSource(seed=3))
    assert again == choose_structure(tables, shape, degree=1, epsilon=5.0, sensitivity=4.0,
                                     noise_scale=0.0, rs=RandomSource(seed=3))


def test_structure_penalty_prefers_no_parents_for_independent_columns():
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 4, (2000, 3))
    shape = (4, 4, 4)
    fams, counts = _tables(codes, shape, 2)
    order = choose_structure(dict(zip(fams, counts)), shape, degree=2, epsilon=50.0, sensitivity=4.0,
                             noise_scale=100.0, rs=RandomSource(seed=0))
    assert all(ps == () for _, ps in order)
    # exact_degree (PrivBayes Alg. 4, --pb-parents exact): exactly min(k, placed) parents per step
    order = choose_structure(dict(zip(fams, counts)), shape, degree=2, epsilon=50.0, sensitivity=4.0,
                             noise_scale=100.0, rs=RandomSource(seed=0), exact_degree=True)
    assert [len(ps) for _, ps in order] == [0, 1, 2]
    plan = plan_privbayes(shape, PureDP(epsilon=1.0), parents="exact")
    assert plan.exact_degree and plan.details()["parent_sets"] == "exact k"
    assert not plan_privbayes(shape, PureDP(epsilon=1.0), parents="adaptive").exact_degree
    # auto: exact up to 16 declared columns, adaptive above (from the declared width only);
    # the rule is about the network's own ε_m, so these use the pure network (refine_pairs=0)
    pure = {"refine_pairs": 0}
    assert plan_privbayes((3,) * 16, PureDP(epsilon=1.0), **pure).exact_degree
    assert not plan_privbayes((3,) * 17, PureDP(epsilon=1.0), **pure).exact_degree
    # ... and only with ε_m/(d·m) ≥ 0.05 (Adult at ε = 0.1/0.5 is better adaptive)
    assert not plan_privbayes((3,) * 15, PureDP(epsilon=0.5), **pure).exact_degree
    assert not plan_privbayes((3,) * 15, PureDP(epsilon=1.0), max_contributions=2, **pure).exact_degree
    assert plan_privbayes((3,) * 15, PureDP(epsilon=2.0), max_contributions=2, **pure).exact_degree
    # with the refinement (default) ε_m is what is left after its share: 0.675/16 < 0.05 at ε = 1
    refined = plan_privbayes((3,) * 16, PureDP(epsilon=1.0))
    assert refined.refine is not None and not refined.exact_degree
    assert plan_privbayes((3,) * 16, PureDP(epsilon=2.0)).exact_degree  # 1.35/16 ≥ 0.05
    with pytest.raises(ValueError, match="parents"):
        plan_privbayes(shape, PureDP(epsilon=1.0), parents="yes")


def test_family_specs_drops_covered_root():
    assert family_specs([(2, ()), (0, (2,)), (1, (0, 2))]) == [(0, 2), (1, 0, 2)]
    assert family_specs([(2, ()), (0, ())]) == [(2,), (0,)]


# -- consistency, non-negativity, conditionals --------------------------------------------------------
def _nm(cols, values, scale):
    values = np.asarray(values)
    return NoisyMarginal(columns=tuple(cols), names=tuple(f"c{c}" for c in cols), shape=values.shape,
                         values=values, scale=scale, budget=PureDP(epsilon=1.0))


def test_make_consistent_agrees_and_weights_by_variance():
    t1 = _nm((0, 1), [[10, 0], [0, 10]], scale=0.5)   # column 0 sums: 10, 10
    t2 = _nm((0,), [30, 10], scale=50.0)              # noisier: column 0 sums 30, 10
    c1, c2 = make_consistent([t1, t2])
    assert np.allclose(marginalize(c1, (0, 1), [0]), c2, atol=1e-6)
    assert np.all(np.abs(c2 - [10, 10]) < np.abs(c2 - [30, 10]) + 1e-9)  # pulled to the precise table
    assert c1.sum() == pytest.approx(c2.sum())


def test_norm_sub_keeps_total_and_non_negativity():
    v = np.array([5.0, -3.0, 2.0, 1.0])
    out = norm_sub(v, 6.0)
    assert out.sum() == pytest.approx(6.0) and np.all(out >= 0)
    assert np.allclose(out, [5 - 2 / 3, 0, 2 - 2 / 3, 1 - 2 / 3])  # δ = (5+2+1-6)/3
    assert np.all(norm_sub(v, 0.0) == 0)
    assert norm_sub(np.array([1.0, 1.0]), 10.0).sum() == pytest.approx(10.0)


def test_conditional_rows_and_shrinkage():
    table = np.array([[8.0, 0.0], [2.0, 0.0]])  # [x, π]; π = 1 has no mass
    cond = conditional_from_table(table, np.array([0.5, 0.5]), strength=0.0)
    assert np.allclose(cond[0], [0.8, 0.2])
    assert np.allclose(cond[1], [0.5, 0.5])  # empty parent cell → uniform
    shrunk = conditional_from_table(table, np.array([0.25, 0.75]), strength=10.0)
    assert np.allclose(shrunk[0], [(8 + 2.5) / 20, (2 + 7.5) / 20])
    assert np.allclose(shrunk[1], [0.25, 0.75])


def test_fit_recovers_exact_conditionals_from_noise_free_tables():
    joint = np.array([[30.0, 10.0], [20.0, 40.0]])  # [x1, x0]
    ms = (_nm((0,), joint.sum(axis=0), 1e-3), _nm((1, 0), joint, 1e-3))
    model = fit_privbayes(PrivBayesMeasurement(((0, ()), (1, (0,))), ms), (2, 2), shrink=0.0)
    assert np.allclose(model.conditional(0), [[0.5, 0.5]], atol=1e-6)
    assert np.allclose(model.conditional(1), [[0.6, 0.4], [0.2, 0.8]], atol=1e-6)
    codes = model.sample_codes(200_000, RandomSource(seed=4))
    freq = np.bincount(codes[:, 0] * 2 + codes[:, 1], minlength=4) / 200_000
    assert np.allclose(freq, [0.3, 0.2, 0.1, 0.4], atol=0.006)  # ~5 sd of a 2e5 sample


def test_model_validates_structure_and_shapes():
    with pytest.raises(ValueError, match="every column once"):
        PrivBayesModel((2, 2), [(0, ())], [np.array([[0.5, 0.5]])])
    with pytest.raises(ValueError, match="expected"):
        PrivBayesModel((2, 2), [(0, ()), (1, (0,))], [np.array([[0.5, 0.5]]), np.ones((1, 2)) / 2])


def test_balanced_uniforms_stratify_each_group_and_are_deterministic():
    rng = np.random.default_rng(3)
    groups = rng.integers(0, 7, 5000)
    u = balanced_uniforms(groups, RandomSource(seed=1))
    assert u.shape == (5000,) and np.all(u >= 0) and np.all(u < 1)
    for g in range(7):
        ug = np.sort(u[groups == g])
        n = ug.size
        # exactly one value in each stratum [j/n, (j+1)/n)
        assert np.array_equal(np.floor(ug * n).astype(int), np.arange(n))
    assert np.array_equal(u, balanced_uniforms(groups, RandomSource(seed=1)))
    assert not np.array_equal(u, balanced_uniforms(groups, RandomSource(seed=2)))
    assert balanced_uniforms(np.zeros(0, dtype=np.int64), RandomSource(seed=1)).shape == (0,)


def test_balanced_uniforms_are_marginally_uniform():
    # one group of 3 rows: each row's value is U[0,1) over seeds (rank and offset both random)
    draws = np.array([balanced_uniforms(np.zeros(3, dtype=np.int64), RandomSource(seed=s))
                      for s in range(4000)])
    for row in range(3):
        hist = np.histogram(draws[:, row], bins=4, range=(0, 1))[0] / 4000
        assert np.allclose(hist, 0.25, atol=0.035)  # ~5 sd of a 4000-draw bin frequency


def test_balanced_sampling_hits_expected_counts_within_one_per_parent_cell():
    cond1 = np.array([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])  # P(x1 | x0)
    model = PrivBayesModel((2, 3), [(0, ()), (1, (0,))], [np.array([[0.35, 0.65]]), cond1])
    assert model.describe()["sampling"] == "balanced"
    n = 10_007
    codes = model.sample_codes(n, RandomSource(seed=5))
    c0 = np.bincount(codes[:, 0], minlength=2)
    assert np.all(np.abs(c0 - n * np.array([0.35, 0.65])) < 1)
    for parent in range(2):
        sel = codes[codes[:, 0] == parent, 1]
        assert np.all(np.abs(np.bincount(sel, minlength=3) - sel.size * cond1[parent]) < 1)
    iid = PrivBayesModel((2, 3), [(0, ()), (1, (0,))], [np.array([[0.35, 0.65]]), cond1],
                         sampling="iid")
    codes_iid = iid.sample_codes(n, RandomSource(seed=5))
    assert np.allclose(np.bincount(codes_iid[:, 0], minlength=2) / n, [0.35, 0.65], atol=0.03)
    with pytest.raises(ValueError, match=r"sampling \('stratified'\)"):
        PrivBayesModel((2,), [(0, ())], [np.array([[0.5, 0.5]])], sampling="stratified")


def test_balanced_sampling_keeps_child_independent_of_non_parents():
    # x0 → x1 and x0 → x2: given x0, x1 and x2 must stay independent (no induced coupling)
    c = np.array([[0.5, 0.5], [0.5, 0.5]])
    model = PrivBayesModel((2, 2, 2), [(0, ()), (1, (0,)), (2, (0,))],
                           [np.array([[0.5, 0.5]]), c, c])
    codes = model.sample_codes(200_000, RandomSource(seed=8))
    joint = np.bincount(codes[:, 0] * 4 + codes[:, 1] * 2 + codes[:, 2], minlength=8) / 200_000
    assert np.allclose(joint, 0.125, atol=0.005)  # ~6 sd of a 2e5-sample cell frequency


# -- plan, budget, measurement -----------------------------------------------------------------------
def test_plan_validation_messages_and_degree_cap():
    with pytest.raises(ValueError, match=r"degree \(9\)"):
        plan_privbayes((2, 2), PureDP(epsilon=1.0), degree=9)
    with pytest.raises(ValueError, match=r"structure_fraction \(1.5\)"):
        plan_privbayes((2, 2), PureDP(epsilon=1.0), structure_fraction=1.5)
    shape = (50,) * 6
    # 3-way candidates: 20 × 50³ = 2.5e6 cells; 4-way: 15 × 50⁴ ≈ 9.4e7; 2-way: 15 × 2500
    big = 10**9  # no per-family limit: the degree is lowered until all candidates fit
    assert plan_privbayes(shape, PureDP(epsilon=1.0), degree=3, max_candidate_cells=10**7,
                          max_family_cells=big).degree == 2
    assert plan_privbayes(shape, PureDP(epsilon=1.0), degree=3, max_candidate_cells=10**5,
                          max_family_cells=big).degree == 1
    assert plan_privbayes(shape, PureDP(epsilon=1.0), degree=3, max_candidate_cells=10**3,
                          max_family_cells=big).degree == 0
    # default per-family limit (2e6 cells): 4-way families are simply not candidates
    plan = plan_privbayes(shape, PureDP(epsilon=1.0), degree=3, max_candidate_cells=10**7)
    assert plan.degree == 3
    fams = candidate_families(6, 3, shape=shape, max_family_cells=plan.max_family_cells)
    assert sorted({len(f) for f in fams}) == [3]
    with pytest.raises(ValueError, match=r"max_family_cells \(0\)"):
        plan_privbayes(shape, PureDP(epsilon=1.0), max_family_cells=0)


def test_budget_split_and_spends_sum_to_epsilon():
    # the pure network (refine_pairs=0): two spends
    plan = plan_privbayes((3, 4, 5), PureDP(epsilon=2.0), structure_fraction=0.25, refine_pairs=0)
    assert plan.refine is None and plan.degree == 2
    acc = PrivacyAccountant(total=PureDP(epsilon=2.0))
    spend_privbayes(acc, plan)
    names = [s.step for s in acc.spends]
    assert names == ["privbayes.structure", "privbayes.marginals"]
    assert acc.spent_epsilon == pytest.approx(2.0)
    parts = split_marginal_budget(plan.marginal_budget, [4, 100])
    assert sum(p.epsilon for p in parts) == pytest.approx(1.5)
    assert parts[1].epsilon / parts[0].epsilon == pytest.approx(5.0)
    # default: the refinement takes 1/4 of ε (2 more spends); the network splits the rest
    plan = plan_privbayes((3, 4, 5), PureDP(epsilon=2.0), structure_fraction=0.25)
    acc = PrivacyAccountant(total=PureDP(epsilon=2.0))
    spend_privbayes(acc, plan)
    assert [s.step for s in acc.spends] == ["privbayes.structure", "privbayes.marginals",
                                            "privbayes.refine.selection", "privbayes.refine.marginals"]
    assert acc.spent_epsilon == pytest.approx(2.0)
    assert plan.structure_budget.epsilon == pytest.approx(0.375)  # 0.25 · (2 − 0.5)
    assert plan.marginal_budget.epsilon == pytest.approx(1.125)
    assert plan.refine.selection_budget.epsilon == pytest.approx(0.1)
    assert plan.refine.measure_budget.epsilon == pytest.approx(0.4)


def test_measure_releases_one_table_per_family_with_budgets_summing():
    rng = np.random.default_rng(5)
    shape = (3, 2, 4, 2)
    codes = rng.integers(0, 2, (500, 4))
    fams, counts = _tables(codes, shape, 2)
    plan = plan_privbayes(shape, PureDP(epsilon=1.0))
    m = measure_privbayes(counts, fams, shape=shape, names=list("abcd"), plan=plan,
                          rs=RandomSource(seed=9))
    assert sorted(x for x, _ in m.structure) == [0, 1, 2, 3]
    assert [tuple(t.columns) for t in m.marginals] == family_specs(m.structure)
    assert sum(t.budget.epsilon for t in m.marginals) == pytest.approx(plan.marginal_budget.epsilon)
    for t in m.marginals:
        assert t.values.shape == tuple(shape[c] for c in t.columns)
        assert t.values.dtype.kind == "i"  # integer noise on released counts
    same = measure_privbayes(counts, fams, shape=shape, names=list("abcd"), plan=plan,
                             rs=RandomSource(seed=9))
    assert same.structure == m.structure
    assert all(np.array_equal(x.values, y.values) for x, y in zip(same.marginals, m.marginals))


def test_candidate_families():
    assert candidate_families(4, 2) == list(itertools.combinations(range(4), 3))
    assert candidate_families(2, 3) == [(0, 1)]


def test_empty_input_still_releases_a_valid_model():
    shape = (3, 2, 4)
    fams, counts = _tables(np.empty((0, 3), dtype=np.int64), shape, 2)
    plan = plan_privbayes(shape, PureDP(epsilon=0.5))
    m = measure_privbayes(counts, fams, shape=shape, names=list("abc"), plan=plan,
                          rs=RandomSource(seed=1))
    model = fit_privbayes(m, shape)
    codes = model.sample_codes(50, RandomSource(seed=2))
    assert codes.shape == (50, 3) and np.all(codes >= 0) and np.all(codes < np.asarray(shape))


def test_huge_declared_column_keeps_degree_for_the_others():
    """One 10⁶-cell column: families over the limit are not candidates, the degree stays, the small
    columns still get parents among themselves, the split gives the huge table a capped share, and
    sampling never builds an n × 10⁶ array."""
    from beamsynth.transforms.privbayes import family_cells

    shape = (1_000_000, 4, 40, 5)
    plan = plan_privbayes(shape, PureDP(epsilon=1.0), degree=2)
    assert plan.degree == 2
    fams = candidate_families(4, plan.degree, shape=shape, max_family_cells=plan.max_family_cells)
    assert (1, 2, 3) in fams and (0,) in fams
    assert all(family_cells(shape, f) <= plan.max_family_cells for f in fams)
    rng = np.random.default_rng(0)
    codes = np.column_stack([rng.integers(0, 1_000_000, 3000), rng.integers(0, 4, 3000), rng.integers(0, 40, 3000),
                             rng.integers(0, 5, 3000)])
    codes[:, 3] = codes[:, 1]  # a strong dependency between two small columns
    counts = [np.bincount(np.ravel_multi_index(tuple(codes[:, c] for c in f), [shape[c] for c in f]),
                          minlength=family_cells(shape, f)).reshape([shape[c] for c in f]) for f in fams]
    m = measure_privbayes(counts, fams, shape=shape, names=["a", "b", "c", "d"], plan=plan,
                          rs=RandomSource(seed=3))
    parents = dict(m.structure)
    assert all(0 not in ps for ps in parents.values()) and parents[0] == ()
    eps = {t.columns: t.budget.epsilon for t in m.marginals}
    assert eps[(0,)] < 0.95 * plan.marginal_budget.epsilon
    model = fit_privbayes(m, shape, ["a", "b", "c", "d"])
    out = model.sample_codes(2000, RandomSource(seed=4))
    assert out.shape == (2000, 4) and out[:, 0].max() < 1_000_000
    split = split_marginal_budget(PureDP(epsilon=1.0), [1_000_000, 100])
    assert split[1].epsilon == pytest.approx(10 / 110)


def test_column_over_the_family_limit_is_refused_before_data():
    """A column whose declared domain alone exceeds the per-family limit cannot be measured: the
    plan and the transform refuse it when the pipeline is built, naming the column."""
    from beamsynth.schemas.domains import IntegerDomain
    from beamsynth.schemas.schema import Column, Schema
    from beamsynth.transforms.privbayes import DPPrivBayes

    with pytest.raises(ValueError, match=r"column\(s\) 0 \(100,000,000 cells\)"):
        plan_privbayes((10**8, 3), PureDP(epsilon=1.0))
    schema = Schema(name="s", columns=(Column("big", "integer", IntegerDomain(low=0, high=10**8 - 1)),
                                       Column("small", "integer", IntegerDomain(low=0, high=2))))
    with pytest.raises(ValueError, match=r"'big' \(100,000,000 cells\).*independent"):
        DPPrivBayes(schema=schema, budget=PureDP(epsilon=1.0))


def test_one_way_estimate_is_the_weighted_mean_of_the_tables_sums_and_every_table_gets_it():
    """Issue 18: after Norm-Sub two tables holding column 0 disagree on its margin; the fit uses
    their inverse-variance weighted mean (equal weights here: same scale and size) for the root
    and gives every family table that margin (IPF), instead of the first table's sums."""
    from beamsynth.transforms.privbayes_model import _fit_network

    # [x, π] tables of children 1 and 2 of column 0; negative cells make Norm-Sub move the sums
    t1 = np.array([[40.0, -30.0], [0.0, 50.0]])   # column 0 sums before Norm-Sub: 40, 20
    t2 = np.array([[10.0, 30.0], [30.0, -10.0]])  # column 0 sums: 40, 20 (consistent already)
    ms = (_nm((1, 0), t1, 1.0), _nm((2, 0), t2, 1.0))
    structure = ((0, ()), (1, (0,)), (2, (0,)))
    tables = [norm_sub(make_consistent(ms)[i], 60.0) for i in range(2)]
    sums = [marginalize(t, (x, 0), [0]) for t, x in zip(tables, (1, 2))]
    assert not np.allclose(sums[0], sums[1])  # Norm-Sub moved them apart
    mean = (sums[0] + sums[1]) / 2
    network, targets = _fit_network(PrivBayesMeasurement(structure, ms), (2, 2, 2), None, 0.0, "iid")
    assert np.allclose(network.conditional(0)[0], mean / mean.sum(), atol=1e-9)
    for t in targets:  # each family table now has the mean as its column-0 margin
        assert np.allclose(t.proportions.sum(axis=0), mean / mean.sum(), atol=1e-6)


def test_with_margins_fits_a_table_to_given_margins_and_fills_an_empty_slice():
    from beamsynth.transforms.privbayes_model import _with_margins

    t = np.array([[6.0, 2.0], [2.0, 0.0]])
    out = _with_margins(t, (0, 1), {0: np.array([5.0, 5.0]), 1: np.array([7.0, 3.0])})
    assert out.sum() == pytest.approx(10.0)
    assert np.allclose(out.sum(axis=1), [5, 5], atol=1e-6)
    assert np.allclose(out.sum(axis=0), [7, 3], atol=1e-6)
    empty = np.array([[4.0, 4.0], [0.0, 0.0]])  # row 1 has no mass but its margin asks for some
    out = _with_margins(empty, (0, 1), {0: np.array([1.0, 1.0]), 1: np.array([1.0, 1.0])})
    assert np.allclose(out.sum(axis=1), [4, 4], atol=1e-6) and np.all(out >= 0)
