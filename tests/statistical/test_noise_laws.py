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


# -- samplers rewritten for the exact unbounded law (issue 15, weakening 7) -------------------------
@pytest.mark.parametrize("factor,passes", [(1.0, True), (0.7, False), (1.3, False)])
def test_gumbel_law(factor, passes):
    """G = -log E with E exact Exp(1): standard Gumbel; a Gumbel of scale ·0.7 or ·1.3 fails."""
    from beamsynth.transforms.noise import gumbel

    g = gumbel(RandomSource(seed=31), SAMPLES)
    p = continuous_gof_pvalue(g, lambda v: np.exp(-np.exp(-v / factor)))
    assert (p > P_THRESHOLD) == passes


@pytest.mark.parametrize("factor,passes", [(1.0, True), (0.7, False), (1.3, False)])
def test_laplace_internal_law(factor, passes):
    from beamsynth.transforms.noise import laplace_internal

    scale = 3.0
    x = laplace_internal(RandomSource(seed=32), scale, SAMPLES)
    b = scale * factor
    p = continuous_gof_pvalue(x, lambda v: np.where(v < 0, 0.5 * np.exp(v / b), 1 - 0.5 * np.exp(-v / b)))
    assert (p > P_THRESHOLD) == passes


def test_gumbel_secure_mode_follows_law():
    from beamsynth.transforms.noise import RunSecret, gumbel

    g = gumbel(RandomSource(seed=RunSecret()).child("g"), SAMPLES)
    assert continuous_gof_pvalue(g, lambda v: np.exp(-np.exp(-v))) > P_THRESHOLD


def test_fine_uniform_binades_and_mantissa():
    """The fine uniform's binade index is Geometric(1/2) and, within a binade, U is uniform;
    a Geometric(0.35) binade law (30% off in the success probability) fails."""
    from beamsynth.transforms.noise import _fine_uniform

    u = _fine_uniform(RandomSource(seed=33), SAMPLES)
    k = -np.floor(np.log2(u)).astype(np.int64) - 1
    geo = lambda p: (lambda j: np.where(j >= 0, p * (1 - p) ** np.clip(j, 0, None), 0.0))  # noqa: E731
    assert discrete_gof_pvalue(k, geo(0.5)) > P_THRESHOLD
    assert discrete_gof_pvalue(k, geo(0.35)) < P_THRESHOLD
    within = u * np.exp2(k + 1) - 1.0  # uniform on [0, 1)
    assert continuous_gof_pvalue(within, lambda v: np.clip(v, 0, 1)) > P_THRESHOLD
    assert continuous_gof_pvalue(within, lambda v: np.clip(v, 0, 1) ** 1.3) < P_THRESHOLD


@pytest.mark.parametrize("good,factor,passes", [(12, 1.0, True), (12, 0.7, False), (12, 1.3, False),
                                                (300, 1.0, True)])
def test_hypergeometric_law(good, factor, passes):
    """Exact urn draws against scipy's pmf; an urn with 30% fewer or more good items fails."""
    from scipy import stats

    from beamsynth.transforms.noise import hypergeometric

    bad, n = 2 * good, good
    x = hypergeometric(RandomSource(seed=34).child(good), np.full(SAMPLES, good), np.full(SAMPLES, bad), n)
    g = int(round(good * factor))
    p = discrete_gof_pvalue(x, lambda k: stats.hypergeom.pmf(k, good + bad, g, n))
    assert (p > P_THRESHOLD) == passes
