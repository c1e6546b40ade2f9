"""Consistency post-processing of released (noisy) tables.

Everything here reads only released values (``NoisyMarginal`` tables or arrays derived from
them), so it is post-processing and costs no privacy budget. Shared by the PrivBayes network
(:mod:`beamsynth.transforms.privbayes`) and its refinement (:mod:`beamsynth.transforms.refine`),
which is why it lives in neither of them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["norm_sub"]


def norm_sub(values: np.ndarray, total: float) -> np.ndarray:
    """Non-negative table with the given total: ``max(v − δ, 0)`` with δ chosen so the sum is
    ``total`` (PrivSyn's Norm-Sub; removes the positive noise mass clipping would keep).

    A non-positive ``total`` or an all-non-positive table gives zeros.
    """
    v = np.asarray(values, dtype=np.float64)
    if total <= 0 or not np.any(v > 0):
        return np.zeros_like(v)
    flat = np.sort(v.ravel())[::-1]
    csum = np.cumsum(flat)
    # largest j with flat[j] − (csum[j] − total)/(j+1) > 0
    deltas = (csum - total) / np.arange(1, flat.size + 1)
    ok = np.flatnonzero(flat - deltas > 0)
    delta = deltas[ok[-1]] if ok.size else 0.0
    return np.clip(v - delta, 0.0, None)

