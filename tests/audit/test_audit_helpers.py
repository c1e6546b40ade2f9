"""The audit machinery itself: Clopper–Pearson bounds and the ε lower bound (exact checks)."""

import math

import numpy as np
import pytest
from scipy import stats

from beamsynth.transforms.audit import (
    AuditCase,
    NeighbourPair,
    audit_pair,
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_lower_bound,
)
from beamsynth.transforms.noise import RandomSource

pytestmark = pytest.mark.audit


@pytest.mark.parametrize("k,n", [(1, 10), (5, 10), (9, 10), (37, 1000), (500, 1000)])
def test_clopper_pearson_bounds_are_exact_binomial_tails(k, n):
    alpha = 0.01
    lo, hi = clopper_pearson_lower(k, n, alpha), clopper_pearson_upper(k, n, alpha)
    assert lo < k / n < hi
    assert stats.binom.sf(k - 1, n, lo) == pytest.approx(alpha, rel=1e-6)  # P(X >= k | lo)
    assert stats.binom.cdf(k, n, hi) == pytest.approx(alpha, rel=1e-6)  # P(X <= k | hi)


def test_clopper_pearson_edges():
    assert clopper_pearson_lower(0, 10, 0.05) == 0.0
    assert clopper_pearson_upper(10, 10, 0.05) == 1.0
    assert clopper_pearson_upper(0, 10, 0.05) == pytest.approx(1 - 0.05 ** (1 / 10))
    assert clopper_pearson_lower(10, 10, 0.05) == pytest.approx(0.05 ** (1 / 10))


@pytest.mark.parametrize("args,msg", [
    ((1, 0, 0.1), r"n \(0\) must be an int >= 1"),
    ((11, 10, 0.1), r"k \(11\) must be in \[0, n=10\]"),
    ((1, 10, 1.5), r"alpha \(1.5\) must be in \(0, 1\)"),
])
def test_clopper_pearson_validation(args, msg):
    with pytest.raises(ValueError, match=msg):
        clopper_pearson_lower(*args)


def test_epsilon_bound_approaches_true_ratio_from_below():
    # p' = 0.6, p = 0.6 / e: the true ε of the event is exactly 1
    n = 10**7
    b = epsilon_lower_bound(int(0.6 * n), n, int(0.6 / math.e * n), n, alpha=1e-4)
    assert 0.99 < b < 1.0
    assert epsilon_lower_bound(int(0.6 * n), n, int(0.6 / math.e * n), n, delta=0.3, alpha=1e-4) < 0.5
    assert epsilon_lower_bound(0, 100, 50, 100, alpha=0.05) == 0.0


def _rr_case(eps: float) -> AuditCase:
    """Randomized response on one bit: exactly eps-DP (reports the truth w.p. e^eps/(1+e^eps))."""
    p = math.exp(eps) / (1 + math.exp(eps))

    def run(bit, rs):
        return bit if rs.uniform(1)[0] < p else 1 - bit

    def batch(bit, _pair, runs, rs):
        return np.where(rs.uniform(runs) < p, bit, 1 - bit)

    return AuditCase(name="rr", epsilon=eps, delta=0.0, run=run, batch=batch,
                     pairs=(NeighbourPair("bit", 0, 1),), statistic=lambda r, _p: r,
                     thresholds=(1,))


def test_audit_coverage_on_exactly_tight_mechanism():
    """Randomized response is exactly ε-DP: the bound comes close to ε and never exceeds it."""
    case = _rr_case(1.0)
    bounds = [audit_pair(case, case.pairs[0], runs=20_000, rs=RandomSource(seed=s)).epsilon_lower_bound
              for s in range(20)]
    assert max(bounds) <= 1.0
    assert min(bounds) > 0.85
    # the loop path gives the same answer shape (fewer runs)
    r = audit_pair(case, case.pairs[0], runs=500, rs=RandomSource(seed=1), use_batch=False)
    assert 0 < r.epsilon_lower_bound <= 1.0 and r.passed


def test_audit_fails_when_claim_is_too_small():
    """The same mechanism claimed at ε/2 is caught: the audit can fail."""
    case = _rr_case(1.0)
    wrong = AuditCase(name="rr-claims-0.5", epsilon=0.5, delta=0.0, run=case.run, batch=case.batch,
                      pairs=case.pairs, statistic=case.statistic, thresholds=case.thresholds)
    r = audit_pair(wrong, wrong.pairs[0], runs=20_000, rs=RandomSource(seed=3))
    assert not r.passed and r.epsilon_lower_bound > 0.8


@pytest.mark.parametrize("kw,msg", [
    ({"epsilon": 0.0}, r"epsilon \(0.0\) must be a finite number > 0"),
    ({"delta": 1.0}, r"delta \(1.0\) must be in \[0, 1\)"),
    ({"pairs": ()}, "needs at least one neighbouring pair"),
    ({"thresholds": ()}, "needs at least one threshold"),
])
def test_audit_case_validation(kw, msg):
    base = dict(name="x", epsilon=1.0, delta=0.0, run=lambda d, rs: d,
                pairs=(NeighbourPair("p", 0, 1),), statistic=lambda r, p: r, thresholds=(1,))
    with pytest.raises(ValueError, match=msg):
        AuditCase(**{**base, **kw})
