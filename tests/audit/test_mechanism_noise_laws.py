"""Each mechanism's released values on a degenerate input follow its noise law (rule 14).

The whole transform runs on an input whose exact answer is known, so every released cell minus
its exact value must be discrete Laplace with the documented scale b = k/ε. The true scale must
pass (p > P_THRESHOLD) and scales ×0.7 and ×1.3 must fail.

False-failure rate: P_THRESHOLD = 1e-4 per passing check; the ±30% checks fail to reject with
probability < 1e-9 at SAMPLES = 20,000 (tests/statistical/__init__.py). All runs are seeded.
"""

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import BeamAssertException, assert_that
from apache_beam.transforms.window import GlobalWindow

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.measure import DPMarginals
from beamsynth.transforms.noise import discrete_laplace_pmf
from beamsynth.transforms.synthesis import _NoiseCountFn
from beamsynth.transforms.units import BoundContributions
from tests.statistical import P_THRESHOLD, SAMPLES, discrete_gof_pvalue

pytestmark = [pytest.mark.statistical, pytest.mark.audit]


def law_verdicts(residuals: np.ndarray, scale: float) -> dict[float, float]:
    """p-values of the residuals against discrete Laplace at scale × {0.7, 1, 1.3}."""
    return {f: discrete_gof_pvalue(residuals, lambda k, s=scale * f: discrete_laplace_pmf(k, s))
            for f in (0.7, 1.0, 1.3)}


def check_law(residuals: np.ndarray, scale: float) -> None:
    """True scale passes, ±30% fails; raises AssertionError otherwise."""
    p = law_verdicts(np.asarray(residuals), scale)
    if not (p[1.0] > P_THRESHOLD and p[0.7] < P_THRESHOLD and p[1.3] < P_THRESHOLD):
        raise BeamAssertException(f"noise law check failed at scale {scale}: p-values {p}")


def _marginal_matcher(exact: np.ndarray, scale: float):
    def match(outputs):
        (release,) = outputs
        (m,) = release
        if m.scale != scale or m.values.shape != exact.shape:
            raise BeamAssertException(f"scale {m.scale} / shape {m.values.shape}, expected {scale} / {exact.shape}")
        check_law((m.values - exact).ravel(), scale)
    return match


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_dp_marginals_transform_releases_discrete_laplace(epsilon):
    """DPMarginals on a degenerate input (all 40 records in one cell of a 100×200 table)."""
    shape = (100, 200)  # 20,000 cells = SAMPLES noisy values from one run of the transform
    assert shape[0] * shape[1] == SAMPLES
    codes = np.zeros((40, 2), dtype=np.int32)
    exact = np.zeros(shape, dtype=np.int64)
    exact[0, 0] = 40
    with test_pipeline.TestPipeline() as p:
        out = (p | beam.Create([EncodedBatch(codes[:25]), EncodedBatch(codes[25:])])
               | DPMarginals(specs=[(0, 1)], shape=shape, names=["a", "b"],
                             budgets=[PureDP(epsilon=epsilon)], seed=31))
        assert_that(out, _marginal_matcher(exact, 1 / epsilon))


def test_bounded_marginals_release_law_at_scale_k_over_epsilon():
    """BoundContributions(k=3) + DPMarginals(k=3): 30 heavy units of 10 identical records each
    leave exactly 90 records in one cell, and every cell is discrete Laplace(3/ε)."""
    k, eps, shape = 3, 1.0, (100, 200)
    pids = np.repeat(np.array([f"u{i}" for i in range(30)], dtype=object), 10)
    codes = np.zeros((pids.size, 2), dtype=np.int32)
    codes[:, 0], codes[:, 1] = 7, 9
    exact = np.zeros(shape, dtype=np.int64)
    exact[7, 9] = 30 * k
    with test_pipeline.TestPipeline() as p:
        out = (p | beam.Create([EncodedBatch(codes[:150], pids[:150]), EncodedBatch(codes[150:], pids[150:])])
               | BoundContributions(max_contributions=k, seed=3, num_shards=4)
               | DPMarginals(specs=[(0, 1)], shape=shape, names=["a", "b"],
                             budgets=[PureDP(epsilon=eps)], max_contributions=k, seed=4))
        assert_that(out, _marginal_matcher(exact, k / eps))


@pytest.mark.parametrize("k,epsilon", [(1, 1.0), pytest.param(5, 0.7, marks=pytest.mark.slow)])
def test_dp_count_releases_discrete_laplace(k, epsilon):
    """DPCount's noise step on a fixed count, SAMPLES independent runs (one seed per run)."""
    count = 1234
    values = np.array([
        next(iter(_NoiseCountFn(PureDP(epsilon=epsilon), k, seed, "count").process(count, window=GlobalWindow()))).value
        for seed in range(SAMPLES)
    ])
    check_law(values - count, k / epsilon)


def test_check_law_rejects_a_wrong_mechanism():
    """The helper can fail: noise at half the scale is rejected at the claimed scale."""
    from beamsynth.transforms.noise import RandomSource, discrete_laplace

    z = discrete_laplace(RandomSource(seed=1), 1.0, SAMPLES)
    with pytest.raises(BeamAssertException):
        check_law(z, 2.0)


def test_privbayes_released_tables_follow_their_scale():
    """PrivBayes' measurement on a degenerate input (all records in one cell; three columns of
    7,000 cells, degree 0 so every released table is a 1-way table of the same size, hence the
    same scale m/ε_t): 21,000 released cells, discrete Laplace at that scale."""
    from beamsynth.transforms.measure import count_marginals
    from beamsynth.transforms.noise import RandomSource
    from beamsynth.transforms.privbayes import candidate_families, measure_privbayes, plan_privbayes

    shape = (7000, 7000, 7000)
    plan = plan_privbayes(shape, PureDP(epsilon=2.0), degree=0, max_contributions=1)
    families = [tuple(f) for f in candidate_families(3, plan.degree)]
    codes = np.zeros((50, 3), dtype=np.int64)
    counts = [t.reshape([shape[c] for c in f]) for t, f in zip(count_marginals(codes, families, shape), families)]
    m = measure_privbayes(counts, families, shape=shape, names=["a", "b", "c"], plan=plan,
                          rs=RandomSource(seed=8))
    assert len(m.marginals) == 3 and {t.values.size for t in m.marginals} == {7000}
    (scale,) = {t.scale for t in m.marginals}
    assert scale == pytest.approx(1 / (plan.marginal_budget.epsilon / 3))
    residuals = np.concatenate([(t.values - (np.arange(t.values.size) == 0).reshape(t.values.shape) * 50).ravel()
                                for t in m.marginals])
    check_law(residuals, scale)


def test_privbayes_refinement_tables_follow_their_scale():
    """The refinement's released coarse pairs (transforms/refine.py): four 64-cell columns kept
    at full resolution (groups = 64), all 6 pairs measured, so 24,576 released cells over
    records all in cell 0; every cell's residual is discrete Laplace at ``plan.refine.table_scale``."""
    from beamsynth.transforms.measure import count_marginals
    from beamsynth.transforms.noise import RandomSource
    from beamsynth.transforms.privbayes import candidate_families, measure_privbayes, plan_privbayes

    shape = (64, 64, 64, 64)
    plan = plan_privbayes(shape, PureDP(epsilon=2.0), degree=1, max_contributions=1,
                          refine_pairs=6, refine_rounds=2, refine_groups=64)
    families = [tuple(f) for f in candidate_families(4, plan.degree)]
    codes = np.zeros((50, 4), dtype=np.int64)
    counts = [t.reshape([shape[c] for c in f]) for t, f in zip(count_marginals(codes, families, shape), families)]
    m = measure_privbayes(counts, families, shape=shape, names=["a", "b", "c", "d"], plan=plan,
                          rs=RandomSource(seed=9), ordered=[True, False, True, False])
    tables = m.refinement.tables
    assert len(tables) == 6 and {t.values.size for t in tables} == {4096}
    assert all(t.scale == pytest.approx(plan.refine.table_scale) for t in tables)
    assert plan.refine.table_scale == pytest.approx(6 / plan.refine.measure_budget.epsilon)
    residuals = np.concatenate([(t.values - (np.arange(4096) == 0).reshape(64, 64) * 50).ravel()
                                for t in tables])
    check_law(residuals, plan.refine.table_scale)
