"""Goodness-of-fit helpers for noise-law tests (rule: true scale passes, ±30% fails).

Constants:
  P_THRESHOLD: a test at the true law fails with probability P_THRESHOLD (the false-failure rate
    of one check). With SAMPLES draws, a scale off by 30% is rejected with power > 1 - 1e-9 for
    the discrete Laplace laws used here (checked by tests/statistical/test_helpers.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import stats

P_THRESHOLD = 1e-4  # false-failure rate of one goodness-of-fit check at the true law
SAMPLES = 20_000

__all__ = ["P_THRESHOLD", "SAMPLES", "discrete_gof_pvalue", "continuous_gof_pvalue"]


def discrete_gof_pvalue(samples: np.ndarray, pmf: Callable[[np.ndarray], np.ndarray],
                        *, min_expected: float = 5.0) -> float:
    """χ² p-value of integer samples against a pmf on the integers, pooling sparse tails.

    Cells between the observed min and max are kept while their expected count is at least
    ``min_expected``; everything left of the first such cell and right of the last is pooled
    into two tail cells whose expected mass is computed from the pmf over a wide support.
    """
    samples = np.asarray(samples, dtype=np.int64)
    n = samples.size
    lo, hi = int(samples.min()), int(samples.max())
    span = max(hi - lo, 1)
    support = np.arange(lo - 10 * span - 50, hi + 10 * span + 51)
    probs = pmf(support)
    expected = probs * n
    keep = np.flatnonzero(expected >= min_expected)
    if keep.size == 0:
        raise ValueError("no cell has enough expected mass for a χ² test")
    first, last = support[keep[0]], support[keep[-1]]
    inner = np.arange(first, last + 1)
    obs_inner = np.array([(samples == v).sum() for v in inner]) if inner.size < 2000 else \
        np.bincount(samples[(samples >= first) & (samples <= last)] - first, minlength=inner.size)
    exp_inner = pmf(inner) * n
    obs = np.concatenate([[np.sum(samples < first)], obs_inner, [np.sum(samples > last)]])
    exp_left = probs[support < first].sum() * n
    exp_right = probs[support > last].sum() * n
    exp = np.concatenate([[exp_left], exp_inner, [exp_right]])
    mask = exp > 0
    obs, exp = obs[mask], exp[mask]
    exp = exp * obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue)


def continuous_gof_pvalue(samples: np.ndarray, cdf: Callable[[np.ndarray], np.ndarray]) -> float:
    """Kolmogorov–Smirnov p-value of samples against a continuous cdf."""
    return float(stats.kstest(np.asarray(samples, dtype=np.float64), cdf).pvalue)
