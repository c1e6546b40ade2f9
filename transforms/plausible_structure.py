"""Plausible deniability (seed 001), the model's structure: entropy sensitivity, noisy entropies, CFS.

Beam-free arithmetic of Section 3.3 (structure learning on the split ``D_T``), used by
:class:`~beamsynth.transforms.plausible_learn.DPPlausibleBayesNet`:

* :func:`entropy_sum`, :func:`entropy_sum_sensitivity`, :func:`clamped_entropy_sum_sensitivity`
  (Section 3.3.1 and Appendix B, converted to add/remove neighbours); the paper's replace-one
  Lemma 1 (:func:`entropy_sensitivity_replace_one`) and its add/remove counterpart
  (:func:`entropy_sensitivity_add_remove`) are kept for comparison only;
* :func:`noisy_entropies` (the only data access), :func:`symmetrical_uncertainty`,
  :func:`cfs_structure` (greedy acyclic CFS), :func:`topological_order`, :func:`learn_structure`
  and :func:`structure_specs` (the marginals it reads).

Shapes: ``tables`` are exact count arrays of ``D_T``, the ``m`` single tables then the
``m(m-1)/2`` pair tables in ``itertools.combinations`` order (:func:`structure_specs`); the result
is a :class:`PlausibleStructure` (``parents[i]`` column positions, a topological ``order``).

Privacy (add/remove one record; with ``max_contributions = c`` the caller divides ε by ``c``):
:func:`learn_structure` is ε-DP by basic sequential composition: ``ε·count_fraction`` on ``|D_T|``
(discrete Laplace, sensitivity 1) and the rest split equally over the ``Q = m + m(m-1)/2`` values
``f = n·H``, each with Laplace noise of scale ``Δf·Q/ε_f``, ``Δf = entropy_sum_sensitivity(N)`` for
the declared bound ``N = max_records`` (never the private ``n``). The noisy scores stay internal;
symmetrical uncertainty and CFS are post-processing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from beamsynth.transforms.noise import RandomSource, discrete_laplace, laplace_internal

__all__ = [
    "PlausibleStructure",
    "cfs_structure",
    "clamped_entropy_sum_sensitivity",
    "entropy_sensitivity_add_remove",
    "entropy_sensitivity_replace_one",
    "entropy_sum",
    "entropy_sum_sensitivity",
    "learn_structure",
    "structure_specs",
    "noisy_entropies",
    "symmetrical_uncertainty",
    "topological_order",
]

_LOG2E = 1.0 / math.log(2.0)


# =============================================================================================
# Entropy sensitivity (Section 3.3.1, Appendix B), converted to add/remove neighbours
# =============================================================================================
def entropy_sum(counts: np.ndarray) -> float:
    """``n·H`` in bits of a histogram: ``n·log2 n - Σ c·log2 c`` (0 for an empty histogram)."""
    c = np.asarray(counts, dtype=np.float64).ravel()
    c = c[c > 0]
    n = c.sum()
    if n <= 0:
        return 0.0
    return float(n * math.log2(n) - np.sum(c * np.log2(c)))


def entropy_sum_sensitivity(max_records: int) -> float:
    """Add/remove sensitivity of ``n·H`` (bits) over datasets of at most ``max_records`` records.

    Adding one record to cell ``c`` of a histogram of ``N`` records changes ``f = N·H`` by
    ``g(N) - g(c)`` with ``g(x) = (x+1)·log2(x+1) - x·log2 x``, increasing, ``g(0) = 0``; so the change
    lies in ``[0, g(N)]`` and the maximum, reached by adding a record to an empty cell, is
    ``g(n-1) = log2 n + (n-1)·log2(n/(n-1)) < log2 n + log2 e`` for the larger dataset of ``n``
    records. Checked exactly by brute force over all histograms in ``tests/unit/test_plausible.py``.
    We noise ``f`` (not ``H``) so the scale does not depend on the private ``n``; ``H`` is then
    ``f̃ / ñ`` with a separately noised count (post-processing).
    """
    n = int(max_records)
    if n < 1:
        raise ValueError(f"max_records ({max_records!r}) must be an int >= 1")
    if n == 1:
        return 0.0
    return math.log2(n) + (n - 1) * math.log2(n / (n - 1))


def clamped_entropy_sum_sensitivity(max_records: int, n: int) -> float:
    """Add/remove change of ``F = min(|D|, N)·H(D)`` (bits) between datasets of ``n`` and ``n + 1``
    records (``n ≥ N``, ``N = max_records``): ``F' - F = N·(Δf - H)/(n+1)`` with ``Δf ∈ [0,
    entropy_sum_sensitivity(n+1)]`` and ``H ∈ [0, log2 n]``. :func:`learn_structure` relies on
    this never exceeding ``entropy_sum_sensitivity(N)`` (checked in ``tests/unit``)."""
    big, n = int(max_records), int(n)
    if big < 2 or n < big:
        raise ValueError(f"need max_records ({max_records!r}) >= 2 and n ({n!r}) >= max_records")
    return big * max(entropy_sum_sensitivity(n + 1), math.log2(n)) / (n + 1)


def entropy_sensitivity_add_remove(n: int) -> float:
    """Bound on ``|H(D) - H(D')|`` (bits) for add/remove neighbours, the larger of size ``n >= 2``.

    ``H' - H = (Δf - H)/n`` with ``Δf ∈ [0, log2 n + log2 e]`` and ``H ∈ [0, log2(n-1)]`` give
    ``ΔH ≤ (log2 n + 1/ln 2)/n``. Stated for comparison with the paper's replace-one Lemma 1; the
    mechanism uses :func:`entropy_sum_sensitivity` (no dependence on the private ``n``).
    """
    if n < 2:
        raise ValueError(f"n ({n!r}) must be >= 2")
    return (math.log2(n) + _LOG2E) / n


def entropy_sensitivity_replace_one(n: int) -> float:
    """The paper's Lemma 1 (replace-one, ``n`` fixed): ``(1/n)·(2 + 1/ln 2 + 2·log2 n)``."""
    if n < 1:
        raise ValueError(f"n ({n!r}) must be >= 1")
    return (2.0 + _LOG2E + 2.0 * math.log2(n)) / n


def noisy_entropies(
    tables: Sequence[np.ndarray],
    n_records: int,
    *,
    shape: Sequence[int],
    epsilon: float,
    max_records: int,
    rs: RandomSource,
    count_fraction: float = 0.1,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Noisy single entropies ``H̃(X_i)`` and pairwise ``H̃(X_i, X_j)`` (bits) from exact tables.

    ``tables`` are the ``m`` single then ``m(m-1)/2`` pair tables (``itertools.combinations``
    order) of ``D_T``. Privacy (add/remove one record, ``ε``-DP by sequential composition):
    ``ε·count_fraction`` on ``|D_T|`` (discrete Laplace, sensitivity 1), the rest split equally
    over the ``f = n·H`` values, each with Laplace noise of scale ``Δf·Q/ε_f`` where
    ``Δf = entropy_sum_sensitivity(max_records)`` and ``Q`` the number of tables. The noisy scores
    are internal (only the chosen structure is released), hence continuous Laplace.
    Returns ``(H1[m], H2[m, m] (diagonal = H1), noisy count)``; values clipped to
    ``[0, log2(cells)]``.
    """
    m = len(shape)
    q = m + m * (m - 1) // 2
    if len(tables) != q:
        raise ValueError(f"need {q} tables (singles then pairs) for {m} columns, got {len(tables)}")
    eps_count = epsilon * count_fraction
    eps_each = (epsilon - eps_count) / q
    n_noisy = int(n_records) + int(discrete_laplace(rs.child("count"), 1.0 / eps_count, 1)[0])
    n_eff = max(n_noisy, 1)
    sens = max(entropy_sum_sensitivity(max_records), 1e-12)
    f = np.array([entropy_sum(t) for t in tables], dtype=np.float64)
    f = f + laplace_internal(rs.child("entropies"), sens / eps_each, q)
    h = f / n_eff
    cells = [shape[i] for i in range(m)] + [shape[i] * shape[j] for i, j in itertools.combinations(range(m), 2)]
    h = np.clip(h, 0.0, np.log2(np.maximum(np.asarray(cells, dtype=np.float64), 1.0)))
    h1 = h[:m]
    h2 = np.diag(h1).astype(np.float64)
    for idx, (i, j) in enumerate(itertools.combinations(range(m), 2)):
        h2[i, j] = h2[j, i] = h[m + idx]
    return h1, h2, n_noisy


def symmetrical_uncertainty(h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
    """``corr(X,Y) = 2 - 2·H(X,Y)/(H(X)+H(Y))`` clipped to [0, 1] (Section 3.3), as an m×m matrix."""
    h1 = np.asarray(h1, dtype=np.float64)
    denom = h1[:, None] + h1[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = np.where(denom > 0, 2.0 - 2.0 * np.asarray(h2) / denom, 0.0)
    corr = np.clip(corr, 0.0, 1.0)
    np.fill_diagonal(corr, 1.0)
    return corr


# =============================================================================================
# Structure: greedy acyclic CFS (Section 3.3)
# =============================================================================================
@dataclass(frozen=True)
class PlausibleStructure:
    """A DAG over the columns: ``parents[i]`` (column positions) and a topological ``order``."""

    parents: tuple[tuple[int, ...], ...]
    order: tuple[int, ...]

    def to_dict(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        """JSON form (column names when given)."""
        nm = (lambda i: names[i]) if names is not None else (lambda i: i)
        return {"order": [nm(i) for i in self.order],
                "parents": {str(nm(i)): [nm(j) for j in ps] for i, ps in enumerate(self.parents)}}


def _merit(corr: np.ndarray, i: int, subset: Sequence[int]) -> float:
    if not subset:
        return 0.0
    s = list(subset)
    num = float(corr[i, s].sum())
    inter = float(corr[np.ix_(s, s)].sum() - len(s))  # Σ_{j≠l}
    return num / math.sqrt(len(s) + inter)


def _reaches(parents: list[list[int]], start: int, target: int) -> bool:
    """Whether ``target`` is an ancestor-or-self of ``start`` following parent links."""
    stack, seen = [start], set()
    while stack:
        v = stack.pop()
        if v == target:
            return True
        if v in seen:
            continue
        seen.add(v)
        stack.extend(parents[v])
    return False


def topological_order(parents: Sequence[Sequence[int]], shape: Sequence[int] | None = None) -> tuple[int, ...]:
    """Kahn's algorithm; among ready columns the one with fewest cells first, then lowest index.

    Columns early in the order are the ones copied from a seed; preferring small (public) domains
    there keeps more seeds plausible for the same ω. Deterministic, uses no data.
    """
    m = len(parents)
    size = [1] * m if shape is None else [int(s) for s in shape]
    remaining = {i: set(ps) for i, ps in enumerate(parents)}
    order: list[int] = []
    while remaining:
        ready = sorted((i for i, ps in remaining.items() if not ps), key=lambda v: (size[v], v))
        if not ready:
            raise ValueError(f"parents {parents!r} contain a cycle")
        v = ready[0]
        order.append(v)
        del remaining[v]
        for ps in remaining.values():
            ps.discard(v)
    if len(order) != m:
        raise ValueError("topological sort failed")
    return tuple(order)


def cfs_structure(corr: np.ndarray, shape: Sequence[int], *, max_parents: int, max_cost: int,
                  max_cells: float | None = None) -> PlausibleStructure:
    """Greedy acyclic correlation-based feature selection (post-processing of noisy entropies).

    Attributes are visited by decreasing total correlation; for each, parents are added greedily
    while the CFS merit ``Σ_j corr(i,j) / sqrt(|S| + Σ_{j≠l} corr(j,l))`` improves, the edge keeps
    the graph acyclic, ``|S| ≤ max_parents``, the configuration count ``Π |X_j| ≤ max_cost`` and,
    when given, the conditional table size ``|X_i|·Π |X_j| ≤ max_cells``.
    """
    corr = np.asarray(corr, dtype=np.float64)
    m = len(shape)
    parents: list[list[int]] = [[] for _ in range(m)]
    total = corr.sum(axis=1) - 1.0
    for i in sorted(range(m), key=lambda v: (-total[v], v)):
        chosen: list[int] = []
        best = 0.0
        while len(chosen) < max_parents:
            cand_best, cand_j = best, -1
            cost = math.prod(shape[j] for j in chosen)
            for j in range(m):
                if j == i or j in chosen or cost * shape[j] > max_cost:
                    continue
                if max_cells is not None and cost * shape[j] * shape[i] > max_cells:
                    continue
                if _reaches(parents, j, i):  # i is an ancestor of j: edge j -> i makes a cycle
                    continue
                mval = _merit(corr, i, chosen + [j])
                if mval > cand_best + 1e-12:
                    cand_best, cand_j = mval, j
            if cand_j < 0:
                break
            chosen.append(cand_j)
            parents[i] = sorted(chosen)
            best = cand_best
    ps = tuple(tuple(sorted(p)) for p in parents)
    return PlausibleStructure(parents=ps, order=topological_order(ps, shape))


# =============================================================================================
# Structure learning on D_T (ε-DP, Sections 3.3.1, 3.5)
# =============================================================================================
def structure_specs(m: int) -> list[tuple[int, ...]]:
    """Marginals measured for the structure: every single column, then every pair."""
    return [(i,) for i in range(m)] + list(itertools.combinations(range(m), 2))


def learn_structure(tables: Sequence[np.ndarray], n_records: int, *, shape: Sequence[int], epsilon: float,
                    max_records: int, max_parents: int, max_cost: int, rs: RandomSource,
                    cells_per_record: float | None = None) -> PlausibleStructure:
    """ε-DP structure from exact single/pair tables of ``D_T`` (:func:`structure_specs` order).

    Noisy entropies (:func:`noisy_entropies`, the only data access) → symmetrical uncertainty →
    greedy CFS (post-processing). With ``cells_per_record`` the conditional tables are limited to
    ``ñ_T · cells_per_record`` cells, ``ñ_T`` the **noisy** count of ``D_T`` (θ-usefulness of
    PrivBayes, Zhang et al. 2014: a table must hold enough records per cell to outweigh its noise;
    post-processing).

    More records than the declared ``max_records = N`` never fail the run (rule 7: the data's size
    must not decide whether a release happens): the measured values are then
    ``min(n, N)·H`` (every table scaled by ``N/n``, ``n·H`` being homogeneous of degree 1) and the
    count ``min(n, N)``, whose add/remove sensitivities stay ``entropy_sum_sensitivity(N)`` and 1
    (:func:`clamped_entropy_sum_sensitivity`, checked by brute force in ``tests/unit``). ``H̃`` is
    still ``f̃/ñ``, an estimate of the entropy of all of ``D_T``. Until the ninth session this
    raised, so the run crashed exactly when ``|D_T| > N``.
    """
    n_records = int(n_records)
    if n_records > max_records:
        tables = [np.asarray(t, dtype=np.float64) * (max_records / n_records) for t in tables]
        n_records = int(max_records)
    h1, h2, n_noisy = noisy_entropies(list(tables), n_records, shape=shape, epsilon=epsilon,
                                      max_records=max_records, rs=rs)
    corr = symmetrical_uncertainty(h1, h2)
    max_cells = None if cells_per_record is None else max(1.0, n_noisy * cells_per_record)
    return cfs_structure(corr, shape, max_parents=min(max_parents, len(shape) - 1), max_cost=max_cost,
                         max_cells=max_cells)
