"""Noise of the prefix algorithms on a degenerate input follows the documented law and scale.

Every record is the same string, so each released cell is an exact count plus noise:
* improved: the leaf ``a$`` is released as ``n - 2t + Z`` (the root split removes ``t``, the
  split of ``a`` removes ``owed + t = 2t``), ``Z`` discrete Laplace of scale ``1/ε₀`` (``2k/ε``
  with the paper's calibration, less with the tight one);
* basic: the internal node ``a`` is released as ``n + Z``, scale ``k/ε_level``, and its leaf
  ``a$`` as ``n + Z'`` with the re-measurement scale ``k/ε_final``;
* direct: the root allocation is ``n + Z`` with scale ``k(maxdepth + 1)/ε``.
The true scale must pass and ×0.7 / ×1.3 must fail.

False-failure rate: each passing check fails with probability P_THRESHOLD = 1e-4.
"""

import numpy as np
import pytest

from beamsynth.schemas.keys import TextKeyCodec
from beamsynth.transforms import prefix as P
from beamsynth.transforms.noise import RandomSource, discrete_laplace_pmf
from tests.statistical import P_THRESHOLD, discrete_gof_pvalue

pytestmark = pytest.mark.statistical

N = 5_000
DRAWS = 4_000  # whole-transform runs per method (enough for the ±30% checks to fail)
CODEC = TextKeyCodec(column="q", max_length=2, alphabet="ab")
CODES = CODEC.encode_strings(["a"] * N)


def _run(method, acct, seed, rule="skip", levels=CODEC.depth):
    """The first ``levels`` levels of a run (a level's release never depends on the later ones)."""
    state = P.root_state(CODEC.symbol_dtype)
    out = {}
    for d in range(levels):
        idx, cnt = P.child_cells(CODES, d, state.keys, CODEC.fanout)
        rs = RandomSource(seed=seed).child(d)
        if method == "improved":
            state, rel = P.improved_step(state, idx, cnt, CODEC, acct=acct, rule=rule, rs=rs)
        elif method == "basic":
            state, rel = P.basic_step(state, idx, cnt, CODEC, acct=acct, rs=rs, last=d == CODEC.depth - 1)
        else:
            state, rel = P.direct_step(state, idx, cnt, CODEC, acct=acct, rs=rs, last=d == CODEC.depth - 1)
        out.update(zip(CODEC.labels(rel.prefixes), rel.counts.tolist()))
        out[f"sum{d + 1}"] = int(rel.counts.sum())
    return out


def _samples(method, acct, label, seed0, levels=CODEC.depth):
    return np.array([_run(method, acct, seed0 + i, levels=levels)[label] for i in range(DRAWS)])


def _check(z, scale):
    assert discrete_gof_pvalue(z, lambda k: discrete_laplace_pmf(k, scale)) > P_THRESHOLD
    for factor in (0.7, 1.3):
        assert discrete_gof_pvalue(z, lambda k, f=factor: discrete_laplace_pmf(k, scale * f)) < P_THRESHOLD


def test_improved_leaf_is_discounted_count_plus_noise_at_one_over_eps0():
    # the default (tight) calibration; the paper's differs only in (ε₀, b, t): tests/unit
    acct = P.improved_accounting(epsilon=0.8, max_contributions=2, fanout=CODEC.fanout, depth=CODEC.depth)
    assert acct.scale == pytest.approx(1 / acct.epsilon_level)
    assert acct.scale < 2 * 2 / 0.8 and acct.loss <= 0.8  # less noise than 2k/ε for the same budget
    z = _samples("improved", acct, "a$", 10_000, levels=2) - (N - 2 * acct.discount)  # a$: level 2
    _check(z, acct.scale)


def test_basic_internal_and_remeasured_leaf_scales():
    acct = P.basic_accounting(epsilon=1.0, max_depth=CODEC.depth, fanout=CODEC.fanout, threshold=50)
    runs = [_run("basic", acct, 50_000 + i, levels=2) for i in range(DRAWS)]  # a, then a$
    _check(np.array([r["a"] for r in runs]) - N, acct.scale)
    _check(np.array([r["a$"] for r in runs]) - N, acct.final_scale)


def test_direct_root_allocation_scale():
    acct = P.direct_accounting(epsilon=1.5, max_depth=CODEC.depth)
    z = _samples("direct", acct, "sum1", 90_000, levels=1)  # depth-1 allocations sum to the root's
    _check(z - N, acct.scale)
