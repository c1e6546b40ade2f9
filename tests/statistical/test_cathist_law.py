"""CatHist equals, in distribution, "noise all n bins with the discrete Laplace law, keep ≥ τ".

On a declared domain of n = 50 cells with ten active values (counts around τ), we compare the
released histogram of :func:`release_histogram` with

* the exact law of the number of released bins (a Poisson-binomial over the 50 bins);
* the exact expected law of the released counts (pooled over bins and runs);
* the brute-force mechanism itself (two-sample χ² on number of bins and on counts);
* the probability that no out-of-data bin is released, ``ρ(τ)^((n-a)/n)`` (= the achieved ρ on
  empty input).

Each check passes at the true noise scale and fails when the scale is off by 30% (the release is
then run with a plan whose ``q`` corresponds to 0.7× or 1.3× the scale, τ unchanged).

False-failure rate: every passing check fails with probability P_THRESHOLD = 1e-4 (χ² and
binomial tests at that level; pooled-count χ² is conservative since per-value counts are sums of
independent indicators, variance ≤ mean); the file has 8 passing checks, so < 1e-3 in all.
"""

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from beamsynth.schemas.domains import IntegerDomain
from beamsynth.transforms.cathist import plan_cathist, release_histogram
from beamsynth.transforms.noise import RandomSource, discrete_laplace
from tests.statistical import P_THRESHOLD, discrete_gof_pvalue

pytestmark = pytest.mark.statistical

N = 50
ACTIVE = np.arange(10, dtype=np.int64) * 5
COUNTS = np.array([0, 1, 2, 3, 4, 5, 6, 8, 10, 20], dtype=np.int64)
EPS, RHO = 1.0, 0.5
RUNS = 20_000
WRONG_RUNS = 6_000
DOMAIN = IntegerDomain(low=0, high=N - 1)
PLAN = plan_cathist(epsilon=EPS, tolerance=RHO, domain_size=N)
TRUE_COUNTS = np.zeros(N, dtype=np.int64)
TRUE_COUNTS[ACTIVE] = COUNTS


def _tail(t: np.ndarray, q: float) -> np.ndarray:
    """P(Z ≥ t) of the discrete Laplace law ∝ q^|z| at integers t."""
    t = np.asarray(t, dtype=np.float64)
    return np.where(t >= 1, q ** np.clip(t, 1, None) / (1 + q), 1 - q ** (1 - np.clip(t, None, 0)) / (1 + q))


def _released_bins_pmf(q: float) -> np.ndarray:
    """Exact pmf of the number of released bins (Poisson-binomial over all N bins)."""
    probs = _tail(PLAN.tau - TRUE_COUNTS, q)
    pmf = np.array([1.0])
    for p in probs:
        pmf = np.convolve(pmf, [1 - p, p])
    return pmf


def _value_pmf(q: float) -> callable:
    """Law of one released count, pooled: ∝ Σ_i P(c_i + Z = v) for v ≥ τ."""
    def pmf(v):
        v = np.asarray(v, dtype=np.int64)
        z = v[:, None] - TRUE_COUNTS[None, :]
        dens = (1 - q) / (1 + q) * q ** np.abs(z)
        out = np.where(v >= PLAN.tau, dens.sum(axis=1), 0.0)
        norm = _tail(PLAN.tau - TRUE_COUNTS, q).sum()
        return out / norm
    return pmf


def _run_cathist(plan, runs, seed):
    base = RandomSource(seed=seed)
    sizes, values, no_out = [], [], []
    active = set(ACTIVE.tolist())
    for i in range(runs):
        rel = release_histogram(ACTIVE, COUNTS, plan=plan, domain=DOMAIN, rs=base.child(i))
        sizes.append(len(rel))
        values.append(rel.counts)
        no_out.append(not (set(rel.cells.tolist()) - active))
    return np.array(sizes), np.concatenate(values), np.array(no_out)


def _run_brute_force(runs, seed):
    noisy = TRUE_COUNTS[None, :] + discrete_laplace(RandomSource(seed=seed), PLAN.scale, (runs, N))
    keep = noisy >= PLAN.tau
    return keep.sum(axis=1), noisy[keep]


def _with_scale(factor):
    return dataclasses.replace(PLAN, log_q=PLAN.log_q / factor)


@pytest.fixture(scope="module")
def true_runs():
    return _run_cathist(PLAN, RUNS, seed=100)


@pytest.fixture(scope="module")
def brute():
    return _run_brute_force(RUNS, seed=200)


def _two_sample_pvalue(a, b):
    lo, hi = min(a.min(), b.min()), max(a.max(), b.max())
    ca = np.bincount(a - lo, minlength=hi - lo + 1)
    cb = np.bincount(b - lo, minlength=hi - lo + 1)
    table = np.vstack([ca, cb])
    # pool sparse right tail so every expected cell is >= 5
    keep = []
    acc = np.zeros(2, dtype=np.int64)
    for col in table.T:
        acc = acc + col
        if acc.sum() >= 40:
            keep.append(acc)
            acc = np.zeros(2, dtype=np.int64)
    if acc.sum():
        keep[-1] = keep[-1] + acc
    return float(stats.chi2_contingency(np.array(keep).T)[1])


def test_number_of_released_bins_matches_exact_law(true_runs, brute):
    pmf = _released_bins_pmf(PLAN.q)
    law = lambda k: np.where((k >= 0) & (k <= N), pmf[np.clip(k, 0, N)], 0.0)  # noqa: E731
    assert discrete_gof_pvalue(true_runs[0], law) > P_THRESHOLD
    assert discrete_gof_pvalue(brute[0], law) > P_THRESHOLD  # the reference itself is right
    assert _two_sample_pvalue(true_runs[0], brute[0]) > P_THRESHOLD


def test_released_counts_match_exact_law(true_runs, brute):
    assert discrete_gof_pvalue(true_runs[1], _value_pmf(PLAN.q)) > P_THRESHOLD
    assert _two_sample_pvalue(true_runs[1], brute[1]) > P_THRESHOLD


def test_probability_of_no_out_of_data_bin_matches_rho(true_runs):
    expected = PLAN.achieved_tolerance ** ((N - ACTIVE.size) / N)
    hits = int(true_runs[2].sum())
    assert stats.binomtest(hits, RUNS, expected).pvalue > P_THRESHOLD
    # the requested tolerance is met
    assert PLAN.achieved_tolerance >= RHO


def test_empty_input_releases_nothing_with_probability_achieved_rho():
    base = RandomSource(seed=300)
    empty = np.zeros(0, dtype=np.int64)
    hits = sum(len(release_histogram(empty, empty, plan=PLAN, domain=DOMAIN, rs=base.child(i))) == 0
               for i in range(RUNS))
    assert stats.binomtest(hits, RUNS, PLAN.achieved_tolerance).pvalue > P_THRESHOLD


@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_each_check_fails_when_noise_scale_is_off_by_30_percent(factor, brute):
    sizes, values, no_out = _run_cathist(_with_scale(factor), WRONG_RUNS, seed=400)
    pmf = _released_bins_pmf(PLAN.q)
    law = lambda k: np.where((k >= 0) & (k <= N), pmf[np.clip(k, 0, N)], 0.0)  # noqa: E731
    assert discrete_gof_pvalue(sizes, law) < P_THRESHOLD
    assert _two_sample_pvalue(sizes, brute[0]) < P_THRESHOLD
    assert discrete_gof_pvalue(values, _value_pmf(PLAN.q)) < P_THRESHOLD
    assert _two_sample_pvalue(values, brute[1]) < P_THRESHOLD
    expected = PLAN.achieved_tolerance ** ((N - ACTIVE.size) / N)
    assert stats.binomtest(int(no_out.sum()), WRONG_RUNS, expected).pvalue < P_THRESHOLD
    assert not math.isclose(_with_scale(factor).scale, PLAN.scale)


@pytest.mark.parametrize("factor,passes", [(1.0, True), (0.7, False), (1.3, False)])
def test_number_of_random_bins_on_a_10_to_12_domain(factor, passes):
    """K ~ Binomial(n - a, p) at n = 10^12 (Poisson(n·p) to 1e-12): checks the exact sampler."""
    n, eps, rho = 10**12, 1.0, 0.05
    domain = IntegerDomain(low=0, high=n - 1)
    plan = plan_cathist(epsilon=eps, tolerance=rho, domain_size=n)
    active = np.array([0, 10**11], dtype=np.int64)
    base = RandomSource(seed=500)
    used = plan if factor == 1.0 else dataclasses.replace(plan, log_q=plan.log_q / factor)
    runs = 6_000 if passes else 300  # a wrong scale moves the mean by orders of magnitude
    k = np.array([len(release_histogram(active, np.array([-10**6, -10**6]), plan=used,
                                        domain=domain, rs=base.child(i))) for i in range(runs)])
    mean = (n - active.size) * plan.tail_probability
    p = discrete_gof_pvalue(k, lambda v: stats.poisson.pmf(v, mean))
    assert (p > P_THRESHOLD) == passes
