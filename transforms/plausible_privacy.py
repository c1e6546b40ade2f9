"""Plausible deniability (seed 001), the privacy test and its accounting, Beam-free.

* :func:`plausible_interval`, :func:`count_plausible_generic` — ``k'``, the number of records
  whose ``Pr{y = M(d)}`` falls in the seed's γ-interval (Definition 1);
  :func:`fast_plausible_counts` — ``k'`` for a seed-resampling network from the number of seed
  records matching the copied values;
* :func:`privacy_test` — Privacy Test 1 (``k' ≥ k``) or 2 (``k' ≥ k + Lap(1/ε0)``, Section 2.2);
* :func:`theorem1_guarantee` — Theorem 1 (Appendix C);
* :func:`poisson_counts`, :func:`candidate_bound`, :func:`candidate_release_cost` — the
  Poissonized number of invocations of Mechanism 1, its public bound ``C`` and the cost of
  releasing every candidate of a run.

Shapes: ``k'`` and thresholds are arrays ``[c]`` (one per candidate); ``logp`` is ``[c]`` for the
candidates' own seeds, ``[c, n]`` against ``n`` records.

Privacy (add/remove one record of the seeds ``D_S``): releasing one candidate through Test 2 is
``(ε₁, δ₁) = (ε0 + ln(1 + γ/t), exp(-ε0(k - t)))``-DP for any integer ``1 ≤ t < k`` (Theorem 1);
with ``c`` records per unit, group privacy gives ``(c·ε₁, c·e^{(c-1)ε₁}·δ₁)``. The number of
invocations is ``Poisson(rows)``, independent of the data, and the whole release is
``(C·ε₁, C·δ₁ + δ_tail)``-DP with ``C`` the smallest integer such that
``P(Poisson(rows) > C) ≤ δ_tail`` (proof in :func:`candidate_release_cost`). Test 1 gives
(k, γ)-plausible deniability only, no DP. Checked by brute force in ``tests/unit/test_plausible.py``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from beamsynth.transforms.noise import RandomSource, hypergeometric, laplace_internal, poisson

__all__ = [
    "count_plausible_generic",
    "candidate_bound",
    "candidate_release_cost",
    "plausible_interval",
    "poisson_counts",
    "privacy_test",
    "theorem1_guarantee",
]

_BELOW_ONE = float(np.nextafter(1.0, 0.0))


# =============================================================================================
# Privacy tests (Section 2.2) and Theorem 1
# =============================================================================================
def plausible_interval(logp: np.ndarray, gamma: float) -> np.ndarray:
    """The integer ``i ≥ 0`` with ``γ^-(i+1) < p ≤ γ^-i`` for ``p = exp(logp)``; ``-1`` when p = 0.

    Computed as ``floor(-ln p / ln γ)`` with a relative 1e-9 guard so probabilities equal to a
    power of γ up to round-off land in the interval the inequality assigns them.
    """
    logp = np.asarray(logp, dtype=np.float64)
    x = -logp / math.log(gamma)
    with np.errstate(invalid="ignore"):
        i = np.floor(x + 1e-9 * np.maximum(np.abs(x), 1.0))
    i = np.where(np.isfinite(logp), np.maximum(i, 0), -1)
    return i.astype(np.int64)


def count_plausible_generic(cand_logp: np.ndarray, logp_matrix: np.ndarray, gamma: float,
                            max_plausible: int | None = None) -> np.ndarray:
    """``k'`` per candidate: records whose ``Pr{y = M(d)}`` falls in the interval of the seed's.

    ``cand_logp[a]`` = log Pr{y_a = M(seed_a)}; ``logp_matrix[a, b]`` = log Pr{y_a = M(d_b)}.
    Capped at ``max_plausible`` (the early stop of Section 5; no effect on privacy).
    """
    ref = plausible_interval(cand_logp, gamma)
    idx = plausible_interval(logp_matrix, gamma)
    k = np.sum((idx == ref[:, None]) & (idx >= 0), axis=1).astype(np.int64)
    if max_plausible is not None:
        k = np.minimum(k, int(max_plausible))
    return k


def privacy_test(kprime: np.ndarray, *, k: int, epsilon0: float | None, rs: RandomSource | None) -> tuple[np.ndarray, np.ndarray]:
    """Privacy Test 1 (``epsilon0=None``: pass iff ``k' ≥ k``) or Test 2 (pass iff ``k' ≥ k + L``).

    Test 2 draws fresh ``L ~ Lap(1/ε0)`` per test (continuous Laplace: only the pass/fail bit is
    released, as in Theorem 1). Returns ``(passed, noisy_threshold)`` (threshold = k for Test 1).
    """
    kprime = np.asarray(kprime, dtype=np.int64)
    if epsilon0 is None:
        thr = np.full(kprime.shape, float(k))
    else:
        if rs is None:
            raise ValueError("the randomized test needs a RandomSource")
        thr = k + laplace_internal(rs, 1.0 / epsilon0, kprime.shape)
    return kprime >= thr, thr


def theorem1_guarantee(*, k: int, gamma: float, epsilon0: float, t: int) -> tuple[float, float]:
    """(ε, δ) of releasing one candidate with Privacy Test 2 (Theorem 1, Appendix C).

    ``ε = ε0 + ln(1 + γ/t)``, ``δ = exp(-ε0·(k - t))`` for an integer ``1 ≤ t < k``; the neighbours
    add or remove one record of the seed data set. Checked by brute-force hockey-stick divergence
    over all small datasets in ``tests/unit/test_plausible.py``.
    """
    if not (isinstance(k, int) and k >= 2):
        raise ValueError(f"k ({k!r}) must be an int >= 2")
    if not (isinstance(t, int) and 1 <= t < k):
        raise ValueError(f"t ({t!r}) must be an int in [1, {k - 1}]")
    if not gamma >= 1:
        raise ValueError(f"gamma ({gamma!r}) must be >= 1")
    if not epsilon0 > 0:
        raise ValueError(f"epsilon0 ({epsilon0!r}) must be > 0")
    return epsilon0 + math.log1p(gamma / t), math.exp(-epsilon0 * (k - t))


def poisson_counts(rs: RandomSource, lam: float, n: int) -> np.ndarray:
    """``n`` i.i.d. ``Poisson(lam)`` draws from :func:`~beamsynth.transforms.noise.poisson`
    (exact law, unbounded tails; no numpy RNG).

    These multiplicities decide how many candidates each seed yields, i.e. the number of
    invocations of Mechanism 1 and which seeds they use, so they are part of the mechanism, not
    post-processing: they come from the project's primitive stream. Until the tenth session they
    inverted a 53-bit uniform against a double-precision CDF table, which never gave a count with
    ``P(X > x)`` below about 2^-54, so the total was not exactly Poisson(rows) as the bound ``C``
    assumes.
    """
    return poisson(rs, lam, int(n))  # validates lam


def candidate_bound(rows: int, tail_delta: float) -> int:
    """The public bound ``C``: the smallest integer with ``P(Poisson(rows) > C) ≤ tail_delta``."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"rows ({rows!r}) must be an int >= 0")
    if not (0 < tail_delta < 1):
        raise ValueError(f"tail_delta ({tail_delta!r}) must be in (0, 1)")
    if rows == 0:
        return 0
    from scipy.stats import poisson

    c = max(0, int(poisson.isf(tail_delta, rows)))
    while poisson.sf(c, rows) > tail_delta:
        c += 1
    while c > 0 and poisson.sf(c - 1, rows) <= tail_delta:
        c -= 1
    return c


def candidate_release_cost(*, rows: int, k: int, gamma: float, epsilon0: float, t: int,
                           tail_delta: float, max_contributions: int = 1) -> dict[str, Any]:
    """(ε, δ) of releasing every candidate of one run through Privacy Test 2 (add/remove one unit).

    One invocation of Mechanism 1 (a uniform seed of ``D_S``, one candidate, released or dropped)
    is ``(ε₁, δ₁) = (ε0 + ln(1 + γ/t), exp(-ε0(k - t)))``-DP for adding or removing one record of
    ``D_S`` (Theorem 1, :func:`theorem1_guarantee`). With ``c = max_contributions`` records per unit
    group privacy gives ``(c·ε₁, c·e^{(c-1)ε₁}·δ₁)`` per invocation.

    The number of invocations ``N`` is ``Poisson(rows)`` (each seed yields ``Poisson(rows/|D_S|)``
    candidates): its law does not depend on the data (``rows`` is public; with an empty ``D_S``
    every invocation outputs nothing). Let ``C`` be the smallest integer with
    ``P(N > C) ≤ δ_tail`` (:func:`candidate_bound`). Conditioned on ``N = n`` the release is the
    basic sequential composition of ``n`` invocations, ``(n·ε₁, n·δ₁)``-DP, so for every set ``S``
    of outputs and neighbours ``D, D'``::

        P[M(D) ∈ S] = Σ_n P(N=n) P[M_n(D) ∈ S]
                    ≤ Σ_{n≤C} P(N=n) (e^{n·ε₁} P[M_n(D') ∈ S] + n·δ₁) + P(N > C)
                    ≤ e^{C·ε₁} P[M(D') ∈ S] + C·δ₁ + δ_tail,

    i.e. the release is ``(C·ε₁, C·δ₁ + δ_tail)``-DP. This is valid only because ``N`` is drawn
    independently of the data; a data-dependent ``rows`` (a DP count) would make ``C`` adaptive.
    Returns the per-invocation, per-unit and composed numbers with ``C`` and ``δ_tail``.
    """
    eps1, delta1 = theorem1_guarantee(k=k, gamma=gamma, epsilon0=epsilon0, t=t)
    c = int(max_contributions)
    if c < 1:
        raise ValueError(f"max_contributions ({max_contributions!r}) must be an int >= 1")
    eps_u, delta_u = c * eps1, min(1.0, c * math.exp((c - 1) * eps1) * delta1)
    bound = candidate_bound(rows, tail_delta)
    return {
        "theorem": "Theorem 1 (Bindschaedler et al., VLDB 2017), composed over a public bound C on "
                   "the Poisson(rows) number of invocations of Mechanism 1",
        "per_invocation": {"epsilon": eps1, "delta": delta1, "k": k, "gamma": gamma,
                           "epsilon0": epsilon0, "t": t},
        "per_unit_invocation": {"epsilon": eps_u, "delta": delta_u, "max_contributions": c},
        "rows": rows, "C": bound, "tail_delta": tail_delta,
        "epsilon": bound * eps_u, "delta": min(1.0, bound * delta_u + tail_delta),
    }


def fast_plausible_counts(matching: np.ndarray, *, n_seeds: int, max_check: int | None,
                          max_plausible: int | None, rs: RandomSource) -> np.ndarray:
    """``k'`` for the seed-resampling model from the number of seed records matching the copied values.

    Every matching record has the same ``Pr{y = M(d)} = q(y)`` (same interval), every other has 0,
    so ``k'`` = matching count. With ``max_check < |D_S|`` the generic path examines a uniform
    sample of ``max_check`` records: ``k' ~ Hypergeometric(|D_S|, matching, max_check)``, drawn here.
    Capped at ``max_plausible``.
    """
    kp = np.asarray(matching, dtype=np.int64)
    if max_check is not None and max_check < n_seeds and kp.size:
        kp = hypergeometric(rs, kp, np.maximum(n_seeds - kp, 0), max_check)  # exact, secure source
    if max_plausible is not None:
        kp = np.minimum(kp, int(max_plausible))
    return kp
