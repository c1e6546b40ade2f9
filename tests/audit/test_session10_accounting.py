"""Session 10 audit (H24): the accounting of the least-audited paths, checked by computation.

* zCDP / discrete Gaussian mode (``noise="gaussian"``): the ρ → (ε, δ) conversion recomputed
  independently (Canonne, Kamath & Steinke 2020, Cor. 13, dense grid over α); every noise and
  selection call of one measurement recorded and its zCDP cost summed (ε-DP → ε²/2, Bun & Steinke
  2016 Prop. 1.4; discrete Gaussian of L2 sensitivity m → m²/(2σ²), CKS Thm. 4) against the ρ the
  (ε, δ) spend covers; the discrete Gaussian sampler's tails.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
from scipy import optimize

import beamsynth.transforms.noise as noise
from beamsynth.transforms import measure as measure_mod
from beamsynth.transforms import privbayes_measure as pbm
from beamsynth.transforms import privbayes_sizing as pbz
from beamsynth.transforms import privbayes_structure as pbs
from beamsynth.transforms import refine as refine_mod
from beamsynth.transforms.budget import ApproxDP, zcdp_delta, zcdp_rho
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource, discrete_gaussian
from beamsynth.transforms.privbayes import (
    INDIF_SENSITIVITY,
    candidate_families,
    gaussian_plan,
    measure_privbayes,
    plan_privbayes,
)

pytestmark = pytest.mark.audit

ADULT_SHAPE = (14, 9, 14, 16, 16, 7, 15, 6, 5, 2, 12, 10, 14, 42, 2)


# -- 1. zCDP ---------------------------------------------------------------------------------------
def _cks_log_delta(rho: float, eps: float) -> float:
    """log δ of CKS 2020 Cor. 13, ``min_α (α−1)(αρ−ε) − log(α−1) + α·log(1 − 1/α)``, on a dense
    grid of log(α − 1) over [1e-6, 1e6], refined by scipy's bounded search around the grid's best
    (independent of budget.zcdp_delta's golden-section search)."""
    def log_delta(u):  # u = log(α − 1)
        am1 = np.exp(u)
        a = 1.0 + am1
        return am1 * (a * rho - eps) - u + a * np.log1p(-1.0 / a)

    grid = np.linspace(math.log(1e-6), math.log(1e6), 200_001)
    i = int(np.argmin(log_delta(grid)))
    best = optimize.minimize_scalar(log_delta, bounds=(grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]),
                                    method="bounded", options={"xatol": 1e-12})
    return float(min(best.fun, log_delta(grid[i])))


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-9), (1.0, 1e-6), (0.5, 1e-6), (2.0, 1e-9),
                                            (0.1, 1e-5), (5.0, 1e-10), (10.0, 1e-6), (0.01, 1e-6)])
def test_rho_to_epsilon_delta_conversion_recomputed(eps, delta):
    """ρ = zcdp_rho(ε, δ) implies (ε, δ) by CKS Cor. 13 recomputed here, is within 1e-6 of the
    largest such ρ, and is at least Bun & Steinke's Prop. 1.3 ρ (the looser valid bound)."""
    rho = zcdp_rho(eps, delta)
    assert _cks_log_delta(rho, eps) <= math.log(delta) + 1e-9
    assert _cks_log_delta(rho * (1 + 1e-6), eps) > math.log(delta) - 1e-3  # not far from tight
    assert zcdp_delta(rho, eps) <= delta * (1 + 1e-12)
    ln = math.log(1 / delta)
    assert rho >= (math.sqrt(ln + eps) - math.sqrt(ln)) ** 2


def _instrumented_measure(monkeypatch, n: int, m: int, rows: int | None, eps: float = 1.0,
                          delta: float = 1e-9, seed: int = 0):
    """One PrivBayes ``noise="gaussian"`` measurement on synthetic Adult-shaped codes with every
    selection and noise call recorded as (kind, ε or σ or scale, sensitivity)."""
    calls: list[tuple] = []

    def pf(rs, scores, *, epsilon, sensitivity):
        calls.append(("pf", epsilon, sensitivity))
        return noise.permute_and_flip(rs, scores, epsilon=epsilon, sensitivity=sensitivity)

    def dg(rs, sigma, size):
        calls.append(("dg", sigma))
        return noise.discrete_gaussian(rs, sigma, size)

    def dl(rs, scale, size):
        calls.append(("dl", scale))
        return noise.discrete_laplace(rs, scale, size)

    for mod in (pbs, pbz, refine_mod):
        monkeypatch.setattr(mod, "permute_and_flip", pf)
    for mod in (refine_mod, measure_mod):
        monkeypatch.setattr(mod, "discrete_gaussian", dg)
    for mod in (refine_mod, measure_mod, pbm):
        monkeypatch.setattr(mod, "discrete_laplace", dl)
    budget = ApproxDP(epsilon=eps, delta=delta)
    plan = gaussian_plan(plan_privbayes(ADULT_SHAPE, budget, sizing="auto", rows=rows,
                                        max_contributions=m), budget)
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, c, n) for c in ADULT_SHAPE], axis=1)
    codes[:, 1] = codes[:, 0] % ADULT_SHAPE[1]  # two strong pairs, so edges/families get chosen
    codes[:, 3] = codes[:, 2] % ADULT_SHAPE[3]
    fams = candidate_families(len(ADULT_SHAPE), plan.degree, shape=ADULT_SHAPE,
                              max_family_cells=plan.max_family_cells)
    counts = [c.reshape([ADULT_SHAPE[i] for i in f])
              for c, f in zip(count_marginals(codes, fams, ADULT_SHAPE), fams)]
    out = measure_privbayes(counts, fams, shape=ADULT_SHAPE,
                            names=[f"c{i}" for i in range(len(ADULT_SHAPE))], plan=plan,
                            rs=RandomSource(seed=seed))
    return plan, out, calls


@pytest.mark.parametrize(("n", "m", "rows", "path"), [
    (20_000, 1, None, "network"),  # DP size count, network + refinement
    (20_000, 2, None, "network"),  # two records per unit: Δ = 2 tables, 8 structure
    (48_842, 1, 48_842, "network"),  # public row count: no size count
    (3_000, 1, None, "forest"),  # run-time fallback: forest of pure-DP tables
    (300, 1, None, "independent"),  # run-time fallback: 1-way tables only
])
def test_gaussian_mode_calls_compose_within_the_spent_rho(monkeypatch, n, m, rows, path):
    """Σ over the recorded calls of their zCDP cost ≤ ρ(ε, δ) of the one (ε, δ) spend, and each
    selection's sensitivity is the documented one (structure 4m, refinement picks m). Measured:
    network paths use exactly ρ (ratio 1.000000), the forest fallback 0.78 ρ (its bound is loose)."""
    plan, out, calls = _instrumented_measure(monkeypatch, n, m, rows)
    cost = 0.0
    for call in calls:
        if call[0] == "pf":
            assert call[2] in (INDIF_SENSITIVITY * m, m)
            cost += call[1] ** 2 / 2
        elif call[0] == "dg":
            cost += m ** 2 / (2 * call[1] ** 2)
        else:  # discrete Laplace of L1 sensitivity m: (m/b)-DP
            cost += (m / call[1]) ** 2 / 2
    kinds = collections.Counter(c[0] for c in calls)
    degree = (out.sizing or {}).get("degree", plan.degree)
    assert {"network": degree > 0, "forest": (out.sizing or {}).get("forest_steps", 0) > 0
            and degree == 0, "independent": degree == 0}[path]
    if path == "network":
        assert kinds["pf"] == len(ADULT_SHAPE) - 1 + plan.refine.pairs and kinds["dg"] > plan.refine.pairs
    assert cost <= plan.zcdp.rho * (1 + 1e-9)
    assert plan.zcdp.rho == pytest.approx(zcdp_rho(plan.zcdp.budget.epsilon, plan.zcdp.budget.delta))


def test_discrete_gaussian_tail_is_unbounded(monkeypatch):
    """Rule 4 (unbounded tails): CKS Alg. 3 keeps a discrete Laplace draw Y with probability
    exp(−γ), γ = (|Y| − σ²/t)²/(2σ²). Compared with a 53-bit uniform (U ≥ 2^-54), no Y with
    γ > 54·ln 2 ≈ 37.4 was ever kept: the noise was confined to |Z| < σ²/t + 8.65σ (σ = 59.6, the
    refinement's at Adult ε = 1: |Z| ≤ 575), so ``count + Z`` and ``count + m + Z`` had different
    supports (an unbounded privacy loss, like the geometric's bounded tail fixed in _log_uniform).
    Scripted words: the uniform at its minimum, then an Exp(1) tail draw of 64·ln 2 + 0.29; a
    draw with γ = 50 must be kept (probability e^-50 > 0 in the exact law)."""
    sigma, t = 3.0, 4
    y = int(math.ceil(sigma * sigma / t + sigma * math.sqrt(2 * 50.0)))  # γ ≥ 50
    gamma = (y - sigma * sigma / t) ** 2 / (2 * sigma * sigma)
    assert 50.0 <= gamma < 55.0
    script = collections.deque([0, 0, 1, 1, 0])  # U word, zero-run words (64 zeros, then 1), fine U
    real_words = RandomSource.words

    def words(self, n):
        if self.labels[-2:] == ("dg", 0):
            return np.array([script.popleft() for _ in range(n)], dtype=np.uint64)
        if self.labels[-2:-1] == ("dg",):  # later rounds: U ≈ 1/2
            return np.full(n, 1 << 63, dtype=np.uint64)
        return real_words(self, n)

    def fake_laplace(rs, scale, size):
        return np.full(size, y if rs.labels[-1] == 0 else 0, dtype=np.int64)

    monkeypatch.setattr(RandomSource, "words", words)
    monkeypatch.setattr(noise, "discrete_laplace", fake_laplace)
    assert discrete_gaussian(RandomSource(seed=1).child("x"), sigma, 1).tolist() == [y]
