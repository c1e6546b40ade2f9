"""Explicit 1-way tables beside a zCDP PrivBayes network (H38, issue 18; docs/privbayes.md
"Twelfth session: explicit 1-way tables"): every column gets its own discrete Gaussian 1-way table
on every declared cell with GAUSSIAN_ONE_WAY_SHARE of the network tables' ρ, the families the
rest, so the released ρ still adds up to the planned ρ_marginals; pure-ε plans measure none."""

import math

import numpy as np
import pytest

import beamsynth.transforms.privbayes_measure as pm
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    candidate_families,
    fit_privbayes,
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
    spend_privbayes,
)
from beamsynth.transforms.privbayes_sizing import GAUSSIAN_ONE_WAY_SHARE, split_network_budget
from beamsynth.transforms.privbayes_structure import _family_table, family_specs
from tests.audit.test_zcdp_noise_laws import check_gaussian_law

SHAPE = (6, 3, 9, 2, 12, 4)
BUDGET = ApproxDP(epsilon=1.0, delta=1e-9)


def _codes(shape, n, seed):
    """Correlated rows (each column a noisy copy of the first), so the network has families."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 1 << 20, n)
    cols = [np.where(rng.random(n) < 0.7, base % s, rng.integers(0, s, n)) for s in shape]
    return np.stack(cols, axis=1).astype(np.int64)


def _measure(shape, plan, codes, seed):
    d = len(shape)
    fams = [tuple(f) for f in candidate_families(d, plan.degree, shape=shape,
                                                 max_family_cells=plan.max_family_cells)]
    counts = [t.reshape([shape[c] for c in f])
              for t, f in zip(count_marginals(codes, fams, shape), fams)]
    m = measure_privbayes(counts, fams, shape=shape, names=[f"c{i}" for i in range(d)],
                          plan=plan, rs=RandomSource(seed=seed), ordered=[True] * d)
    return m, {f: t for f, t in zip(fams, counts)}


def _zcdp_plan(shape, m=1, refine=True):
    kw = {"refine_pairs": 4, "refine_rounds": 2} if refine else {"refine_pairs": 0}
    plan = plan_privbayes(shape, BUDGET, degree=1, max_contributions=m, **kw)
    return gaussian_plan(plan, BUDGET, pairs=4 if refine else 0, rounds=2)


def explicit_tables(m, d):
    """The released explicit 1-way tables: the last ones, one per column that is not already
    released as a (parentless) 1-way family table."""
    singles = {s[0] for s in family_specs(m.structure) if len(s) == 1}
    k = d - len(singles)
    return list(m.marginals[len(m.marginals) - k:]), singles


def check_released_rho(m, plan, d):
    """Exact spend of a zCDP network's tables: families + explicit 1-way tables add up to the
    planned ρ_marginals; the explicit ones get GAUSSIAN_ONE_WAY_SHARE of it, each σ = m/√(2ρ_i)."""
    z = plan.zcdp
    rhos = [t.meta["rho"] for t in m.marginals]
    assert sum(rhos) == pytest.approx(z.marginal_rho, rel=1e-12)
    ones, singles = explicit_tables(m, d)
    assert sorted(t.columns[0] for t in ones) == sorted(set(range(d)) - singles)
    assert all(len(t.columns) == 1 for t in ones)
    assert sum(t.meta["rho"] for t in ones) == pytest.approx(GAUSSIAN_ONE_WAY_SHARE * z.marginal_rho,
                                                             rel=1e-12)
    for t in m.marginals:
        assert t.scale == pytest.approx(plan.max_contributions / math.sqrt(2 * t.meta["rho"]),
                                        rel=1e-12)


@pytest.mark.parametrize("m,refine", [(1, True), (2, True), (1, False)])
def test_zcdp_network_spends_exactly_its_rho_with_the_one_way_tables(m, refine):
    codes = _codes(SHAPE, 3000, 1)
    plan = _zcdp_plan(SHAPE, m, refine)
    for seed in range(4):
        out, _ = _measure(SHAPE, plan, codes, seed)
        check_released_rho(out, plan, len(SHAPE))
        assert (out.refinement is not None) == refine
    # the plan's one (ε, δ) spend is unchanged: its ρ parts still add up to ρ
    acc = PrivacyAccountant(total=BUDGET)
    spend_privbayes(acc, plan)
    spend = acc.to_dict()["spends"][-1]
    assert sum(p["rho"] for p in spend["details"]["parts"].values()) == pytest.approx(
        spend["details"]["rho"], rel=1e-12)
    assert acc.spent_epsilon == pytest.approx(BUDGET.epsilon, rel=1e-12)
    # the manifest names the 1-way tables and their share of ρ_marginals
    part = spend["details"]["parts"]["marginals"]
    assert "every column's 1-way marginal" in part["mechanism"]
    assert part["split"].startswith(f"{GAUSSIAN_ONE_WAY_SHARE:g} of ρ on the 1-way tables")


def test_broken_variant_spending_the_share_twice_is_caught():
    """The check above fails on a release whose families keep the whole ρ_marginals while the
    1-way tables get their share on top (the share spent twice)."""
    codes = _codes(SHAPE, 3000, 1)
    plan = _zcdp_plan(SHAPE)
    good, counts = _measure(SHAPE, plan, codes, 0)
    specs = family_specs(good.structure)
    ones = [(c,) for c in range(len(SHAPE)) if (c,) not in specs]
    exact = [_family_table(counts, s) for s in specs]
    z = plan.zcdp
    fams = pm._release_tables(exact, specs, [f"c{i}" for i in range(len(SHAPE))], [], plan,
                              RandomSource(seed=0), z.marginal_rho)
    extra = pm._release_tables([_family_table(counts, s) for s in ones], ones,
                               [f"c{i}" for i in range(len(SHAPE))], [], plan,
                               RandomSource(seed=1), GAUSSIAN_ONE_WAY_SHARE * z.marginal_rho)
    broken = pm.PrivBayesMeasurement(good.structure, (*fams, *extra))
    with pytest.raises(AssertionError):
        check_released_rho(broken, plan, len(SHAPE))


def test_laplace_network_measures_no_explicit_one_way_tables():
    """Pure ε: the released tables are the network's families only (there explicit 1-way tables
    do not pay: docs/privbayes.md), ε_t by split_network_budget (√cells moved toward the 1-way
    margins, H59) adding up to ε_marginals."""
    codes = _codes(SHAPE, 3000, 2)
    plan = plan_privbayes(SHAPE, PureDP(epsilon=1.0), degree=1, refine_pairs=0)
    out, _ = _measure(SHAPE, plan, codes, 0)
    assert [t.columns for t in out.marginals] == family_specs(out.structure)
    want = split_network_budget(plan.marginal_budget, [t.columns for t in out.marginals], SHAPE)
    assert [t.budget.epsilon for t in out.marginals] == pytest.approx([b.epsilon for b in want])
    assert sum(t.budget.epsilon for t in out.marginals) == pytest.approx(plan.marginal_budget.epsilon)


def test_one_way_tables_cover_every_declared_cell_and_feed_the_fit():
    """A column whose declared cells the data never reach still gets noise on every cell of its
    1-way table; the fit (post-processing) uses the explicit tables."""
    shape = (40, 3, 5)
    codes = _codes((2, 3, 5), 2000, 3)  # column 0 uses only 2 of its 40 cells
    plan = _zcdp_plan(shape, refine=False)
    out, _ = _measure(shape, plan, codes, 4)
    ones, singles = explicit_tables(out, len(shape))
    by_col = {t.columns[0]: t for t in ones}
    for c in set(range(len(shape))) - singles:
        t = by_col[c]
        assert t.values.shape == (shape[c],)
    if 0 not in singles:
        assert np.count_nonzero(by_col[0].values[2:]) > 0  # noise on the 38 empty cells
    model = fit_privbayes(out, shape)
    assert model.sample_codes(100, RandomSource(seed=5)).shape == (100, len(shape))


@pytest.mark.statistical
@pytest.mark.audit
def test_explicit_one_way_tables_follow_their_planned_sigma():
    """Residuals of the explicit 1-way tables (equal declared sizes, so one σ) against the
    discrete Gaussian at σ = m/√(2·share·ρ_m/k): the true σ passes, ×0.7 and ×1.3 fail
    (false-failure rate P_THRESHOLD per check, tests/statistical)."""
    shape = (400,) * 5
    plan = _zcdp_plan(shape, refine=False)
    codes = np.zeros((50, len(shape)), dtype=np.int64)
    residuals = []
    for seed in range(8):
        out, _ = _measure(shape, plan, codes, seed)
        ones, _ = explicit_tables(out, len(shape))
        sigma = 1 / math.sqrt(2 * GAUSSIAN_ONE_WAY_SHARE * plan.zcdp.marginal_rho / len(ones))
        assert {round(t.scale, 9) for t in ones} == {round(sigma, 9)}
        residuals += [(t.values - (np.arange(400) == 0) * 50).ravel() for t in ones]
        check_released_rho(out, plan, len(shape))
    residuals = np.concatenate(residuals)
    assert residuals.size >= 12_000
    check_gaussian_law(residuals, sigma)
