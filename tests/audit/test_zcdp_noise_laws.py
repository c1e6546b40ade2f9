"""zCDP PrivBayes (``noise="gaussian"``, issue 18): released tables follow the discrete Gaussian
law at their σ, and σ matches the planned ρ (rule 14, as tests/audit/test_mechanism_noise_laws.py
does for the Laplace tables). The true σ must pass (p > P_THRESHOLD), σ × 0.7 and × 1.3 fail."""

import numpy as np
import pytest

from beamsynth.transforms.budget import ApproxDP
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource, discrete_gaussian_pmf
from beamsynth.transforms.privbayes import (
    candidate_families,
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
)
from tests.statistical import P_THRESHOLD, discrete_gof_pvalue

pytestmark = [pytest.mark.statistical, pytest.mark.audit]


def check_gaussian_law(residuals: np.ndarray, sigma: float) -> None:
    p = {f: discrete_gof_pvalue(np.asarray(residuals), lambda k, s=sigma * f: discrete_gaussian_pmf(k, s))
         for f in (0.7, 1.0, 1.3)}
    assert p[1.0] > P_THRESHOLD and p[0.7] < P_THRESHOLD and p[1.3] < P_THRESHOLD, p


def _measure(shape, plan, seed):
    d = len(shape)
    families = [tuple(f) for f in candidate_families(d, plan.degree)]
    codes = np.zeros((50, d), dtype=np.int64)
    counts = [t.reshape([shape[c] for c in f])
              for t, f in zip(count_marginals(codes, families, shape), families)]
    return measure_privbayes(counts, families, shape=shape, names=[f"c{i}" for i in range(d)],
                             plan=plan, rs=RandomSource(seed=seed), ordered=[True] * d)


def test_gaussian_network_tables_follow_their_sigma():
    """Degree 0 (no structure, no refinement): three 7,000-cell 1-way tables share the whole ρ
    equally, so σ = m/√(2ρ/3); 21,000 residuals over records all in cell 0."""
    shape = (7000, 7000, 7000)
    budget = ApproxDP(epsilon=2.0, delta=1e-9)
    plan = gaussian_plan(plan_privbayes(shape, budget, degree=0), budget)
    assert plan.zcdp.marginal_rho == pytest.approx(plan.zcdp.rho)
    m = _measure(shape, plan, 8)
    assert {t.noise for t in m.marginals} == {"discrete Gaussian"}
    (sigma,) = {round(t.scale, 9) for t in m.marginals}
    assert sigma == pytest.approx(1 / np.sqrt(2 * plan.zcdp.rho / 3))
    assert sum(t.meta["rho"] for t in m.marginals) == pytest.approx(plan.zcdp.rho)
    residuals = np.concatenate([(t.values - (np.arange(7000) == 0) * 50).ravel() for t in m.marginals])
    check_gaussian_law(residuals, sigma)


def test_gaussian_refinement_tables_follow_their_sigma():
    """The refinement's coarse pairs at full resolution (four 64-cell columns, 64 groups, all 6
    pairs): 24,576 residuals, discrete Gaussian at ``plan.refine.sigma`` = m/√(2ρ_meas/6)."""
    shape = (64, 64, 64, 64)
    budget = ApproxDP(epsilon=2.0, delta=1e-9)
    plan = gaussian_plan(plan_privbayes(shape, budget, degree=1, refine_pairs=6, refine_rounds=2,
                                        refine_groups=64), budget, pairs=6, rounds=2, groups=64)
    assert plan.refine.pairs == 6
    assert plan.refine.sigma == pytest.approx(1 / np.sqrt(2 * plan.zcdp.measure_rho / 6))
    m = _measure(shape, plan, 9)
    tables = m.refinement.tables
    assert len(tables) == 6 and {t.noise for t in tables} == {"discrete Gaussian"}
    residuals = np.concatenate([(t.values - (np.arange(4096) == 0).reshape(64, 64) * 50).ravel()
                                for t in tables])
    check_gaussian_law(residuals, plan.refine.sigma)
