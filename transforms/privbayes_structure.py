"""PrivBayes structure learning: InDif scores, candidate families and the greedy k-degree network.

* :func:`indif_score` — PrivSyn's InDif (Zhang et al. 2021 §4) of a 2-d count table: the L1
  distance, in counts, between the table and the product of its marginals; sensitivity ``≤ 4``
  per added or removed record (:data:`INDIF_SENSITIVITY`, proof in its docstring);
* :func:`candidate_families`, :func:`family_cells` — the ``(k+1)``-column subsets whose exact
  counts are taken, from the declared shape only (no family above :data:`MAX_FAMILY_CELLS`
  declared cells); :func:`marginalize` sums a table down to some of its columns;
* :func:`choose_structure` — greedy network construction (PrivBayes Alg. 4, DataSynthesizer
  GreedyBayes): each attribute joins with the parent set picked by permute-and-flip on
  ``indif(X, Π) − cells(X ∪ Π)·b``; :func:`family_specs` — the tables a structure releases.

Shapes: exact counts ``dict[tuple[int, ...], np.ndarray]`` keyed by sorted column tuples (the
output of ``CountCandidates``) → ``[(column, parents), ...]`` in sampling order. Beam-free.

Privacy (add/remove one privacy unit of at most ``m`` records): the root is drawn uniformly (no
data); each of the ``d − 1`` steps is ``ε_step``-DP (permute-and-flip, McKenna & Sheldon 2020,
an ε-DP drop-in for the exponential mechanism; sensitivity ``4m``; the penalty ``cells·b`` is
data-independent), so the structure is ``(d − 1)·ε_step``-DP by sequential composition (the
candidates of a step depend only on earlier outputs). Only the chosen structure leaves these
functions; they run inside the measurement step (:mod:`~beamsynth.transforms.privbayes_measure`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from beamsynth.transforms.noise import RandomSource, permute_and_flip

__all__ = [
    "INDIF_SENSITIVITY",
    "MAX_FAMILY_CELLS",
    "candidate_families",
    "family_cells",
    "choose_structure",
    "indif_score",
    "family_specs",
    "marginalize",
]

INDIF_SENSITIVITY = 4.0  # per record, add/remove neighbours (see indif_score)
MAX_FAMILY_CELLS = 2_000_000  # a larger (X, Π) table is never a candidate (declared cells)


# -- scores --------------------------------------------------------------------------------------
def indif_score(joint: np.ndarray) -> float:
    """InDif of a 2-d count table ``joint[x, π]``: ``Σ |n(x,π) − n(x)·n(π)/n|`` (0 if n = 0).

    Sensitivity under adding or removing one record is at most 4 (:data:`INDIF_SENSITIVITY`).
    Proof (add a record at cell (a, b); removal is the same pair read backwards): write
    ``e(x,π) = n(x)n(π)/n``. By the triangle inequality the score moves by at most
    ``Σ|Δn(x,π)| + Σ|Δe(x,π)| = 1 + Σ|Δe|``. Cells with ``x≠a, π≠b`` have ``Δe ≤ 0`` and
    ``Σ|Δe| = Σ n(x)n(π)/(n(n+1)) ≤ n²/(n(n+1)) < 1`` over them; every other cell has
    ``Δe ≥ 0``; and ``ΣΔe = Δn = 1`` over all cells, so the positive part sums to less than 2.
    Hence ``Σ|Δe| < 3`` and the score moves by less than 4. (From n = 0 the score goes from 0 to
    0.) With ``m`` records per privacy unit the bound is ``4m`` (m single-record steps).
    """
    t = np.asarray(joint, dtype=np.float64)
    if t.ndim != 2:
        raise ValueError(f"joint must be a 2-d table, got shape {t.shape}")
    n = t.sum()
    if n <= 0:
        return 0.0
    expected = np.outer(t.sum(axis=1), t.sum(axis=0)) / n
    return float(np.abs(t - expected).sum())


def marginalize(table: np.ndarray, table_cols: Sequence[int], keep: Sequence[int]) -> np.ndarray:
    """Sum a table over ``table_cols`` down to the columns ``keep`` (in ``keep`` order)."""
    table_cols = list(table_cols)
    axes = [table_cols.index(c) for c in keep]
    drop = tuple(i for i in range(len(table_cols)) if i not in axes)
    out = table.sum(axis=drop) if drop else table
    remaining = [i for i in range(len(table_cols)) if i in axes]
    order = [remaining.index(a) for a in axes]
    return np.transpose(out, order) if order != list(range(len(order))) else out


def candidate_families(n_columns: int, degree: int, *, shape: Sequence[int] | None = None,
                       max_family_cells: int | None = None,
                       target: int | None = None) -> list[tuple[int, ...]]:
    """The column subsets whose exact counts cover every candidate family.

    Without ``shape``: all ``(degree+1)``-column subsets (all columns if there are fewer). With
    ``shape`` and ``max_family_cells`` (both declared, so the list is data-independent): the
    ``(degree+1)``-subsets of at most ``max_family_cells`` cells, then, size by size down to
    single columns, every smaller subset within the limit that no listed subset contains. A
    family larger than the limit is never a candidate (:func:`choose_structure`), so one
    huge-domain column (a declared integer range of 10^6 values) does not force ``degree`` down
    for every other column.
    """
    if target is not None and degree >= 1 and n_columns > 2:
        return _target_families(n_columns, degree, shape, max_family_cells, target)
    size = min(degree + 1, n_columns)
    if shape is None or max_family_cells is None:
        return list(itertools.combinations(range(n_columns), size))
    shape = [int(c) for c in shape]
    if len(shape) != n_columns:
        raise ValueError(f"shape has {len(shape)} columns, n_columns is {n_columns}")
    out: list[tuple[int, ...]] = []
    for s in range(size, 0, -1):
        for f in itertools.combinations(range(n_columns), s):
            if math.prod(shape[c] for c in f) > max_family_cells:
                continue
            if s < size and any(set(f) <= set(g) for g in out):
                continue
            out.append(f)
    return out


def _target_families(n_columns: int, degree: int, shape: Sequence[int] | None,
                     max_family_cells: int | None, target: int) -> list[tuple[int, ...]]:
    """:func:`candidate_families` with a declared target ``T`` (H58): the ``(degree+2)``-subsets
    holding ``T`` (each column ``X`` with ``T`` and up to ``degree`` other parents, within the
    cell limit), then the label-free list for ``degree`` less the subsets already covered (the
    refinement's pairs, and the families of a column whose ``X × T`` table is over the limit).
    Declared shape and target only: data-independent."""
    size = min(degree + 2, n_columns)
    others = [c for c in range(n_columns) if c != target]

    def fits(f: tuple[int, ...]) -> bool:
        return shape is None or max_family_cells is None or family_cells(shape, f) <= max_family_cells

    out: list[tuple[int, ...]] = []
    for s in range(size, 1, -1):  # with T: the largest subsets within the limit first
        for rest in itertools.combinations(others, s - 1):
            f = tuple(sorted((target, *rest)))
            if fits(f) and not any(set(f) <= set(g) for g in out):
                out.append(f)
    plain = candidate_families(n_columns, degree, shape=shape, max_family_cells=max_family_cells)
    return out + [f for f in plain if not any(set(f) <= set(g) for g in out)]


def family_cells(shape: Sequence[int], cols: Sequence[int]) -> int:
    """Declared cells of the table over ``cols``."""
    return math.prod(int(shape[c]) for c in cols)


def _family_table(tables: dict[tuple[int, ...], np.ndarray], cols: tuple[int, ...]) -> np.ndarray:
    key = tuple(sorted(cols))
    if key in tables:
        return marginalize(tables[key], key, cols)
    for fam, t in tables.items():
        if set(key) <= set(fam):
            return marginalize(t, fam, cols)
    raise KeyError(f"no counted family covers columns {cols}")


def choose_structure(
    tables: dict[tuple[int, ...], np.ndarray],
    shape: Sequence[int],
    *,
    degree: int,
    epsilon: float,
    sensitivity: float,
    noise_scale: float,
    rs: RandomSource,
    root: int | None = None,
    exact_degree: bool = False,
    max_family_cells: int | None = None,
    target: int | None = None,
    target_required: bool = False,
    one_way_penalty: float = 0.0,
) -> list[tuple[int, tuple[int, ...]]]:
    """Greedy private network construction (PrivBayes Alg. 4, DataSynthesizer GreedyBayes).

    ``tables`` maps sorted column tuples to exact counts covering every candidate family. Root:
    ``root`` if given (chosen from declared facts only), else uniform over the columns (no data
    used). Step ``i`` (``d−1`` steps): candidates are ``(X, Π)`` with ``X`` not yet placed and
    ``Π`` any subset of the placed columns with ``|Π| ≤ degree`` (the penalty decides how many
    parents pay off), or with ``exact_degree`` only subsets of size exactly
    ``min(degree, placed)`` (PrivBayes Alg. 4's k-subsets); one is chosen by
    **permute-and-flip** (:func:`~beamsynth.transforms.noise.permute_and_flip`, McKenna &
    Sheldon 2020: ε-DP like the exponential mechanism, never a worse expected score) with
    ``epsilon`` (already the per-step budget) and ``sensitivity`` on
    ``indif(X, Π) − cells(X ∪ Π)·noise_scale``. Each step is ``epsilon``-DP (add/remove), the
    whole ``(d−1)·epsilon``-DP. Measured at ε = 1 (Beam-free harness, ``docs/privbayes.md``),
    TVD2/TVD3: Adult (16 seeds) exponential mechanism 0.0451/0.0894, permute-and-flip
    0.0444/0.0889, with exact k-subsets 0.0435/0.0869; ACS national2019 (6 seeds) 0.0663/0.1277,
    0.0653/0.1264, 0.0727/0.1377 — hence the adaptive default. Families of more than
    ``max_family_cells`` declared cells are not candidates; with ``exact_degree``, when no parent
    set of the exact size fits for some ``X``, its largest size that does fit is used.
    Returns ``[(column, parents), ...]`` in sampling order.

    ``target`` (a declared column, H58): the network is rooted at it, and each later column ``X``
    may take it as a parent **beside** up to ``degree`` parents chosen as above among the other
    placed columns: the candidates are ``Π`` and ``{T} ∪ Π`` (the latter only while ``X × T``
    fits ``max_family_cells``), scored alike (InDif − cells·b, so the target's cells pay their
    noise); with ``target_required`` only ``{T} ∪ Π`` (tree-augmented naive Bayes at
    ``degree`` 1: PrivBayes §4's k-degree network with ``T`` a fixed parent). The candidates of a
    step are a function of declared facts and earlier outputs only and the score and its
    sensitivity are unchanged, so privacy is as above. ``tables`` must then hold the families
    with ``T`` (:func:`candidate_families` with ``target``).
    """
    d = len(shape)
    # every candidate's score is fixed by the data: compute each once (cached sub-tables)
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def sub(cols: tuple[int, ...]) -> np.ndarray:
        key = tuple(sorted(cols))
        if key not in cache:
            cache[key] = _family_table(tables, key)
        return marginalize(cache[key], key, cols)

    scored: dict[tuple[int, tuple[int, ...]], float] = {}
    if target is not None:
        root = target
    if root is None:
        root = rs.child("root").randbelow(d)
    placed = [root]
    order: list[tuple[int, tuple[int, ...]]] = [(root, ())]
    for step in range(1, d):
        cands: list[tuple[int, tuple[int, ...]]] = []
        scores: list[float] = []
        for x in range(d):
            if x in placed:
                continue
            fixed = () if target is None or (max_family_cells is not None and family_cells(
                shape, (x, target)) > max_family_cells) else (target,)
            pool = sorted(c for c in placed if c not in fixed)
            top = min(degree, len(pool))
            for size in range(top, -1, -1):
                fits = [tuple(sorted((*fixed, *ps))) for ps in itertools.combinations(pool, size)]
                if fixed and not target_required:  # the target optional: also without it
                    fits += list(itertools.combinations(pool, size))
                fits = [ps for ps in fits if max_family_cells is None or not ps
                        or family_cells(shape, (x, *ps)) <= max_family_cells]
                for parents in fits:
                    key = (x, parents)
                    if key not in scored:
                        cells = family_cells(shape, (x, *parents))
                        gain = indif_score(sub((x, *parents)).reshape(shape[x], -1)) if parents else 0.0
                        scored[key] = gain - cells * noise_scale
                        if one_way_penalty and parents:  # X's margin noisier than its own table's
                            scored[key] -= one_way_penalty * (
                                one_way_noise(shape, x, parents, noise_scale)
                                - one_way_noise(shape, x, (), noise_scale))
                    cands.append(key)
                    scores.append(scored[key])
                if exact_degree and fits:
                    break
        pick = permute_and_flip(rs.child("step", step), np.asarray(scores),
                                epsilon=epsilon, sensitivity=sensitivity)
        order.append(cands[pick])
        placed.append(cands[pick][0])
    return order


def one_way_noise(shape: Sequence[int], x: int, parents: Sequence[int], noise_scale: float) -> float:
    """The family's expected 1-way cost, ``c_X·√c_Π·b``: about the expected L1 noise of ``X``'s
    margin summed from an ``X × Π`` table with noise of scale ``b`` per cell (the sum of ``c_Π``
    cells has standard deviation ``√(2c_Π)·b``; ``c_Π = 1`` without parents). Declared sizes and
    a public scale only (H69)."""
    return float(shape[x]) * math.sqrt(family_cells(shape, parents) if parents else 1) * noise_scale


def family_specs(structure: Sequence[tuple[int, tuple[int, ...]]]) -> list[tuple[int, ...]]:
    """Tables to release for a structure: ``(X, *Π)`` per attribute with parents, plus 1-way
    tables for parentless attributes that appear in no other family."""
    fams = [(x, *ps) for x, ps in structure if ps]
    covered = {c for f in fams for c in f}
    singles = [(x,) for x, ps in structure if not ps and x not in covered]
    return singles + fams
