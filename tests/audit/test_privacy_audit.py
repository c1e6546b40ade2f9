"""Empirical privacy audit of every registered mechanism, and proof that it catches broken ones.

Each test runs the mechanism core many times on both datasets of a hard neighbouring pair and
computes a Clopper–Pearson lower bound on ε over the declared events (beamsynth.transforms.audit).
False-failure rate: a correct mechanism's bound exceeds its true ε with probability at most
AUDIT_ALPHA = 1e-4 per pair (and all runs are seeded, so a passing run stays passing).
"""

import numpy as np
import pytest
from scipy import stats

from beamsynth.transforms.audit import AUDIT_ALPHA, audit_pair, run_statistics
from beamsynth.transforms.noise import RandomSource
from tests.audit.cases import AUDITS, BROKEN

pytestmark = pytest.mark.audit

FAST = [(name, i) for name, case in AUDITS.items() for i in range(len(case.pairs))]


def _runs(case, i: int) -> int:
    return case.runs if i == 0 else max(200, case.runs // 10)


@pytest.mark.parametrize("name,i", FAST, ids=[f"{n}-{AUDITS[n].pairs[i].name}" for n, i in FAST])
def test_audited_bound_stays_below_claim(name, i):
    case = AUDITS[name]
    r = audit_pair(case, case.pairs[i], runs=_runs(case, i), rs=RandomSource(seed=2024).child(name, i))
    assert r.passed, f"{r.row()} exceeds the claimed ε={case.epsilon}"


@pytest.mark.slow
@pytest.mark.parametrize("name,i", FAST, ids=[f"{n}-{AUDITS[n].pairs[i].name}" for n, i in FAST])
def test_audited_bound_stays_below_claim_many_runs(name, i):
    case = AUDITS[name]
    runs = case.slow_runs if i == 0 else max(200, case.slow_runs // 10)
    r = audit_pair(case, case.pairs[i], runs=runs, rs=RandomSource(seed=7).child(name, i))
    assert r.passed, f"{r.row()} exceeds the claimed ε={case.epsilon}"


@pytest.mark.parametrize("name", list(BROKEN))
def test_audit_catches_broken_variant(name):
    """The same audit, on a deliberately broken variant, certifies ε above the claim."""
    case = BROKEN[name]
    r = audit_pair(case, case.pairs[0], runs=case.runs, rs=RandomSource(seed=99).child(name))
    assert not r.passed, f"audit missed: {case.broken} ({r.row()})"
    assert r.alpha == AUDIT_ALPHA


def test_tight_pair_comes_close_to_the_claim():
    """The audit is not vacuous: on the tight pair the certified ε is near the claimed one."""
    case = AUDITS["dp_count"]
    r = audit_pair(case, case.pairs[0], runs=case.runs, rs=RandomSource(seed=5))
    assert 0.8 * case.epsilon < r.epsilon_lower_bound <= case.epsilon


# Slow-only (H61, default-suite time): a broken variant whose fast path is the correct case's
# function with one parameter changed has its law checked by the correct case in the default run:
# "privbayes gaussian: σ halved" by [privbayes gaussian] (batch_measure over _pb_gaussian_measure,
# rho_factor 4 vs 1; 35 s vs 56 s under load 9), "cathist: empty bins at a wrong threshold" by
# [cathist (2,000 bins: binomial empty bins)] (batch_cathist_big, p_shift 1 vs 0; 19 s vs 19 s).
# Their audits (test_audit_catches_broken_variant) stay in the default run.
SLOW_BATCHED = {"privbayes", "privbayes gaussian: σ halved", "cathist: empty bins at a wrong threshold"}
BATCHED = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_BATCHED else n
           for n, c in {**AUDITS, **BROKEN}.items() if c.batch is not None]


@pytest.mark.parametrize("name", BATCHED)
def test_fast_path_has_the_law_of_the_mechanism(name):
    """The vectorized path used for many runs matches the one-run-at-a-time core in law
    (χ² two-sample test on the statistic; false-failure rate 1e-4 per case)."""
    case = {**AUDITS, **BROKEN}[name]
    pair = case.pairs[0]
    for data in (pair.smaller, pair.larger):
        loop = run_statistics(case, pair, data, 300, RandomSource(seed=11), use_batch=False)
        if np.array_equal(run_statistics(case, pair, data, 300, RandomSource(seed=11)), loop):
            # the fast path is the core itself (bounding done once, each run's draws from the
            # loop's streams): the same statistic run by run, so the same law. Cheaper than the
            # χ² below and stronger: a difference in any of the 300 runs falls through to it.
            continue
        fast = run_statistics(case, pair, data, min(3000, case.runs), RandomSource(seed=12))
        values = np.union1d(loop, fast)
        edges = np.r_[values, values[-1] + 1]
        table = np.array([np.histogram(loop, edges)[0], np.histogram(fast, edges)[0]])
        keep = table.sum(axis=0) >= 20  # pool sparse outcomes into one tail column
        table = np.c_[table[:, keep], table[:, ~keep].sum(axis=1)]
        table = table[:, table.sum(axis=0) > 0]
        if table.shape[1] < 2 and values.size > 20:
            # no outcome repeats 20 times (a statistic on a fine lattice): deciles of the pooled runs
            q = np.unique(np.quantile(np.r_[loop, fast], np.linspace(0, 1, 11)))
            table = np.array([np.histogram(loop, q)[0], np.histogram(fast, q)[0]])
            table = table[:, table.sum(axis=0) > 0]
        if table.shape[1] < 2:
            assert set(loop) == set(fast)
            continue
        assert stats.chi2_contingency(table).pvalue > 1e-4
