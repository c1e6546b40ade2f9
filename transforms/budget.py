"""Privacy budgets as value types, and the accountant that spends them at pipeline build time.

Neighbouring datasets throughout beamsynth differ by adding or removing one *privacy unit* (one
record, or all records of one privacy id after contribution bounding). Budgets compose by basic
sequential composition: (ε1, δ1) then (ε2, δ2) costs (ε1 + ε2, δ1 + δ2). Mechanisms that run on
disjoint parts of the data (parallel composition) are charged once by the caller.

The accountant is a driver-side object: transforms ask it for their budget in ``__init__`` or at
``expand`` time, i.e. while the pipeline graph is built and before any data is read. A request
that would exceed the total raises :class:`BudgetExceededError` naming the step and the amounts,
so an overspending pipeline never starts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ApproxDP",
    "Budget",
    "BudgetExceededError",
    "PrivacyAccountant",
    "PureDP",
    "Spend",
    "DELTA_WARN_ABOVE",
    "as_budget",
    "MAX_ROWS",
    "check_rows",
    "warn_large_delta",
    "zcdp_approx",
    "zcdp_delta",
    "zcdp_rho",
]

_TOLERANCE = 1e-9  # relative slack for float round-off when spends add up to the total exactly
_LOG = logging.getLogger(__name__)

DELTA_WARN_ABOVE = 1e-3
"""A total δ above this is taken with a warning when the pipeline is built (docs/options.md,
"Budgets"): (ε, δ)-DP lets a mechanism fail its ε guarantee with probability δ, e.g. publish a
δ share of the records outright, so δ must be far below 1/n for n privacy units (1e-6 or less
for a hundred thousand units). δ ≥ 1 is refused (:class:`ApproxDP`)."""
_WARNED_DELTAS: set[float] = set()


class BudgetExceededError(ValueError):
    """Raised at pipeline construction when a step asks for more budget than remains."""


def _check_epsilon(epsilon: Any) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise TypeError(f"epsilon must be a number, got {type(epsilon).__name__} ({epsilon!r})")
    eps = float(epsilon)
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"epsilon ({epsilon!r}) must be a finite number > 0")
    return eps


def _check_delta(delta: Any) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)):
        raise TypeError(f"delta must be a number, got {type(delta).__name__} ({delta!r})")
    d = float(delta)
    if not (0.0 <= d < 1.0) or not math.isfinite(d):
        raise ValueError(f"delta ({delta!r}) must be in [0, 1)")
    return d


def warn_large_delta(delta: float) -> None:
    """Log a warning, once per process and value, for a total δ above :data:`DELTA_WARN_ABOVE`."""
    if delta > DELTA_WARN_ABOVE and delta not in _WARNED_DELTAS:
        _WARNED_DELTAS.add(delta)
        _LOG.warning("delta=%g is above %g: (ε, δ)-DP may fail with probability δ (e.g. publish "
                     "a δ share of the records outright); choose δ far below 1/n for n privacy "
                     "units, such as 1e-6 for a hundred thousand (docs/options.md, 'Budgets')",
                     delta, DELTA_WARN_ABOVE)


MAX_ROWS = 10**10  # requested synthetic rows per release: 200,000 shards of 50,000 planned when built


def check_rows(rows: Any, *, shown: str | None = None) -> int | None:
    """A requested synthetic row count: ``None`` (a DP count of the records sets it) or a whole
    number in [1, ``MAX_ROWS``]. ``0`` is refused: it would spend the synthesizer's ε for no released row.
    ``shown``: the setting as the caller wrote it (``--rows 0``, ``rows: 0``; default
    ``rows=0``), which the message echoes."""
    if rows is None:
        return None
    shown = shown or f"rows={rows!r}"
    if isinstance(rows, bool) or not isinstance(rows, int):
        raise TypeError(f"{shown}: the row count must be a whole number >= 1 or unset, got "
                        f"{type(rows).__name__}")
    if rows < 1:
        raise ValueError(f"{shown}: the row count must be a whole number >= 1, or unset for a DP "
                         "count of the records (a synthesizer asked for no row would spend its ε "
                         "for nothing)")
    if rows > MAX_ROWS:
        raise ValueError(f"{shown}: at most {MAX_ROWS:,} synthetic rows per release (the sampling "
                         "shards are planned when the pipeline is built); release a larger table "
                         "as several releases, each with its own budget")
    return rows


@dataclass(frozen=True, kw_only=True)
class ApproxDP:
    """An (ε, δ)-DP budget under add/remove-one-privacy-unit neighbours.

    Args:
      epsilon: ε > 0, finite.
      delta: δ in [0, 1). ``ApproxDP(epsilon=e, delta=0)`` is pure ε-DP.
    """

    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", _check_delta(self.delta))

    @property
    def is_pure(self) -> bool:
        """True when δ = 0."""
        return self.delta == 0.0

    def __add__(self, other: Budget) -> ApproxDP:
        if not isinstance(other, ApproxDP):
            raise TypeError(f"cannot add {type(other).__name__} to a budget")
        return ApproxDP(epsilon=self.epsilon + other.epsilon, delta=self.delta + other.delta)

    def scale(self, fraction: float) -> ApproxDP:
        """This budget times ``fraction`` (0 < fraction ≤ 1), both ε and δ."""
        if not (0.0 < fraction <= 1.0 + _TOLERANCE):
            raise ValueError(f"fraction ({fraction!r}) must be in (0, 1]")
        return type(self)._make(self.epsilon * fraction, self.delta * fraction)

    @classmethod
    def _make(cls, epsilon: float, delta: float) -> ApproxDP:
        if delta == 0.0:
            return PureDP(epsilon=epsilon)
        return ApproxDP(epsilon=epsilon, delta=delta)

    def split(self, weights: Mapping[str, float]) -> dict[str, ApproxDP]:
        """Split this budget into named parts proportional to ``weights`` (sequential composition).

        ``PureDP(1).split({"structure": 0.3, "conditionals": 0.7})`` gives ε = 0.3 and ε = 0.7.
        """
        if not weights:
            raise ValueError("weights must name at least one part")
        bad = {k: w for k, w in weights.items() if not (isinstance(w, (int, float)) and w > 0)}
        if bad:
            raise ValueError(f"split weights must be > 0, got {bad}")
        total = float(sum(weights.values()))
        return {k: self.scale(w / total) for k, w in weights.items()}

    def to_dict(self) -> dict[str, float]:
        """JSON-friendly form used in manifests."""
        return {"epsilon": self.epsilon, "delta": self.delta}

    def __str__(self) -> str:
        if self.delta == 0.0:
            return f"ε={self.epsilon:g}"
        return f"(ε={self.epsilon:g}, δ={self.delta:g})"


@dataclass(frozen=True, kw_only=True)
class PureDP(ApproxDP):
    """A pure ε-DP budget (δ = 0)."""

    delta: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.delta != 0.0:
            raise ValueError(f"PureDP has delta 0, got {self.delta!r}; use ApproxDP")


Budget = ApproxDP


def as_budget(epsilon: float, delta: float = 0.0) -> ApproxDP:
    """Build :class:`PureDP` when δ = 0, else :class:`ApproxDP`."""
    return ApproxDP._make(_check_epsilon(epsilon), _check_delta(delta))


@dataclass(frozen=True)
class Spend:
    """One recorded spend: which step, what it cost, and how the mechanism uses it."""

    step: str
    budget: ApproxDP
    mechanism: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form used in manifests."""
        return {
            "step": self.step,
            "mechanism": self.mechanism,
            **self.budget.to_dict(),
            "details": dict(self.details),
        }


class PrivacyAccountant:
    """Hands out budget while the pipeline is built; refuses to overspend.

    Example::

        acct = PrivacyAccountant(total=PureDP(epsilon=1.0))
        b = acct.spend("marginals", PureDP(epsilon=0.9), mechanism="discrete Laplace")
        acct.spend("count", PureDP(epsilon=0.2), mechanism="discrete Laplace")  # raises

    The accountant is never serialized into workers; transforms capture the budgets they were
    handed, not the accountant.
    """

    def __init__(self, *, total: ApproxDP) -> None:
        if not isinstance(total, ApproxDP):
            raise TypeError(f"total must be a PureDP or ApproxDP budget, got {type(total).__name__}")
        warn_large_delta(total.delta)
        self._total = total
        self._spends: list[Spend] = []
        self.exported = False  # to_dict() was called: the spends were taken for a manifest

    @property
    def total(self) -> ApproxDP:
        """The total budget this accountant may hand out."""
        return self._total

    @property
    def spends(self) -> tuple[Spend, ...]:
        """Every spend so far, in order."""
        return tuple(self._spends)

    @property
    def spent_epsilon(self) -> float:
        """Sum of ε over all spends."""
        return math.fsum(s.budget.epsilon for s in self._spends)

    @property
    def spent_delta(self) -> float:
        """Sum of δ over all spends."""
        return math.fsum(s.budget.delta for s in self._spends)

    @property
    def remaining(self) -> tuple[float, float]:
        """(ε, δ) not yet spent."""
        return (
            max(0.0, self._total.epsilon - self.spent_epsilon),
            max(0.0, self._total.delta - self.spent_delta),
        )

    def can_spend(self, budget: ApproxDP) -> bool:
        """Whether ``budget`` fits in what remains."""
        eps_left, delta_left = self.remaining
        return budget.epsilon <= eps_left * (1 + _TOLERANCE) + _TOLERANCE * 1e-3 and (
            budget.delta <= delta_left * (1 + _TOLERANCE) + 1e-300
        )

    def spend(
        self,
        step: str,
        budget: ApproxDP,
        *,
        mechanism: str,
        details: Mapping[str, Any] | None = None,
    ) -> ApproxDP:
        """Record a spend and return ``budget``; raise :class:`BudgetExceededError` if it does not fit."""
        if not isinstance(budget, ApproxDP):
            raise TypeError(f"budget for step {step!r} must be PureDP/ApproxDP, got {budget!r}")
        if not self.can_spend(budget):
            eps_left, delta_left = self.remaining
            raise BudgetExceededError(
                f"step {step!r} asks for {budget} but only (ε={eps_left:g}, δ={delta_left:g}) of "
                f"the total {self._total} remains (already spent: "
                + ", ".join(f"{s.step} {s.budget}" for s in self._spends or [])
                + ("" if self._spends else "nothing")
                + ")"
            )
        self._spends.append(Spend(step, budget, mechanism, dict(details or {})))
        return budget

    def to_dict(self) -> dict[str, Any]:
        """Manifest form: total, every spend, and the sums."""
        self.exported = True
        return {
            "neighbouring": "add/remove one privacy unit",
            "composition": "basic sequential composition",
            "total": self._total.to_dict(),
            "spent": {"epsilon": self.spent_epsilon, "delta": self.spent_delta},
            "spends": [s.to_dict() for s in self._spends],
        }


# -- zero-concentrated DP (issue 18: Gaussian tables, as AIM accounts them) ------------------------
def zcdp_approx(rho: float, delta: float) -> ApproxDP:
    """The (ε, δ) a ρ-zCDP part is reported at on its own: Bun & Steinke 2016, Prop. 1.3,
    ``ε = ρ + 2√(ρ ln(1/δ))`` (looser than :func:`zcdp_delta`, which the total spend uses; for
    per-table reports only)."""
    return ApproxDP(epsilon=float(rho + 2 * math.sqrt(rho * math.log(1 / delta))), delta=delta)


def zcdp_delta(rho: float, epsilon: float) -> float:
    """The smallest δ this module certifies for a ρ-zCDP mechanism at ε: Canonne, Kamath &
    Steinke 2020, Cor. 13, ``δ = min over α > 1 of exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α``,
    minimized by golden-section search over ``log(α − 1)`` in ``[−9.2, 9.2]`` (any α gives a
    valid bound, so the search only loses tightness, never validity). Tighter than Bun &
    Steinke 2016's ``ε = ρ + 2√(ρ ln(1/δ))``."""
    if not (rho >= 0 and math.isfinite(rho)) or not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"rho ({rho!r}) must be >= 0 and epsilon ({epsilon!r}) > 0, finite")
    if rho == 0:
        return 0.0

    def log_delta(u: float) -> float:  # u = log(α − 1)
        a = 1.0 + math.exp(u)
        return (a - 1) * (a * rho - epsilon) - u + a * math.log1p(-1 / a)

    lo, hi = -9.2, 9.2
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = log_delta(x1), log_delta(x2)
    for _ in range(80):
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = log_delta(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = log_delta(x2)
    return min(1.0, math.exp(min(f1, f2, 0.0)))


def zcdp_rho(epsilon: float, delta: float) -> float:
    """The largest ρ (to 10⁻¹² relative) whose ρ-zCDP implies (ε, δ)-DP by :func:`zcdp_delta`
    (bisection; δ(ρ) grows with ρ). ``zcdp_rho(1, 1e-9)`` = 0.014973, the ρ private-pgm's AIM
    uses for the same (ε, δ)."""
    eps, d = _check_epsilon(epsilon), _check_delta(delta)
    if d == 0:
        raise ValueError("zCDP needs delta > 0 (pure DP: spend ε directly)")
    lo, hi = 0.0, eps
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if zcdp_delta(mid, eps) <= d else (lo, mid)
    return lo
