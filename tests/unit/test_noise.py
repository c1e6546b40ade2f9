"""The noise module: determinism when seeded, secure by default, exact samplers."""

import math
import pickle

import numpy as np
import pytest
from scipy import stats

from beamsynth.transforms.noise import (
    RandomSource,
    binomial,
    discrete_laplace,
    discrete_laplace_cdf,
    discrete_laplace_pmf,
    exponential_mechanism,
    gumbel,
    permute_and_flip,
    permute_and_flip_probabilities,
    sample_categorical,
)


def test_seeded_streams_depend_only_on_labels():
    a = RandomSource(seed=5).child("x", 3).words(4)
    b = RandomSource(seed=5).child("x", 3).words(4)
    c = RandomSource(seed=5).child("x", 4).words(4)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_pickled_source_restarts_its_stream():
    rs = RandomSource(seed=1).child("s")
    first = rs.words(2)
    clone = pickle.loads(pickle.dumps(rs))
    assert np.array_equal(clone.words(2), first)


def test_secure_mode_is_not_reproducible():
    assert not np.array_equal(RandomSource().words(4), RandomSource().words(4))
    assert not RandomSource().seeded and RandomSource(seed=0).seeded


def test_seed_type_checked():
    with pytest.raises(TypeError, match="seed must be an int or None"):
        RandomSource(seed="7")  # type: ignore[arg-type]


def test_uniform_open_interval():
    u = RandomSource(seed=2).uniform(100_000)
    assert u.min() > 0 and u.max() < 1


def test_integers_and_randbelow_in_range():
    rs = RandomSource(seed=3)
    x = rs.integers(7, 10_000)
    assert x.min() == 0 and x.max() == 6
    big = 10**30
    assert all(0 <= rs.randbelow(big) < big for _ in range(100))


def test_pmf_sums_to_one_and_cdf_matches():
    k = np.arange(-200, 201)
    p = discrete_laplace_pmf(k, 3.0)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(np.cumsum(p)[190:210], discrete_laplace_cdf(k[190:210], 3.0))


def test_discrete_laplace_is_integer_and_symmetric():
    z = discrete_laplace(RandomSource(seed=4), 5.0, 50_000)
    assert z.dtype == np.int64
    assert abs(z.mean()) < 0.2


def test_binomial_small_n_matches_scipy():
    rs = RandomSource(seed=9)
    draws = np.array([binomial(rs, 20, 0.3) for _ in range(4000)])
    counts = np.bincount(draws, minlength=21)
    expected = stats.binom.pmf(np.arange(21), 20, 0.3) * draws.size
    keep = expected > 5
    obs = np.r_[counts[keep], counts[~keep].sum()]
    exp = np.r_[expected[keep], expected[~keep].sum()]
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-4


def test_binomial_huge_n_has_right_mean():
    rs = RandomSource(seed=10)
    n, p = 10**12, 2.3e-12
    draws = [binomial(rs, n, p) for _ in range(3000)]
    assert np.mean(draws) == pytest.approx(n * p, rel=0.08)


def test_binomial_edges():
    rs = RandomSource(seed=1)
    assert binomial(rs, 0, 0.5) == 0 and binomial(rs, 10, 0.0) == 0 and binomial(rs, 10, 1.0) == 10
    with pytest.raises(ValueError, match=r"p \(1.5\) must be in \[0, 1\]"):
        binomial(rs, 10, 1.5)


def test_exponential_mechanism_prefers_high_scores():
    rs = RandomSource(seed=6)
    picks = [exponential_mechanism(rs.child(i), np.array([0.0, 20.0, 0.0]), epsilon=1.0,
                                   sensitivity=1.0) for i in range(200)]
    assert np.mean(np.array(picks) == 1) > 0.99


def test_exponential_mechanism_probabilities():
    rs = RandomSource(seed=7)
    scores = np.array([0.0, math.log(3.0) * 2])  # exp(ε s / 2Δ) ratio 3 with ε=Δ=1
    picks = np.array([exponential_mechanism(rs.child(i), scores, epsilon=1.0, sensitivity=1.0)
                      for i in range(8000)])
    assert np.mean(picks == 1) == pytest.approx(0.75, abs=0.02)


def test_sample_categorical():
    x = sample_categorical(RandomSource(seed=8), np.array([0.0, 1.0, 3.0]), 40_000)
    assert not np.any(x == 0)
    assert np.mean(x == 2) == pytest.approx(0.75, abs=0.01)


class _ScriptedSource(RandomSource):
    """A source whose 64-bit words are given in advance (to hit the extreme draws exactly)."""

    def __init__(self, script):
        super().__init__(seed=0)
        self._script = [int(x) for x in script]

    def words(self, n):
        out, self._script = self._script[:n], self._script[n:]
        assert len(out) == n, "script exhausted"
        return np.asarray(out, dtype=np.uint64)


def test_uniform_never_returns_one_and_categorical_stays_in_range():
    # the largest word used to round (w + 0.5) up to 2^53, i.e. u == 1.0 exactly
    top = 2**64 - 1
    assert _ScriptedSource([top]).uniform(1)[0] < 1.0
    assert sample_categorical(_ScriptedSource([top]), np.array([1.0, 1.0]), 1)[0] == 1
    assert np.isfinite(gumbel(_ScriptedSource([top]), 1)[0])



def test_geometric_tail_is_not_truncated_at_the_uniform_grid():
    # The smallest 53-bit uniform (word 0) used to cap G at log(2^-54)/log(q) ≈ 37.4·b: an
    # outcome bound that makes count + Z distinguishable from count + 1 + Z. With the exact tail
    # (memoryless exponential beyond u < 2^-20) G is unbounded: here E = 20·ln2 + 128·ln2 + R.
    from beamsynth.transforms.noise import exponential, geometric

    script = [0, 0, 0, 1, 2**63]  # tail branch; 64 + 64 zero bits, then a one; then R's uniform
    g = geometric(_ScriptedSource(script), math.exp(-1.0), 1)[0]
    assert g >= 148 * math.log(2) - 1 > 37.4
    e = exponential(_ScriptedSource(script), 1.0, 1)[0]
    assert e == pytest.approx(148 * math.log(2) - math.log1p(-0.25), rel=1e-12)


def test_exponential_tail_branch_follows_the_exponential_law():
    # conditional on u < 2^-20, -log(u) - 20·ln2 must be Exp(1) (memorylessness)
    from beamsynth.transforms.noise import _standard_exponential

    e = _standard_exponential(RandomSource(seed=21), 50_000)
    assert stats.kstest(e, "expon").pvalue > 1e-4
    assert stats.kstest(e * 1.3, "expon").pvalue < 1e-4


def test_permute_and_flip_exact_law_is_epsilon_dp():
    """The enumerated output law of permute-and-flip moves by at most e^ε between neighbouring
    score vectors (every score shifted by at most Δ), and prefers the best candidate."""
    rng = np.random.default_rng(11)
    eps, delta = 0.7, 2.0
    worst = 0.0
    for _ in range(300):
        u = rng.uniform(-6, 6, 4)
        v = u + rng.uniform(-delta, delta, 4)
        p = permute_and_flip_probabilities(u, epsilon=eps, sensitivity=delta)
        q = permute_and_flip_probabilities(v, epsilon=eps, sensitivity=delta)
        assert p.sum() == pytest.approx(1.0) and q.sum() == pytest.approx(1.0)
        worst = max(worst, float(np.max(np.abs(np.log(p / q)))))
    assert worst <= eps + 1e-9
    p = permute_and_flip_probabilities(np.array([0.0, 5.0, 1.0]), epsilon=1.0, sensitivity=1.0)
    assert int(np.argmax(p)) == 1


def test_permute_and_flip_validates():
    with pytest.raises(ValueError, match="epsilon"):
        permute_and_flip(RandomSource(seed=1), np.array([1.0]), epsilon=0.0, sensitivity=1.0)
    with pytest.raises(ValueError, match="finite"):
        permute_and_flip(RandomSource(seed=1), np.array([1.0, np.nan]), epsilon=1.0, sensitivity=1.0)
