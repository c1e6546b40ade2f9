"""Prefix trees (seed 003), the privacy arithmetic: calibration, thresholds and their proofs.

Beam-free, public parameters only (ε, ``k = max_contributions``, the fanout, the declared depth):

* :class:`PrefixAccounting` — one run's privacy arithmetic (what the manifest records);
* :func:`basic_accounting` — Section 2.3, Figure 1, Corollary 2 plus the leaves' re-measurement;
* :func:`improved_accounting` with :func:`improved_privacy_loss` — Section 3, Figure 2, Theorem 3,
  Appendix A; calibrations ``"tight"`` (default) and ``"theorem3"`` (:data:`CALIBRATIONS`);
* :func:`direct_accounting` with :func:`direct_scales` — Section 4, Figures 3, 4;
* :func:`default_threshold`, :func:`spurious_threshold` — thresholds from public parameters.

Privacy (add/remove one unit of at most ``k`` records; discrete Laplace noise, integer-valued):

* basic: ``B`` levels at scale ``k/ε_level`` (the nodes of a level are disjoint, L1 sensitivity
  ``k``) and the leaves re-measured at ``k/ε_final`` → ``(B·ε_level + ε_final, 0) = (ε, 0)``-DP;
* improved: record-level ``ε₀`` (scale ``1/ε₀``), threshold ``b``, discount ``t``; one record costs
  ``ε₀ + Σ_{j≥1} h(jt)`` (:func:`improved_privacy_loss`, ``≤ 2ε₀`` with Theorem 3's
  ``t = ⌈b + ln 2/ε₀⌉``), independent of depth; a unit of ``k`` records by group privacy;
* direct: the root total and ``maxdepth`` levels at scale ``k(maxdepth + 1)/ε``, terminal cells at
  the scale their path's unused budget allows (:func:`direct_scales`) → ``(ε, 0)``-DP.

``tests/unit/test_prefix.py`` checks each function against its theorem (for the improved method
by enumerating every released tree of small neighbouring inputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CALIBRATIONS",
    "PrefixAccounting",
    "basic_accounting",
    "default_threshold",
    "direct_accounting",
    "direct_scales",
    "improved_accounting",
    "improved_privacy_loss",
    "spurious_threshold",
]


# -- accounting ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrefixAccounting:
    """The privacy arithmetic of one run (what the manifest records)."""

    method: str
    epsilon: float
    max_contributions: int
    levels: int
    scale: float
    threshold: float | None = None
    discount: int | None = None
    final_scale: float | None = None
    epsilon_level: float | None = None
    epsilon_final: float | None = None
    loss: float | None = None  # improved (tight): the exact worst-case loss per unit, ≤ epsilon
    terminal_budget: bool | None = None  # direct: terminal cells get what a shorter path leaves
    paper: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


def default_threshold(scale: float, fanout: int) -> float:
    """``b = 2·s·ln(fanout)``: a zero-count child crosses it with probability ≈ 1/(2 fanout²).

    Section 3's remark asks for ``b ≥ ln(fanout)/ε₀`` so the recursion cannot diverge; twice that
    keeps spurious expansions rare. Depends on public parameters only.
    """
    return float(math.ceil(2.0 * scale * math.log(max(fanout, 2))))


def _check_pos(name: str, value: Any, *, integer: bool = False, low: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise TypeError(f"{name} must be {'an int' if integer else 'a number'}, got {value!r}")
    if not (math.isfinite(value) and value > low):
        raise ValueError(f"{name} ({value!r}) must be finite and > {low:g}")


def basic_accounting(*, epsilon: float, max_depth: int, max_contributions: int = 1,
                     final_fraction: float = 0.25, fanout: int = 2,
                     threshold: float | None = None) -> PrefixAccounting:
    """Basic adaptive histogram (Corollary 2 + re-measurement): ``B·ε_level + ε_final = ε``."""
    _check_pos("epsilon", epsilon)
    _check_pos("max_depth", max_depth, integer=True)
    _check_pos("max_contributions", max_contributions, integer=True)
    if not 0.0 < final_fraction < 1.0:
        raise ValueError(f"final_fraction ({final_fraction!r}) must be in (0, 1)")
    eps_final = epsilon * final_fraction
    eps_level = (epsilon - eps_final) / max_depth
    scale = max_contributions / eps_level
    b = default_threshold(scale, fanout) if threshold is None else float(threshold)
    return PrefixAccounting(
        method="basic", epsilon=max_depth * eps_level + eps_final, max_contributions=max_contributions,
        levels=max_depth, scale=scale, threshold=b, final_scale=max_contributions / eps_final,
        epsilon_level=eps_level, epsilon_final=eps_final,
        paper="seed 003 §2.3, Figure 1, Corollary 2 (εB-DP) + second pass")


CALIBRATIONS = ("tight", "theorem3")
SPURIOUS_RATE = 0.5  # expected noise-only children per split node that cross the threshold
_TYPICAL_DEPTH = 8  # levels a frequent key's prefixes are weighed over when tuning (≤ the declared depth)


def _log_survival(m: int, eps0: float) -> float:
    """``log P(Z ≥ m)`` for discrete Laplace ``P(Z = z) ∝ exp(-ε₀|z|)`` at an integer ``m``."""
    q = math.exp(-eps0)
    if m >= 0:
        return m * -eps0 - math.log1p(q)
    return math.log1p(-math.exp((1 - m) * -eps0) / (1 + q))


def improved_privacy_loss(eps0: float, threshold: float, discount: int) -> float:
    """Worst-case privacy loss of one record for the improved histogram (discrete Laplace).

    ``ε₀ + Σ_{j≥1} h(j·t)`` with ``h(x) = log p(x+1)/p(x)``, ``p(x) = P(x + Z ≥ b)`` (``b`` the
    integer threshold ``⌈threshold⌉``, ``t`` the discount). Theorem 3's proof (seed 003 §3),
    read more tightly: *removing* a record costs at most the leaf term ``ε₀`` (the path terms are
    ≤ 1); *adding* one changes the counts along one path (stability, Appendix A), each ≥ ``t``
    above the next: if the leaf's released count differs it costs ``ε₀`` and the path's internal
    counts are ``≥ t, 2t, ...``; if the difference dies above the leaf the path starts at ``≥ 0``
    and ``h(0) ≤ ε₀``. Both cases are ``≤ ε₀ + Σ_{j≥1} h(jt)``; with the paper's
    ``t ≥ b + ln 2/ε₀`` this is below the paper's ``2ε₀``. ``tests/unit/test_prefix.py``
    enumerates every released tree of small neighbouring inputs and finds this bound attained,
    never exceeded.
    """
    b = int(math.ceil(threshold))
    if discount < 1:
        raise ValueError(f"discount ({discount!r}) must be >= 1")
    total = eps0
    j = 1
    while True:
        x = j * discount
        term = _log_survival(b - x - 1, eps0) - _log_survival(b - x, eps0)
        total += term
        if x > b and term < 1e-15:
            return total
        j += 1


def spurious_threshold(scale: float, fanout: int, rate: float = SPURIOUS_RATE) -> int:
    """Smallest integer ``b`` with ``(fanout - 1)·P(Z ≥ b) ≤ rate`` for noise of ``scale``.

    A split node has at most ``fanout - 1`` children without records besides its real ones; each
    crosses ``b`` on noise alone with probability ``P(Z ≥ b)``. Keeping their expected number at
    ``rate = 1/2`` makes the noise-only subtree below a split node a subcritical branching
    process (expected size ≤ 1), so the tree cannot diverge (Section 3's remark asks for
    ``b ≥ ln(fanout)/ε₀`` for the same reason). Public parameters only.
    """
    q = math.exp(-1.0 / scale)
    log_excess = math.log(max(fanout, 2) - 1) - math.log1p(q) - math.log(rate)

    def fits(b: int) -> bool:  # (fanout - 1)·q^b/(1 + q) ≤ rate, in logs (q^b underflows)
        return log_excess - b / scale <= 0.0

    # closed form, then a few integer steps against rounding (a loop from 1 would run ~scale times)
    b = max(1, math.ceil(scale * log_excess))
    while b > 1 and fits(b - 1):
        b -= 1
    while not fits(b):
        b += 1
    return b


def _smallest_discount(eps0: float, b: float, budget: float) -> int | None:
    """Smallest ``t ≥ max(1, ⌈b⌉)`` with ``improved_privacy_loss ≤ budget`` (decreasing in t)."""
    lo = max(1, int(math.ceil(b)))
    if eps0 >= budget:
        return None
    hi = lo
    while improved_privacy_loss(eps0, b, hi) > budget:
        if hi > 64 * lo + int(64 / eps0):
            return None
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if improved_privacy_loss(eps0, b, mid) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return hi


def improved_accounting(*, epsilon: float, max_contributions: int = 1, fanout: int = 2,
                        threshold: float | None = None, depth: int | None = None,
                        calibration: str = "tight") -> PrefixAccounting:
    """Improved adaptive histogram (Theorem 3): noise ``1/ε₀``, threshold ``b``, discount ``t``.

    ``calibration="theorem3"``: the paper's parameters, ``ε₀ = ε/(2k)``,
    ``b = 2·s·ln(fanout)``, ``t = ⌈b + ln 2/ε₀⌉`` (2ε₀ per record).
    ``calibration="tight"`` (default): ``(ε₀, b, t)`` such that
    :func:`improved_privacy_loss` ``≤ ε/k`` per record, chosen from public parameters only
    (ε, k, the fanout and the declared depth): for each ``ε₀`` on a grid, ``b`` from
    :func:`spurious_threshold` (or the given ``threshold``) and the smallest ``t`` that fits;
    kept is the choice with the least count a key needs to survive ``min(depth, 8)`` levels in
    which it holds most of its prefix (``≈ D·t + b + 2/ε₀``: each split removes ``t`` from it).
    Depth-free guarantee either way; a unit of ``k`` records by group privacy.
    """
    _check_pos("epsilon", epsilon)
    _check_pos("max_contributions", max_contributions, integer=True)
    if threshold is not None:
        _check_pos("threshold", threshold)
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration ({calibration!r}) must be one of {CALIBRATIONS}")
    k = max_contributions
    paper = "seed 003 §3, Figure 2, Theorem 3, Appendix A; group privacy over k records"
    if calibration == "theorem3":
        eps0 = epsilon / (2.0 * k)
        b = default_threshold(1.0 / eps0, fanout) if threshold is None else float(threshold)
        t = int(math.ceil(b + math.log(2.0) / eps0))
        return PrefixAccounting(
            method="improved", epsilon=2.0 * k * eps0, max_contributions=k, levels=0, scale=1.0 / eps0,
            threshold=b, discount=t, epsilon_level=eps0, paper=paper + " (2ε₀-DP)")
    per_record = epsilon / k
    levels = _TYPICAL_DEPTH if depth is None else max(1, min(int(depth), _TYPICAL_DEPTH))
    best: tuple[float, float, float, int] | None = None
    for step in range(50, 100):
        eps0 = per_record * step / 100.0
        b = float(spurious_threshold(1.0 / eps0, fanout)) if threshold is None else float(threshold)
        t = _smallest_discount(eps0, b, per_record)
        if t is None:
            continue
        cost = levels * t + b + 2.0 / eps0
        if best is None or cost < best[0]:
            best = (cost, eps0, b, t)
    if best is None:  # a very large threshold: fall back to the paper's split, which always fits
        return improved_accounting(epsilon=epsilon, max_contributions=k, fanout=fanout,
                                   threshold=threshold, calibration="theorem3")
    _cost, eps0, b, t = best
    loss = improved_privacy_loss(eps0, b, t)
    return PrefixAccounting(
        method="improved", epsilon=epsilon, max_contributions=k, levels=0, scale=1.0 / eps0,
        threshold=b, discount=t, epsilon_level=eps0, loss=k * loss,
        paper=paper + " (tight: ε₀ + Σ_j h(jt) per record, improved_privacy_loss)")


def direct_accounting(*, epsilon: float, max_depth: int, max_contributions: int = 1, fanout: int = 2,
                      prune: bool = True, terminal_budget: bool = True) -> PrefixAccounting:
    """Direct synthesis (Section 4): root + ``maxdepth`` levels at scale ``k(maxdepth+1)/ε``.

    ``prune`` (default): a child keeps a share of its parent's allocation only if its noisy count
    reaches ``threshold = spurious_threshold(scale, fanout)`` (public parameters only); without
    it every valid child takes part in ``Center`` (the paper's Figure 4).

    ``DPDirectPrefixSynthesis`` prunes text keys by default (``prune=None``), where an internal
    prefix is no key; spatial cells and hierarchy nodes are whole keys, and Center over every
    child keeps their mass where it was measured (EMD at ε = 1 on 200k points: 0.98× resampling
    unpruned vs 1.06× pruned).

    ``terminal_budget`` (default): a *terminal* cell (a text key's end-of-string child, or any
    cell at the key's full depth) holds only records whose path ends there, so it gets the
    budget their shorter path leaves unused: ``ε_T(d) = ε − d·ε_level`` at level ``d``
    (:func:`direct_scales`). Every record then spends ``ε_root + (d − 1)·ε_level + ε_T(d) = ε``
    if its key ends at level ``d`` and ``(maxdepth + 1)·ε_level = ε`` otherwise (adaptive
    sequential composition along the record's one path of cells; parallel within a level).
    """
    _check_pos("epsilon", epsilon)
    _check_pos("max_depth", max_depth, integer=True)
    _check_pos("max_contributions", max_contributions, integer=True)
    levels = max_depth + 1
    eps_level = epsilon / levels
    scale = max_contributions / eps_level
    return PrefixAccounting(
        method="direct", epsilon=levels * eps_level, max_contributions=max_contributions,
        levels=max_depth, scale=scale, epsilon_level=eps_level,
        threshold=float(spurious_threshold(scale, fanout)) if prune else None,
        terminal_budget=bool(terminal_budget),
        paper="seed 003 §4, Figures 3-4 (R = maxdepth/ε per level, plus the root count)"
              + ("; pruned Center (post-processing)" if prune else "")
              + ("; terminal cells: the path's unused budget" if terminal_budget else ""))


def direct_scales(acct: PrefixAccounting, depth: int, fanout: int) -> tuple[float, float, float | None, float | None]:
    """Noise scales and thresholds of level ``depth`` (1..maxdepth) of direct synthesis.

    ``(scale, terminal_scale, threshold, terminal_threshold)``: non-terminal cells use
    ``k/ε_level``; terminal cells ``k/ε_T(d)`` with ``ε_T(d) = ε − d·ε_level =
    (maxdepth + 1 − d)·ε_level`` when ``acct.terminal_budget``, else the same scale. Thresholds
    (pruned Center only) follow :func:`spurious_threshold` of each scale.
    """
    if not 1 <= depth <= acct.levels:
        raise ValueError(f"depth ({depth!r}) must be in [1, {acct.levels}]")
    eps_level = float(acct.epsilon_level or 0.0)
    share = (acct.levels + 1 - depth) if acct.terminal_budget else 1
    terminal_scale = acct.max_contributions / (share * eps_level)
    if acct.threshold is None:
        return acct.scale, terminal_scale, None, None
    return acct.scale, terminal_scale, acct.threshold, float(spurious_threshold(terminal_scale, fanout))
