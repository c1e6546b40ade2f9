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
    assert np.isfinite(gumbel(_ScriptedSource([top] * 4), 1)[0])



def test_geometric_tail_is_not_truncated_at_the_uniform_grid():
    # The smallest 53-bit uniform (word 0) used to cap G at log(2^-54)/log(q) ≈ 37.4·b: an
    # outcome bound that makes count + Z distinguishable from count + 1 + Z. With the exact tail
    # (memoryless exponential beyond u < 2^-20) G is unbounded: here E = 20·ln2 + 128·ln2 + R.
    from beamsynth.transforms.noise import exponential, geometric

    # tail branch; 64 + 64 zero bits, then a one; then R's fine uniform: binade 0 (word 1) and
    # the lowest mantissa (word 0), V = 1/2 (up to 2^-53)
    script = [0, 0, 0, 1, 1, 0]
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


# -- the run secret: every secure draw is a function of (secret, labels) ----------------------------
def test_run_secret_streams_depend_only_on_secret_and_labels():
    from beamsynth.transforms.noise import RunSecret

    secret = RunSecret()
    a = RandomSource(seed=secret).child("step", 3, "global")
    assert not a.seeded and a.seed is None and a.run_secret is secret
    same = RandomSource(seed=secret).child("step", np.int64(3), "global").words(5)
    assert np.array_equal(a.words(2), same[:2]) and np.array_equal(a.words(3), same[2:])
    assert not np.array_equal(RandomSource(seed=secret).child("step", 4, "global").words(5), same)
    assert not np.array_equal(RandomSource(seed=RunSecret()).child("step", 3, "global").words(5), same)


def test_run_secret_survives_pickling_and_is_never_shown():
    import json

    from beamsynth.transforms.noise import RunSecret

    secret = RunSecret(bytes(range(32)))
    rs = RandomSource(seed=secret).child("noise", "global")
    first = rs.words(4)
    clone = pickle.loads(pickle.dumps(rs))
    assert clone.run_secret == secret and np.array_equal(clone.words(4), first)
    assert np.array_equal(clone.child("x").secret_key(), RandomSource(seed=secret).child("noise", "global", "x")
                          .secret_key())
    text = repr(secret) + repr(rs) + str(secret)
    assert "<256-bit secret, hidden>" in text and bytes(range(32)).hex() not in text
    with pytest.raises(TypeError):
        json.dumps({"seed": secret})
    with pytest.raises(ValueError, match="at least 32 bytes, got bytes of length 8"):
        RunSecret(b"12345678")


def test_run_seed_resolves_none_once_and_passes_the_rest_through():
    from beamsynth.transforms.noise import RunSecret, run_seed

    a, b = run_seed(None), run_seed(None)
    assert isinstance(a, RunSecret) and a != b
    assert run_seed(a) is a and run_seed(7) == 7 and run_seed(np.int64(7)) == 7
    with pytest.raises(TypeError, match=r"seed must be an int or None, got str \('7'\)"):
        run_seed("7")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed must be an int or None, got bool"):
        run_seed(True)


def test_secure_derived_draws_are_reproducible_from_the_secret():
    """numpy_generator (post-processing) and every sampler give the same draws for the same
    (secret, labels), so a recomputed step reproduces them."""
    from beamsynth.transforms.noise import RunSecret

    secret = RunSecret()

    def draws():
        rs = RandomSource(seed=secret).child("s")
        return (discrete_laplace(rs.child(1), 2.0, 8).tolist(), gumbel(rs.child(2), 3).tolist(),
                rs.child(3).numpy_generator().integers(0, 100, 5).tolist(), rs.child(4).randbelow(10**30))

    assert draws() == draws()


# -- unbounded Gumbel / internal Laplace ----------------------------------------------------------
_OLD_GUMBEL_MAX = -math.log(-math.log(1.0 - 2.0**-53))  # 36.74: -log(-log u) at the largest u < 1


def _tiny_exponential_script(binade: int) -> list[int]:
    """Words making _standard_exponential return E ≈ 2^-(binade + 2): N = 0 (word 1), then the
    fine uniform in binade ``binade`` (zero words then a word with ``binade % 64`` trailing zeros),
    lowest mantissa."""
    return [1] + [0] * (binade // 64) + [1 << (binade % 64), 0]


def test_gumbel_reaches_past_the_old_bound():
    g = gumbel(_ScriptedSource(_tiny_exponential_script(150)), 1)[0]
    assert g == pytest.approx(152 * math.log(2), rel=1e-6) and g > 40 > _OLD_GUMBEL_MAX
    # the lower tail: E = ln2·200 + R, G = -log E
    low = gumbel(_ScriptedSource([0, 0, 0, 1 << 8, 1, 0]), 1)[0]
    assert low == pytest.approx(-math.log(200 * math.log(2) - math.log1p(-0.25)), rel=1e-9)
    assert low < -3.62  # the old sampler's minimum (-log(-log 2^-54) ≈ -3.62)


def test_exponential_mechanism_gives_a_gap_of_50_nonzero_probability():
    """Candidate 1 trails by 50 (ε/2Δ · gap): exact probability e^-50/(1 + e^-50) ≈ 2e-22. The
    old sampler could never pick it (its Gumbel range [-3.62, 36.74] is narrower than 50); here a
    finite word script (probability 2^-(64·8) > 0) picks it, so its probability is nonzero."""
    assert _OLD_GUMBEL_MAX - (-math.log(-math.log(2.0**-54))) < 50.0
    # words, interleaved for 2 draws: N (1, 1: both 0); binades (1: 0; 0, 0, 1<<22: 150); mantissas
    script = [1, 1, 1, 0, 0, 1 << 22, 0, 0]
    pick = exponential_mechanism(_ScriptedSource(script), np.array([50.0, 0.0]), epsilon=2.0, sensitivity=1.0)
    assert pick == 1


def test_laplace_internal_is_unbounded():
    from beamsynth.transforms.noise import laplace_internal

    # sign word with the top bit set (+), then E = ln2·128 + R
    x = laplace_internal(_ScriptedSource([2**63, 0, 0, 1, 1, 0]), 2.0, 1)[0]
    assert x == pytest.approx(2.0 * (128 * math.log(2) - math.log1p(-0.25)), rel=1e-9)
    assert x > 2.0 * 37.5  # the old inversion stopped at -log(2^-54)·scale ≈ 37.4·scale
    y = laplace_internal(_ScriptedSource([0, 1, 1, 0]), 1.0, 1)[0]
    assert y == pytest.approx(math.log1p(-0.25), rel=1e-9)  # negative sign, E = R


# -- exact integer samplers ------------------------------------------------------------------------
def test_uniform_below_is_in_range_and_validated():
    from beamsynth.transforms.noise import uniform_below

    bounds = np.array([1, 2, 3, 7, 1000, 2**40 + 3])
    x = np.stack([uniform_below(RandomSource(seed=i), bounds) for i in range(300)])
    assert np.all(x >= 0) and np.all(x < bounds) and np.all(x[:, 0] == 0)
    assert set(x[:, 2].tolist()) == {0, 1, 2}
    with pytest.raises(ValueError, match=r"bounds must be in \[1, 2\*\*53\), got min 0"):
        uniform_below(RandomSource(seed=1), np.array([0, 3]))


def test_hypergeometric_edges_and_validation():
    from beamsynth.transforms.noise import hypergeometric

    rs = RandomSource(seed=2)
    assert hypergeometric(rs, np.array([5, 0, 4, 3]), np.array([0, 5, 4, 3]),
                          np.array([3, 3, 8, 0])).tolist() == [3, 0, 4, 0]
    x = hypergeometric(rs, np.full(2000, 6), np.full(2000, 4), 7)
    assert x.min() >= 3 and x.max() <= 6  # at least 7 - 4 good, at most 6
    with pytest.raises(ValueError, match="0 <= nsample <= good \\+ bad"):
        hypergeometric(rs, np.array([1]), np.array([1]), 3)
