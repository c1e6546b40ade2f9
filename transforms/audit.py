"""Empirical privacy audits: run a mechanism many times on neighbouring datasets, bound ε from below.

Beam-free. A mechanism joins the audit with one :class:`AuditCase` (see ``tests/audit/cases.py``):
its name, the claimed (ε, δ), a function running the mechanism core on a dataset with a
:class:`~beamsynth.transforms.noise.RandomSource`, hard pairs of neighbouring datasets
(:class:`NeighbourPair`: one privacy unit added, worst-case or out-of-domain values, a heavy
unit), and a statistic of the release. The distinguishing events are ``{statistic ≥ t}`` and
their complements for every ``t`` of a fixed, declared grid.

The bound: if ``M`` is (ε, δ)-DP then for every event ``E`` and neighbours ``D, D'``,
``P[M(D') ∈ E] ≤ e^ε · P[M(D) ∈ E] + δ``, hence ``ε ≥ ln((p' - δ) / p)``. With ``k`` hits out of
``n`` runs, Clopper–Pearson gives a lower confidence bound for ``p'`` and an upper one for ``p``;
plugging them in gives a lower bound on ε that holds with probability ≥ ``1 - alpha``
(Bonferroni over every one-sided bound computed, for all events and both directions).
This is the black-box audit of Jagielski et al. 2020 and Nasr et al. 2021 (Section 3), with the
pair and event chosen by hand instead of by a poisoning attack.

A correct mechanism yields a bound below its claimed ε (except with probability ``alpha``); a
broken one (noise halved, a data-derived domain, a missing contribution bound) yields a bound
above it: the audit can fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from beamsynth.transforms.noise import RandomSource

__all__ = [
    "AUDIT_ALPHA",
    "AuditCase",
    "AuditResult",
    "NeighbourPair",
    "audit_pair",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "run_statistics",
]

AUDIT_ALPHA = 1e-4  # probability that a correct mechanism's audited bound exceeds its true ε


def _beta() -> Any:
    try:
        from scipy.stats import beta
    except ImportError as exc:  # scipy is a test/audit extra, not a core dependency
        raise ImportError("privacy audits need scipy: pip install 'beamsynth[test]'") from exc
    return beta


def _check_kn(k: int, n: int, alpha: float) -> None:
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"n ({n!r}) must be an int >= 1")
    if not (0 <= k <= n):
        raise ValueError(f"k ({k!r}) must be in [0, n={n}]")
    if not (0 < alpha < 1):
        raise ValueError(f"alpha ({alpha!r}) must be in (0, 1)")


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided lower confidence bound (level ``1 - alpha``) of a binomial p from k of n."""
    _check_kn(k, n, alpha)
    return 0.0 if k == 0 else float(_beta().ppf(alpha, k, n - k + 1))


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided upper confidence bound (level ``1 - alpha``) of a binomial p from k of n."""
    _check_kn(k, n, alpha)
    return 1.0 if k == n else float(_beta().ppf(1 - alpha, k + 1, n - k))


def epsilon_lower_bound(k_hi: int, n_hi: int, k_lo: int, n_lo: int, *, delta: float = 0.0,
                        alpha: float) -> float:
    """ε lower bound from one event: ``ln((CP_lower(k_hi/n_hi) - δ) / CP_upper(k_lo/n_lo))``.

    ``k_hi`` counts the event on the dataset where it is more likely, ``k_lo`` on its neighbour;
    each Clopper–Pearson bound is taken at level ``alpha/2``. Returns 0 when nothing can be said.
    """
    if not (0 <= delta < 1):
        raise ValueError(f"delta ({delta!r}) must be in [0, 1)")
    p_hi = clopper_pearson_lower(k_hi, n_hi, alpha / 2) - delta
    p_lo = clopper_pearson_upper(k_lo, n_lo, alpha / 2)
    if p_hi <= 0 or p_lo <= 0:
        return 0.0
    return max(0.0, math.log(p_hi / p_lo))


@dataclass(frozen=True)
class NeighbourPair:
    """Two datasets differing by one privacy unit (``larger`` = ``smaller`` + the unit).

    ``context`` carries what the statistic needs (e.g. the target cell and its count in
    ``smaller``); it is the auditor's knowledge, never read by the mechanism.
    """

    name: str
    smaller: Any
    larger: Any
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditCase:
    """One mechanism (or a deliberately broken variant) as the audit sees it.

    Attributes:
      name: mechanism name (registry key).
      epsilon, delta: the claimed guarantee under add/remove-one-unit neighbours.
      run: ``run(dataset, rs) -> release``: the mechanism core, all randomness from ``rs``.
      pairs: hard neighbouring pairs.
      statistic: ``statistic(release, pair) -> float``; events are ``{statistic >= t}``.
      thresholds: the declared grid of ``t`` (fixed before any run).
      runs: runs per dataset in the fast (default-suite) audit.
      slow_runs: runs per dataset in the slow audit.
      public: ``public(release)`` → everything released besides noisy values (for the
        no-data-derived-metadata check); ``None`` if the release has nothing else.
      broken: what a deliberately broken variant breaks (``""`` for real mechanisms).
      batch: optional fast path ``batch(dataset, pair, runs, rs) -> statistics`` running the
        same core vectorized over runs; it must have the law of ``statistic(run(...))`` (the
        audit tests compare both paths), and is used for the many-run audits.
    """

    name: str
    epsilon: float
    delta: float
    run: Callable[[Any, RandomSource], Any]
    pairs: Sequence[NeighbourPair]
    statistic: Callable[[Any, NeighbourPair], float]
    thresholds: Sequence[float]
    runs: int = 4000
    slow_runs: int = 40_000
    public: Callable[[Any], Any] | None = None
    broken: str = ""
    batch: Callable[[Any, NeighbourPair, int, RandomSource], np.ndarray] | None = None

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon ({self.epsilon!r}) must be a finite number > 0")
        if not (0 <= self.delta < 1):
            raise ValueError(f"delta ({self.delta!r}) must be in [0, 1)")
        if not self.pairs:
            raise ValueError(f"audit case {self.name!r} needs at least one neighbouring pair")
        if not self.thresholds:
            raise ValueError(f"audit case {self.name!r} needs at least one threshold")


@dataclass(frozen=True)
class AuditResult:
    """Outcome of auditing one pair: the best ε lower bound over the declared events."""

    mechanism: str
    pair: str
    claimed_epsilon: float
    claimed_delta: float
    epsilon_lower_bound: float
    runs: int
    event: str
    alpha: float

    @property
    def passed(self) -> bool:
        """True when the audited lower bound stays at or below the claimed ε."""
        return self.epsilon_lower_bound <= self.claimed_epsilon

    def row(self) -> str:
        """One Markdown table row."""
        return (f"| {self.mechanism} | {self.pair} | {self.claimed_epsilon:g} | "
                f"{self.epsilon_lower_bound:.3f} | {self.runs} | {self.event} |")


def run_statistics(case: AuditCase, pair: NeighbourPair, dataset: Any, runs: int,
                   rs: RandomSource, *, use_batch: bool = True) -> np.ndarray:
    """The statistic of ``runs`` independent executions of the mechanism on ``dataset``.

    With ``case.batch`` (and ``use_batch``) the vectorized path runs; otherwise run ``i`` calls
    ``case.run`` with ``rs.child(i)``. ``pair`` is passed to the statistic (its context).
    """
    if case.batch is not None and use_batch:
        return np.asarray(case.batch(dataset, pair, runs, rs), dtype=np.float64)
    out = np.empty(runs, dtype=np.float64)
    for i in range(runs):
        out[i] = float(case.statistic(case.run(dataset, rs.child(i)), pair))
    return out


def audit_pair(case: AuditCase, pair: NeighbourPair, *, runs: int, rs: RandomSource,
               alpha: float = AUDIT_ALPHA, use_batch: bool = True) -> AuditResult:
    """Audit one neighbouring pair: ``runs`` executions on each side, best bound over events.

    Events: ``{S ≥ t}`` and ``{S < t}`` for each declared ``t``, each in both directions. Every
    one-sided Clopper–Pearson bound is taken at ``alpha / (8·len(thresholds))``, so the maximum
    over all events is a valid lower bound with probability ≥ ``1 - alpha``.
    """
    if not (isinstance(runs, int) and runs >= 1):
        raise ValueError(f"runs ({runs!r}) must be an int >= 1")
    s0 = run_statistics(case, pair, pair.smaller, runs, rs.child("smaller"), use_batch=use_batch)
    s1 = run_statistics(case, pair, pair.larger, runs, rs.child("larger"), use_batch=use_batch)
    ts = list(case.thresholds)
    # 8 one-sided bounds per threshold; epsilon_lower_bound halves its alpha for its two bounds
    a = 2 * alpha / (8 * len(ts))
    best, where = 0.0, "none"
    for t in ts:
        k0, k1 = int(np.sum(s0 >= t)), int(np.sum(s1 >= t))
        for label, kh, kl in ((f"S>={t:g} on larger", k1, k0), (f"S>={t:g} on smaller", k0, k1),
                              (f"S<{t:g} on larger", runs - k1, runs - k0),
                              (f"S<{t:g} on smaller", runs - k0, runs - k1)):
            b = epsilon_lower_bound(kh, runs, kl, runs, delta=case.delta, alpha=a)
            if b > best:
                best, where = b, label
    return AuditResult(case.name, pair.name, case.epsilon, case.delta, best, runs, where, alpha)
