"""SBA inside the whole SBHG transform follows its law: c + DLap(b), conditioned on ≥ t.

Degenerate input: 4 columns, 5,000 values each, every row (i, i, i, i) repeated ``C`` times, no
hash features (``top_r=0``), so each feature's table has 5,000 non-empty cells of count ``C``
and 20,000 cells are released or dropped in one pipeline run. ``C = t + 2`` makes the threshold
bite (about 30% of cells are dropped). The true scale must pass at p > P_THRESHOLD and a scale
off by ±30% must fail. False-failure rate: P_THRESHOLD (1e-4) per passing check.
"""

import math

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import BeamAssertException, assert_that

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import ApproxDP
from beamsynth.transforms.noise import discrete_laplace_cdf, discrete_laplace_pmf
from beamsynth.transforms.sbhg import DPHashedConditionals, sba_threshold
from tests.statistical import P_THRESHOLD, discrete_gof_pvalue

pytestmark = pytest.mark.statistical

M, P = 5000, 4
BUDGET = ApproxDP(epsilon=1.0, delta=1e-2)  # per feature (0.25, 2.5e-3): b = 4, t = 23


def _conditioned_pmf(c, t, scale):
    """pmf of v = c + Z given v ≥ t (Z discrete Laplace of ``scale``)."""
    mass = 1.0 - float(discrete_laplace_cdf(t - c - 1, scale))
    return lambda v: np.where(np.asarray(v) >= t, discrete_laplace_pmf(np.asarray(v) - c, scale), 0.0) / mass


def test_released_counts_follow_conditioned_discrete_laplace():
    scale, t = sba_threshold(epsilon=BUDGET.epsilon / P, delta=BUDGET.delta / P)
    assert scale == 4.0
    c = t + 2
    rows = np.repeat(np.arange(M), c)
    codes = np.column_stack([rows] * P).astype(np.int64)

    def check(models):
        (model,) = models
        rel = model.released
        if rel.threshold != t or rel.scale != scale:
            raise BeamAssertException(f"threshold {rel.threshold}/{t}, scale {rel.scale}/{scale}")
        values = np.concatenate([v for _, v in rel.cells])
        kept = values.size / (M * P)
        expected_kept = 1.0 - float(discrete_laplace_cdf(t - c - 1, scale))
        # binomial check of the survival rate: 6 standard deviations
        if abs(kept - expected_kept) > 6 * math.sqrt(expected_kept * (1 - expected_kept) / (M * P)):
            raise BeamAssertException(f"kept {kept:.4f}, expected {expected_kept:.4f}")
        p_true = discrete_gof_pvalue(values, _conditioned_pmf(c, t, scale))
        p_low = discrete_gof_pvalue(values, _conditioned_pmf(c, t, 0.7 * scale))
        p_high = discrete_gof_pvalue(values, _conditioned_pmf(c, t, 1.3 * scale))
        if not (p_true > P_THRESHOLD and p_low < P_THRESHOLD and p_high < P_THRESHOLD):
            raise BeamAssertException(f"p-values true {p_true}, 0.7x {p_low}, 1.3x {p_high}")

    with BeamTestPipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
        batches = p | beam.Create([EncodedBatch(codes[i:i + 50_000]) for i in range(0, len(codes), 50_000)])
        # EncodedBatch
        models = batches | DPHashedConditionals(shape=(M,) * P, selection_budget=None,
                                                conditional_budget=BUDGET, top_r=0, seed=21,
                                                burn_in=0, chain_length=1, init_sweeps=0)
        assert_that(models, check)
