"""zCDP pieces of issue 18: the discrete Gaussian sampler, the ρ ↔ (ε, δ) conversion, and the
``noise="gaussian"`` PrivBayes plan (its ρ parts add up to the budget's ρ, one (ε, δ) spend)."""

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP, zcdp_delta, zcdp_rho
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import (
    RandomSource,
    discrete_gaussian,
    discrete_gaussian_pmf,
    discrete_gaussian_variance,
)
from beamsynth.transforms.privbayes import gaussian_plan, plan_privbayes, spend_privbayes

ADULT_SHAPE = (14, 9, 14, 16, 16, 7, 15, 6, 5, 2, 12, 10, 14, 42, 2)


@pytest.mark.parametrize("sigma", [0.6, 3.0, 25.0])
def test_discrete_gaussian_matches_its_pmf(sigma):
    z = discrete_gaussian(RandomSource(seed=11).child("dg", sigma), sigma, 40_000)
    assert z.dtype == np.int64
    k = int(math.ceil(3 * sigma)) + 1  # bins -k..k, the two outer ones hold the tails
    ks = np.arange(-k, k + 1)
    obs = np.bincount(np.clip(z, -k, k) + k, minlength=ks.size)
    exp = discrete_gaussian_pmf(ks, sigma)
    tail = 0.5 * (1 - exp[1:-1].sum())
    exp[0] = exp[-1] = tail
    assert stats.chisquare(obs, exp / exp.sum() * z.size).pvalue > 1e-4
    assert z.var() == pytest.approx(discrete_gaussian_variance(sigma), rel=0.05)


def test_discrete_gaussian_wrong_sigma_is_rejected_and_draws_are_keyed():
    z = discrete_gaussian(RandomSource(seed=2).child("x"), 3.0, 40_000)
    ks = np.arange(-30, 31)
    obs = np.bincount(np.clip(z, -30, 30) + 30, minlength=61)
    exp = discrete_gaussian_pmf(ks, 3.9) * z.size
    assert stats.chisquare(obs[5:56], exp[5:56] * obs[5:56].sum() / exp[5:56].sum()).pvalue < 1e-6
    again = discrete_gaussian(RandomSource(seed=2).child("x"), 3.0, 40_000)
    assert np.array_equal(z, again)
    with pytest.raises(ValueError):
        discrete_gaussian(RandomSource(seed=2), 0.0, 3)


def test_zcdp_rho_matches_private_pgm_and_inverts_delta():
    # AIM (private-pgm cdp_rho) logs 0.014973057673588523 for (1, 1e-9)
    assert zcdp_rho(1.0, 1e-9) == pytest.approx(0.014973057673588523, rel=1e-9)
    for eps, delta in ((0.5, 1e-9), (2.0, 1e-6), (5.0, 1e-9)):
        rho = zcdp_rho(eps, delta)
        assert zcdp_delta(rho, eps) <= delta * (1 + 1e-9)
        assert zcdp_delta(rho * 1.001, eps) > delta
        # tighter than Bun & Steinke's ε = ρ + 2√(ρ ln 1/δ)
        assert rho + 2 * math.sqrt(rho * math.log(1 / delta)) > eps
    with pytest.raises(ValueError):
        zcdp_rho(1.0, 0.0)


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("rows", [32561, None])
def test_gaussian_plan_spends_exactly_its_rho(rows, m):
    """With public rows: one (ε, δ) zCDP spend, ρ = zcdp_rho(ε, δ). Without: the DP size count's
    own pure (ε_c, 0) spend and a (ε − ε_c, δ) zCDP spend with ρ = zcdp_rho(ε − ε_c, δ) (basic
    composition of the two; issue 18, H37). Each part's ρ from its mechanism's parameters."""
    budget = ApproxDP(epsilon=1.0, delta=1e-9)
    plan = gaussian_plan(plan_privbayes(ADULT_SHAPE, budget, sizing="auto", rows=rows,
                                        max_contributions=m), budget)
    z, d = plan.zcdp, len(ADULT_SHAPE)
    eps_c = 0.0 if rows is not None else 0.02 * budget.epsilon
    assert z.count_epsilon == pytest.approx(eps_c, rel=1e-12)
    assert (z.budget.epsilon, z.budget.delta) == (pytest.approx(1.0 - eps_c, rel=1e-12), 1e-9)
    assert z.rho == pytest.approx(zcdp_rho(1.0 - eps_c, 1e-9), rel=1e-12)
    assert z.spent_rho == pytest.approx(z.rho, rel=1e-12)
    # each part's ρ from its mechanism's parameters
    assert (d - 1) * plan.step_epsilon ** 2 / 2 == pytest.approx(z.structure_rho)
    assert plan.refine.pairs * plan.refine.pick_epsilon ** 2 / 2 == pytest.approx(z.selection_rho)
    assert plan.refine.pairs * m ** 2 / (2 * plan.refine.sigma ** 2) == pytest.approx(z.measure_rho)
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, plan)
    spends = acc.to_dict()["spends"]
    want = [("privbayes.zcdp", 1.0 - eps_c, 1e-9)]
    if rows is None:
        want.insert(0, ("privbayes.size_count", eps_c, 0.0))
        assert spends[0]["details"]["sensitivity"] == m
        assert "basic composition" in spends[1]["details"]["size_count"]
    assert [(s["step"], s["epsilon"], s["delta"]) for s in spends] == [
        (step, pytest.approx(e, rel=1e-12), d_) for step, e, d_ in want]
    assert sum(p["rho"] for p in spends[-1]["details"]["parts"].values()) == pytest.approx(z.rho)
    assert acc.spent_epsilon == pytest.approx(1.0, rel=1e-12)
    assert acc.spent_delta == pytest.approx(1e-9)


def test_gaussian_plan_needs_delta():
    with pytest.raises(ValueError, match="delta"):
        gaussian_plan(plan_privbayes(ADULT_SHAPE, PureDP(epsilon=1.0)), PureDP(epsilon=1.0))


def test_table_l2_sensitivity_is_at_most_m():
    """Removing one unit's ≤ m records changes a count table by ≤ m in L2 (≤ L1 = m): the σ
    calibration of the Gaussian tables."""
    rng = np.random.default_rng(0)
    shape = (4, 3, 5)
    codes = rng.integers(0, 3, (200, 3))
    for m in (1, 3):
        for _ in range(50):
            drop = rng.choice(200, m, replace=False)
            rest = np.delete(codes, drop, axis=0)
            for spec in ((0,), (0, 1), (0, 1, 2)):
                a = count_marginals(codes, [spec], shape)[0].astype(float)
                b = count_marginals(rest, [spec], shape)[0].astype(float)
                assert np.linalg.norm(a - b) <= m + 1e-12


def _small_input_run(n: int, *, m: int = 1, plan=None, strong: bool = True):
    """measure_privbayes of a noise="gaussian" plan without public rows (the DP count path) on
    ``n`` Adult-shaped records (columns 0/1 strongly dependent)."""
    from beamsynth.transforms.privbayes import candidate_families, measure_privbayes

    budget = ApproxDP(epsilon=1.0, delta=1e-9)
    if plan is None:
        plan = gaussian_plan(plan_privbayes(ADULT_SHAPE, budget, sizing="auto",
                                            max_contributions=m), budget)
    assert plan.sizing.count_budget is not None and plan.forest is None
    rng = np.random.default_rng(3)
    codes = np.stack([rng.integers(0, c, n) for c in ADULT_SHAPE], axis=1)
    if strong:
        codes[:, 1] = codes[:, 0] % ADULT_SHAPE[1]  # one strong pair, so edges get chosen
    fams = candidate_families(len(ADULT_SHAPE), plan.degree, shape=ADULT_SHAPE,
                              max_family_cells=plan.max_family_cells)
    counts = count_marginals(codes, fams, ADULT_SHAPE)
    counts = [c.reshape([ADULT_SHAPE[i] for i in f]) for c, f in zip(counts, fams)]
    names = [f"c{i}" for i in range(len(ADULT_SHAPE))]
    return plan, measure_privbayes(counts, fams, shape=ADULT_SHAPE, names=names, plan=plan,
                                   rs=RandomSource(seed=0))


@pytest.mark.parametrize("m", [1, 2])
def test_gaussian_small_input_forest_gets_exactly_epsilon_minus_the_count(m):
    """--pb-noise gaussian without --input-rows, the DP count finds no θ-useful network: the
    forest (pure-DP permute-and-flip steps and discrete Laplace tables) gets exactly ε − ε_c in
    all, the Laplace plan's forest budget, covered by the (ε − ε_c, δ) spend (basic composition
    with the count's ε_c). Before H37 it got forest_zcdp_epsilon(ρ − ε_c²/2) ≈ 0.63 at ε = 1,
    δ = 1e-9 (fails here); given ε instead of ε − ε_c it would overspend (fails too). Eighth
    session: it was given the network's Laplace-equivalent ε, 2.08."""
    plan, m_ = _small_input_run(3000 * m, m=m)
    assert m_.sizing["degree"] == 0 and m_.sizing["forest_steps"] > 0  # the forest path ran
    from beamsynth.transforms.privbayes import plan_forest

    forest = plan_forest(m_.sizing["rows_hat"], plan.zcdp.budget.epsilon, ADULT_SHAPE,
                         max_contributions=m)
    assert forest.steps == m_.sizing["forest_steps"]
    tables = sum(t.sensitivity / t.scale for t in m_.marginals)  # discrete Laplace: ε = m/b
    assert all(t.noise != "discrete Gaussian" and t.sensitivity == m for t in m_.marginals)
    assert tables + forest.steps * forest.step_epsilon == pytest.approx(1.0 - plan.zcdp.count_epsilon,
                                                                        rel=1e-9)
    laplace = plan_privbayes(ADULT_SHAPE, ApproxDP(epsilon=1.0, delta=1e-9), sizing="auto",
                             max_contributions=m)  # the Laplace plan's run-time forest budget
    assert plan.zcdp.budget.epsilon == pytest.approx(
        laplace.marginal_budget.epsilon + laplace.structure_budget.epsilon
        + laplace.refine.selection_budget.epsilon + laplace.refine.measure_budget.epsilon, rel=1e-12)


def test_gaussian_small_input_one_way_tables_spend_exactly_rho_of_the_rest():
    """No forest either (40 records): discrete Gaussian 1-way tables whose ρ adds up to
    zcdp_rho(ε − ε_c, δ) exactly (ρ computed from ε would fail)."""
    plan, m_ = _small_input_run(40, strong=False)
    assert m_.sizing["degree"] == 0 and m_.sizing["forest_steps"] == 0
    assert all(t.noise == "discrete Gaussian" for t in m_.marginals) and len(m_.marginals) == 15
    assert sum(t.meta["rho"] for t in m_.marginals) == pytest.approx(
        zcdp_rho(1.0 - plan.zcdp.count_epsilon, 1e-9), rel=1e-9)


# -- the zCDP refinement's size on wide tables (H29, docs/privbayes.md "Twelfth session") ----------
def _census_shape():
    from beamsynth.schemas.schema import load_schema

    return tuple(load_schema("census_kdd").shape)


def _refine_rhos(refine):
    """(ρ_sel, ρ_meas) from a refinement plan's own parameters: P picks of ε²/2, P tables of
    m²/(2σ²)."""
    m = refine.max_contributions
    return (refine.pairs * refine.pick_epsilon ** 2 / 2,
            refine.pairs * m ** 2 / (2 * refine.sigma ** 2))


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_gaussian_refinement_follows_rows_on_wide_tables_only(eps):
    """census_kdd (41 columns, 199,523 rows): 61 pairs (⌊1.5·d⌋) in 13 rounds (≤ 5 picks a round), from
    --input-rows at build time or the DP count at run time; Adult and ACS keep the tuned 40
    pairs in 3 rounds at ε ≥ 1 (31-32 at ε = 0.5, H47); a smaller census_kdd input is sized down (H47)."""
    from beamsynth.schemas.schema import load_schema

    budget = ApproxDP(epsilon=eps, delta=1e-9)
    census = _census_shape()

    def plan(shape, rows):
        return gaussian_plan(plan_privbayes(shape, budget, sizing="auto", rows=rows,
                                            refine_pairs=40, refine_groups=8), budget)

    public = plan(census, 199_523)
    assert (public.refine.pairs, public.refine.rounds) == (61, 13)
    run_time = plan(census, None)
    assert (run_time.refine.pairs, run_time.refine.rounds) == (40, 3)  # planned; n̂ decides
    chosen = run_time.sizing.refine_plan(199_523, run_time.refine)
    assert (chosen.pairs, chosen.rounds) == (61, 13)
    assert run_time.sizing.refine_largest(run_time.refine).pairs == 61
    small = run_time.sizing.refine_plan(5_000, run_time.refine)  # sized down (H47), same σ
    assert small.pairs < 40 and small.sigma == pytest.approx(run_time.refine.sigma)
    for name, rows in (("adult", 32_561), ("acs_national", 27_253)):
        shape = tuple(load_schema(name).shape)
        for p in (plan(shape, rows), plan(shape, None)):
            got = p.sizing.refine_plan(rows, p.refine) if p.sizing.rows is None else p.refine
            if eps >= 1:
                assert (got.pairs, got.rounds) == (40, 3), name
            elif got is not None:  # ε = 0.5: the downward rule (H47) keeps 31-32 pairs
                assert 30 <= got.pairs < 40 and got.rounds == 3, name


@pytest.mark.parametrize("rows", [199_523, None])
def test_gaussian_wide_refinement_spends_exactly_its_rho(rows):
    """Whatever P the rule picks (build time or run time), the P picks and P tables cost the
    planned ρ_sel and ρ_meas, and the parts add up to ρ: the (ε, δ) spend stays exact."""
    budget = ApproxDP(epsilon=1.0, delta=1e-9)
    plan = gaussian_plan(plan_privbayes(_census_shape(), budget, sizing="auto", rows=rows,
                                        refine_pairs=40, refine_groups=8), budget)
    z = plan.zcdp
    assert z.spent_rho == pytest.approx(z.rho, rel=1e-12)
    refines = [plan.refine]
    if rows is None:
        refines += [plan.sizing.refine_plan(199_523, plan.refine),
                    plan.sizing.refine_plan_for(plan.refine, 61)]
    for refine in refines:
        sel, meas = _refine_rhos(refine)
        assert sel == pytest.approx(z.selection_rho, rel=1e-12)
        assert meas == pytest.approx(z.measure_rho, rel=1e-12)
        assert refine.table_rho >= 2.5e-5 - 1e-15  # the ρ floor per table
    assert refines[-1].pairs == 61


def test_gaussian_refinement_manifest_says_which_rule():
    budget = ApproxDP(epsilon=1.0, delta=1e-9)
    public = gaussian_plan(plan_privbayes(_census_shape(), budget, sizing="auto", rows=199_523,
                                          refine_pairs=40, refine_groups=8), budget)
    sizing = public.details()["sizing"]
    assert "κ_G" in sizing["refine_pairs_rule"] and sizing["refine_pairs_for_rows"] == 61
    assert "public input row count" in sizing["refine_pairs_source"]
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, public)
    parts = acc.to_dict()["spends"][0]["details"]["parts"]
    assert parts["refine.marginals"]["tables"] == 61 and parts["refine.marginals"]["rounds"] == 13
    assert "largest" not in parts["refine.marginals"]
    run_time = gaussian_plan(plan_privbayes(_census_shape(), budget, sizing="auto",
                                            refine_pairs=40, refine_groups=8), budget)
    details = run_time.details()
    assert "DP count" in details["sizing"]["refine_pairs_source"]
    assert details["refine"]["largest"]["pairs"] == 61
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, run_time)
    assert [s["step"] for s in acc.to_dict()["spends"]] == ["privbayes.size_count", "privbayes.zcdp"]
    parts = acc.to_dict()["spends"][1]["details"]["parts"]
    largest = parts["refine.marginals"]["largest"]
    assert largest["tables"] == 61 and largest["rounds"] == 13
    assert "gaussian_refine_size" in largest["note"]
    assert sum(p["rho"] for p in parts.values()) == pytest.approx(run_time.zcdp.rho, rel=1e-12)


def test_gaussian_run_time_refinement_releases_the_chosen_tables_at_the_planned_rho():
    """The measurement step (DP count path) on a wide input: the rule's P tables are released,
    each with its σ, and their ρ adds up to the planned ρ_meas."""
    from beamsynth.transforms.privbayes import candidate_families, measure_privbayes

    shape = (3,) * 16
    budget = ApproxDP(epsilon=1.0, delta=1e-9)
    plan = gaussian_plan(plan_privbayes(shape, budget, sizing="auto", refine_pairs=10,
                                        refine_groups=8), budget, pairs=10)
    assert plan.refine.pairs == 10 and plan.sizing.count_budget is not None
    # a 20,000-row pool (the floor, not 160,000): post-processing; the tables, σ and ρ do not read it
    plan = dataclasses.replace(plan, refine=dataclasses.replace(plan.refine, pool_rows=20_000))
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 3, (20_000, len(shape)))
    codes[:, 1::2] = (codes[:, 0::2] + (rng.random((20_000, 8)) < 0.2)) % 3
    fams = candidate_families(len(shape), plan.degree, shape=shape,
                              max_family_cells=plan.max_family_cells)
    counts = [c.reshape([shape[i] for i in f]) for c, f in zip(count_marginals(codes, fams, shape), fams)]
    m = measure_privbayes(counts, fams, shape=shape, names=[f"c{i}" for i in range(len(shape))],
                          plan=plan, rs=RandomSource(seed=1))
    chosen = plan.sizing.refine_plan(m.sizing["rows_hat"], plan.refine)
    assert m.sizing["refine_pairs"] == chosen.pairs == 24 and m.sizing["refine_rounds"] == 5
    tables = m.refinement.tables
    assert len(tables) == 24 and {t.scale for t in tables} == {chosen.sigma}
    assert sum(t.meta["rho"] for t in tables) == pytest.approx(plan.zcdp.measure_rho, rel=1e-12)
