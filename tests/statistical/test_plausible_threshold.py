"""Noise law of Privacy Test 2's randomized threshold ``k + Lap(1/ε0)`` (seed 001, Section 2.3).

Both directions (style rule 14): the true scale passes a KS test at ``P_THRESHOLD`` (false-failure
rate 1e-4 per check), scales ×0.7 and ×1.3 fail with ``SAMPLES`` draws.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.plausible import privacy_test
from tests.statistical import P_THRESHOLD, SAMPLES, continuous_gof_pvalue


@pytest.mark.statistical
@pytest.mark.parametrize("k,eps0", [(50, 1.0), (10, 0.3)])
def test_randomized_threshold_follows_laplace_both_ways(k, eps0):
    passed, thr = privacy_test(np.full(SAMPLES, k), k=k, epsilon0=eps0, rs=RandomSource(seed=k))
    scale = 1.0 / eps0
    assert continuous_gof_pvalue(thr, stats.laplace(loc=k, scale=scale).cdf) > P_THRESHOLD
    for wrong in (0.7, 1.3):
        assert continuous_gof_pvalue(thr, stats.laplace(loc=k, scale=scale * wrong).cdf) < P_THRESHOLD
    assert ((thr <= k) == passed).all()  # k' = k passes exactly when the noise is <= 0


@pytest.mark.statistical
def test_fast_path_check_sample_count_is_hypergeometric():
    """With max_check < |D_S| the fast path's k' must follow the generic path's law: the number of
    matching records in a uniform sample of max_check seeds (hypergeometric). Wrong sample sizes
    (×0.7, ×1.3) must fail; false-failure rate P_THRESHOLD."""
    from beamsynth.transforms.plausible_privacy import fast_plausible_counts
    from tests.statistical import discrete_gof_pvalue

    n_seeds, matching, check = 5000, 400, 1000
    kp = fast_plausible_counts(np.full(SAMPLES, matching), n_seeds=n_seeds, max_check=check,
                               max_plausible=None, rs=RandomSource(seed=3))
    assert discrete_gof_pvalue(kp, lambda x: stats.hypergeom.pmf(x, n_seeds, matching, check)) > P_THRESHOLD
    for wrong in (0.7, 1.3):
        n = int(check * wrong)
        assert discrete_gof_pvalue(kp, lambda x, n=n: stats.hypergeom.pmf(x, n_seeds, matching, n)) < P_THRESHOLD
    capped = fast_plausible_counts(np.full(100, matching), n_seeds=n_seeds, max_check=None,
                                   max_plausible=50, rs=RandomSource(seed=3))
    assert (capped == 50).all()
