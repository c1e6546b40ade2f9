"""The discrete Laplace count noise follows its law at the true scale and not at ±30%.

False-failure rate: each passing check fails with probability P_THRESHOLD = 1e-4.
"""

import numpy as np
import pytest

from beamsynth.transforms.noise import (
    RandomSource,
    discrete_laplace,
    discrete_laplace_pmf,
    exponential,
    geometric,
)
from tests.statistical import P_THRESHOLD, SAMPLES, continuous_gof_pvalue, discrete_gof_pvalue

pytestmark = pytest.mark.statistical


@pytest.mark.parametrize("scale", [0.5, 2.0, 14.0])
def test_discrete_laplace_true_scale_passes(scale):
    z = discrete_laplace(RandomSource(seed=11).child("dl", scale), scale, SAMPLES)
    assert discrete_gof_pvalue(z, lambda k: discrete_laplace_pmf(k, scale)) > P_THRESHOLD


@pytest.mark.parametrize("scale", [0.5, 2.0, 14.0])
@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_discrete_laplace_wrong_scale_fails(scale, factor):
    z = discrete_laplace(RandomSource(seed=12).child("dl", scale), scale, SAMPLES)
    assert discrete_gof_pvalue(z, lambda k: discrete_laplace_pmf(k, scale * factor)) < P_THRESHOLD


def test_discrete_laplace_secure_mode_follows_law():
    z = discrete_laplace(RandomSource(), 3.0, SAMPLES)
    assert discrete_gof_pvalue(z, lambda k: discrete_laplace_pmf(k, 3.0)) > P_THRESHOLD


def test_geometric_law():
    q = 0.8
    g = geometric(RandomSource(seed=3), q, SAMPLES)
    pmf = lambda k: np.where(k >= 0, (1 - q) * q ** np.clip(k, 0, None), 0.0)  # noqa: E731
    assert discrete_gof_pvalue(g, pmf) > P_THRESHOLD
    wrong = lambda k: np.where(k >= 0, (1 - 0.74) * 0.74 ** np.clip(k, 0, None), 0.0)  # noqa: E731
    assert discrete_gof_pvalue(g, wrong) < P_THRESHOLD


@pytest.mark.parametrize("factor,passes", [(1.0, True), (0.7, False), (1.3, False)])
def test_exponential_law(factor, passes):
    x = exponential(RandomSource(seed=5), 2.0, SAMPLES)
    p = continuous_gof_pvalue(x, lambda v: 1 - np.exp(-2.0 * factor * np.clip(v, 0, None)))
    assert (p > P_THRESHOLD) == passes


@pytest.mark.parametrize("factor,passes", [(1.0, True), (0.7, False), (1.3, False)])
def test_permute_and_flip_law(factor, passes):
    """Draws of permute-and-flip (sampled as report-noisy-max with exponential noise) follow the
    law enumerated over visiting orders at the true ε, and not at ε·0.7 or ε·1.3."""
    from scipy import stats

    from beamsynth.transforms.noise import permute_and_flip, permute_and_flip_probabilities

    scores = np.array([0.0, 1.0, 2.0, 3.0])
    rs = RandomSource(seed=21)
    picks = np.array([permute_and_flip(rs.child(i), scores, epsilon=1.0, sensitivity=1.0)
                      for i in range(SAMPLES)])
    law = permute_and_flip_probabilities(scores, epsilon=1.0 * factor, sensitivity=1.0)
    p = stats.chisquare(np.bincount(picks, minlength=4), law * SAMPLES).pvalue
    assert (p > P_THRESHOLD) == passes
