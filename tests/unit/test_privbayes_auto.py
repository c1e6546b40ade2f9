"""H47 (issue 18): ``--pb-noise auto`` picks Gaussian only where its tables pay, and the zCDP
refinement is sized down at small ``n̂·√ρ`` (fewer pairs at the planned σ, the rest of ρ on the
network's tables). Both rules read public values only; the spends stay exact."""

from __future__ import annotations

import math

import numpy as np
import pytest

import beamsynth.transforms.privbayes_sizing as sizing_mod
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, zcdp_rho
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.privbayes import (
    candidate_families,
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
    spend_privbayes,
)
from beamsynth.transforms.privbayes_plan import (
    AUTO_MAX_SIGMA_RATIO,
    auto_sigma_ratio,
    resolve_noise,
)
from beamsynth.transforms.privbayes_sizing import (
    gaussian_refine_coarse_cells,
    gaussian_refine_pairs_down,
    gaussian_refine_rho,
)

ADULT = (14, 9, 14, 16, 16, 7, 15, 6, 5, 2, 12, 10, 14, 42, 2)
PUMS = (13, 2, 17, 7, 11, 2)  # benchmarks/schemas/pums_small.yaml
NLTCS = (2,) * 16


# -- 1. auto: gaussian only where the Gaussian network tables are not much noisier ----------------
@pytest.mark.parametrize(("shape", "eps", "chosen"), [
    (PUMS, 2.0, "laplace"), (PUMS, 0.5, "laplace"), (ADULT, 1.0, "gaussian"),
    (NLTCS, 0.5, "gaussian"), ((5,) * 41, 1.0, "gaussian")])
def test_auto_picks_gaussian_only_where_its_tables_pay(shape, eps, chosen):
    """PUMS' 6 columns: σ/std 1.83-1.94 > 1.5 → laplace (its Gaussian network lost TVD1 by
    +0.0166 ± 0.0027 at ε = 2); Adult/NLTCS (15-16 columns, 1.12-1.23) and census-wide schemas
    stay gaussian. δ = 0 is laplace whatever the width; a requested mode is never changed."""
    got, why = resolve_noise("auto", 1e-9, n_columns=len(shape), epsilon=eps)
    assert got == chosen
    assert f"{auto_sigma_ratio(len(shape), eps, 1e-9):.2f}" in why
    assert (auto_sigma_ratio(len(shape), eps, 1e-9) > AUTO_MAX_SIGMA_RATIO) == (chosen == "laplace")
    assert resolve_noise("auto", 0.0, n_columns=len(shape), epsilon=eps)[0] == "laplace"
    assert resolve_noise("gaussian", 1e-9, n_columns=len(shape), epsilon=eps)[0] == "gaussian"
    assert resolve_noise("auto", 1e-9)[0] == "gaussian"  # without the shape: δ alone, as before


def test_auto_sigma_ratio_is_the_two_plans_table_noise():
    """The ratio is the planned family σ of the Gaussian plan over the Laplace plan's table std
    (equal split over d; public rows large enough that neither plan is resized)."""
    budget = ApproxDP(epsilon=1.0, delta=1e-9)
    lap = plan_privbayes(ADULT, ApproxDP(epsilon=1.0, delta=0.0), sizing="off")
    gau = gaussian_plan(plan_privbayes(ADULT, budget, sizing="off", refine_pairs=40,
                                       refine_groups=8), budget)
    d = len(ADULT)
    std = math.sqrt(2) * d / lap.marginal_budget.epsilon
    sigma = math.sqrt(d / (2 * 0.8 * gau.zcdp.marginal_rho))
    assert auto_sigma_ratio(d, 1.0, 1e-9) == pytest.approx(sigma / std, rel=1e-9)


def test_auto_on_a_narrow_schema_plans_and_spends_the_laplace_plan():
    """Through DPPrivBayes: auto with δ > 0 on PUMS' 6 columns spends the pure plan (δ = 0 spent)
    and says why; on Adult's 15 it spends the zCDP plan."""
    from beamsynth.schemas.domains import CategoricalDomain
    from beamsynth.schemas.schema import Column, Schema
    from beamsynth.transforms.privbayes import DPPrivBayes

    def schema(shape):
        return Schema("t", [Column(f"c{i}", "categorical", CategoricalDomain([str(v) for v in range(c)]))
                       for i, c in enumerate(shape)])

    for shape, zcdp in ((PUMS, False), (ADULT, True)):
        acc = PrivacyAccountant(total=ApproxDP(epsilon=2.0, delta=1e-9))
        t = DPPrivBayes(schema=schema(shape), budget=ApproxDP(epsilon=2.0, delta=1e-9),
                        sizing="auto", noise="auto", accountant=acc, seed=1)
        assert (t.plan.zcdp is not None) == zcdp
        assert acc.spent_epsilon == pytest.approx(2.0)
        assert acc.spent_delta == (1e-9 if zcdp else 0.0)
        assert ("δ is not used" in t.noise_reason) == (not zcdp)


# -- 2. the zCDP refinement sized down at small n̂·√ρ -------------------------------------------
def _dp_count_plan(shape, eps, m=1):
    budget = ApproxDP(epsilon=eps, delta=1e-9)
    return gaussian_plan(plan_privbayes(shape, budget, sizing="auto", max_contributions=m,
                                        refine_pairs=40, refine_groups=8), budget)


def test_coarse_cells_are_the_declared_ones():
    assert gaussian_refine_coarse_cells(NLTCS, 8) == 4.0
    assert gaussian_refine_coarse_cells((2, 20), 8) == 16.0
    assert gaussian_refine_coarse_cells(ADULT, 8) == pytest.approx(
        np.mean([min(8, a) * min(8, b) for i, a in enumerate(ADULT) for b in ADULT[i + 1:]]))


@pytest.mark.parametrize(("shape", "rows", "eps", "pairs"), [
    (ADULT[:13] + (14, 2), 32_561, 1.0, 40),  # Adult at ε = 1 keeps the tuned 40
    (NLTCS, 1_000, 0.5, 15), (NLTCS, 1_000, 1.0, 24), (NLTCS, 1_000, 2.0, 38),
    (ADULT, 1_000_000, 1.0, 40), (NLTCS, 1, 1.0, 3)])
def test_refinement_sized_down_keeps_its_sigma(shape, rows, eps, pairs):
    """The rule's values (DP count path, n̂ = rows): Adult ε = 1 keeps 40 (49 uncapped), NLTCS
    1,000 15 / 24 / 38; the floor is 3 pairs; the kept pairs have the planned σ and ε per pick."""
    plan = _dp_count_plan(shape, eps)
    got = plan.sizing.refine_plan(rows, plan.refine)
    assert got.pairs == pairs
    assert got.sigma == pytest.approx(plan.refine.sigma, rel=1e-12)
    assert got.pick_epsilon == pytest.approx(plan.refine.pick_epsilon, rel=1e-12)
    assert got.rounds == min(plan.refine.rounds, pairs)
    assert gaussian_refine_rho(got) == pytest.approx(gaussian_refine_rho(plan.refine) * pairs / 40)


def test_switch_off_restores_the_planned_pairs(monkeypatch):
    """The switch is read when the plan is built and carried in its sizing (``refine_down``):
    a worker's fresh module does not change a plan built in the launcher (fifteenth session)."""
    on = _dp_count_plan(NLTCS, 0.5)
    monkeypatch.setattr(sizing_mod, "GAUSSIAN_REFINE_DOWN", False)  # the launcher
    plan = _dp_count_plan(NLTCS, 0.5)
    assert not plan.sizing.refine_down
    monkeypatch.setattr(sizing_mod, "GAUSSIAN_REFINE_DOWN", True)  # a worker's fresh module
    assert plan.sizing.refine_plan(1_000, plan.refine) is plan.refine
    assert on.sizing.refine_plan(1_000, on.refine).pairs == 15
    assert gaussian_refine_pairs_down(1_000, 0.0016, NLTCS, planned=40, groups=8,
                                      enabled=False) == 40  # the plan's value, not the module's


def test_band_switch_is_the_plans_not_the_workers(monkeypatch):
    """``BAND_FOR_ZCDP`` is read when the plan is built (``NetworkSizing.band_for_zcdp``): a zCDP
    plan built with it off never takes the band's forest, even in a worker whose module says on;
    built with it on, it does where the band resolves (Adult shape, n̂ in the band)."""
    rows = [n for n in range(2_000, 40_000, 500)
            if _dp_count_plan(ADULT, 1.0).sizing._band_forest(n) is not None]
    assert rows  # the band exists for this plan
    monkeypatch.setattr(sizing_mod, "BAND_FOR_ZCDP", False)  # the launcher
    plan = _dp_count_plan(ADULT, 1.0)
    assert not plan.sizing.band_for_zcdp
    monkeypatch.setattr(sizing_mod, "BAND_FOR_ZCDP", True)  # a worker's fresh module
    assert plan.sizing._band_forest(rows[0]) is None


@pytest.mark.parametrize("m", [1, 2])
def test_public_rows_move_the_dropped_rho_to_the_tables(m):
    """With --input-rows the cut is planned at build time: the parts still add up to ρ exactly,
    and the network tables get the dropped pairs' ρ (NLTCS 1,000 rows a unit at ε = 0.5: 0.45 → 0.76 of ρ)."""
    budget = ApproxDP(epsilon=0.5, delta=1e-9)
    base = plan_privbayes(NLTCS, budget, sizing="auto", rows=1_000 * m, max_contributions=m,
                          refine_pairs=40, refine_groups=8)
    plan = gaussian_plan(base, budget)
    z = plan.zcdp
    assert z.spent_rho == pytest.approx(z.rho, rel=1e-12) and z.rho == zcdp_rho(0.5, 1e-9)
    assert plan.refine.pairs < 40
    kept = plan.refine.pairs / 40
    assert z.marginal_rho == pytest.approx(z.rho * (0.45 + 0.52 * (1 - kept)), rel=1e-9)
    assert z.measure_rho == pytest.approx(z.rho * 0.42 * kept, rel=1e-9)
    assert plan.refine.table_rho * plan.refine.pairs == pytest.approx(z.measure_rho, rel=1e-12)
    acc = PrivacyAccountant(total=budget)
    spend_privbayes(acc, plan)
    assert (acc.spent_epsilon, acc.spent_delta) == pytest.approx((0.5, 1e-9))


def test_run_time_cut_releases_the_dropped_rho_on_the_tables():
    """DP count path: the measurement's released tables carry ρ_marginals + the dropped pairs'
    ρ, the refinement's tables the rest, and together the planned ρ (network + refinement)."""
    plan = _dp_count_plan(NLTCS, 1.0)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 2, size=(1_000, 16))
    codes[:, 1] = codes[:, 0]
    fams = candidate_families(16, plan.degree, shape=NLTCS, max_family_cells=plan.max_family_cells)
    counts = [c.reshape([NLTCS[i] for i in f]) for c, f in zip(count_marginals(codes, fams, NLTCS), fams)]
    out = measure_privbayes(counts, fams, shape=NLTCS, names=[f"c{i}" for i in range(16)],
                            plan=plan, rs=RandomSource(seed=3))
    assert out.sizing["degree"] == 1 and out.sizing["refine_pairs"] < 40
    tables = sum(t.meta["rho"] for t in out.marginals)
    refined = sum(t.meta["rho"] for t in out.refinement.tables)
    z = plan.zcdp
    dropped = (z.selection_rho + z.measure_rho) * (1 - out.sizing["refine_pairs"] / 40)
    assert tables == pytest.approx(z.marginal_rho + dropped, rel=1e-9)
    assert refined == pytest.approx(z.measure_rho * out.sizing["refine_pairs"] / 40, rel=1e-9)
