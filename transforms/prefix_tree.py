"""Prefix trees (seed 003), the tree arithmetic: frontier, sparse child counts, discounts, Center.

Beam-free apart from one CombineFn:

* :class:`LevelState` (the frontier at depth ``d``), :func:`root_state`, :class:`LevelRelease`
  (the nodes released at one level);
* :func:`child_cells` (one batch's sparse counts of the frontier's children),
  :class:`SparseCountsCombineFn` (merge = add per cell), :func:`dense_counts`, :func:`children_of`;
* :func:`allocate_discount` — the stable ``t``-discount rules of :data:`DISCOUNTS` (Section 3,
  Appendix A): ``skip``, ``proportional``, ``uniform`` (:func:`round_robin_remove`);
* :func:`center`, :func:`prune_and_center` — the paper's ``Center`` (Figures 4, 14).

Shapes: key codes are ``EncodedBatch.codes`` arrays ``(n, depth)`` of symbols (``0`` = no symbol
at that depth); a frontier holds sorted prefixes ``(F, d)`` and one carried int per node (owed
discount, allocated count or zero); sparse counts are ``(cells int64[], counts int64[])`` with
``cell = frontier_index·fanout + symbol - 1``; dense tables are ``(F, fanout)``.

Privacy: counting is exact, it is the measurement's input (the nodes of a level are disjoint:
sensitivity ``k`` per level); the level steps (:mod:`~beamsynth.transforms.prefix_levels`) add
the noise. Theorem 3 needs a *stable* discount (one record more or less changes the discounted
counts along one path only): ``skip`` is the paper's ``Skip`` exactly, ``proportional`` a mixture
of ``Skip`` over uniformly random record orders (multivariate hypergeometric draws from the secure
source, not privacy-critical), ``uniform`` is checked by property tests only
(``tests/unit/test_prefix.py``). :func:`center` and :func:`prune_and_center` read noisy counts
only (post-processing).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np

from beamsynth.schemas.keys import prefix_bytes
from beamsynth.transforms.noise import RandomSource, hypergeometric

__all__ = [
    "DISCOUNTS",
    "LevelRelease",
    "LevelState",
    "SparseCountsCombineFn",
    "allocate_discount",
    "center",
    "child_cells",
    "children_of",
    "dense_counts",
    "prune_and_center",
    "root_state",
    "round_robin_remove",
]

DISCOUNTS = ("proportional", "skip", "uniform")
_COMPACT_AT = 2_000_000  # sparse accumulator entries before compaction


# -- counting -----------------------------------------------------------------------------------------
@dataclass
class LevelState:
    """The frontier at ``depth``: sorted prefixes ``(F, depth)`` and one carried int per node.

    ``carry`` is the owed discount (improved), the allocated count (direct) or zeros (basic).
    """

    depth: int
    prefixes: np.ndarray
    carry: np.ndarray

    @property
    def keys(self) -> np.ndarray | None:
        """Sorted prefix bytes (None at the root)."""
        return None if self.depth == 0 else prefix_bytes(self.prefixes, self.depth)

    def __len__(self) -> int:
        return int(self.prefixes.shape[0])


def root_state(symbol_dtype: np.dtype, carry: int = 0) -> LevelState:
    """The frontier holding only the root."""
    return LevelState(0, np.zeros((1, 0), dtype=symbol_dtype), np.array([carry], dtype=np.int64))


@dataclass
class LevelRelease:
    """Nodes released at one level: prefixes ``(m, depth)``, counts (``-1`` = not released), leaf."""

    depth: int
    prefixes: np.ndarray
    counts: np.ndarray
    leaf: np.ndarray
    dropped: int = 0  # direct: allocation of parents whose children all fell below the threshold

    def __len__(self) -> int:
        return int(self.counts.size)


def child_cells(codes: np.ndarray, depth: int, keys: np.ndarray | None, fanout: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Sparse counts of ``frontier_index * fanout + (symbol - 1)`` over one batch of codes.

    A row counts when it has a symbol at ``depth`` and its prefix is in ``keys`` (sorted bytes of
    the frontier; ``None`` = the root).
    """
    if depth >= codes.shape[1] or codes.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    sym = codes[:, depth].astype(np.int64)
    live = sym > 0
    if keys is None:
        flat = sym[live] - 1
    else:
        if keys.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        pb = prefix_bytes(codes[live], depth)
        pos = np.minimum(np.searchsorted(keys, pb), keys.size - 1)
        hit = keys[pos] == pb
        flat = pos[hit].astype(np.int64) * fanout + sym[live][hit] - 1
    if flat.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    idx, cnt = np.unique(flat, return_counts=True)
    return idx.astype(np.int64), cnt.astype(np.int64)


def _compact(idx: np.ndarray, cnt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if idx.size == 0:
        return idx, cnt
    uniq, inv = np.unique(idx, return_inverse=True)
    return uniq, np.bincount(inv, weights=cnt, minlength=uniq.size).astype(np.int64)


class SparseCountsCombineFn(beam.CombineFn):
    """Adds sparse ``(cells, counts)`` arrays; merge = concatenate + sum per cell.

    Accumulator: ``[idx_parts, cnt_parts, size]``; output: compacted ``(idx, cnt)``, empty on no
    input (so an empty window still releases noise on every cell).
    """

    def create_accumulator(self) -> list[Any]:
        return [[], [], 0]

    def add_input(self, acc: list[Any], element: tuple[np.ndarray, np.ndarray]) -> list[Any]:
        idx, cnt = element
        acc[0].append(idx)
        acc[1].append(cnt)
        acc[2] += idx.size
        if acc[2] > _COMPACT_AT:
            i, c = _compact(np.concatenate(acc[0]), np.concatenate(acc[1]))
            acc[0], acc[1], acc[2] = [i], [c], i.size
        return acc

    def merge_accumulators(self, accumulators: Iterable[list[Any]]) -> list[Any]:
        out = self.create_accumulator()
        for acc in accumulators:
            out[0].extend(acc[0])
            out[1].extend(acc[1])
            out[2] += acc[2]
        if len(out[0]) > 1:
            i, c = _compact(np.concatenate(out[0]), np.concatenate(out[1]))
            out[0], out[1], out[2] = [i], [c], i.size
        return out

    def extract_output(self, acc: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        if not acc[0]:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return _compact(np.concatenate(acc[0]), np.concatenate(acc[1]))


def dense_counts(n_nodes: int, fanout: int, idx: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Sparse cell counts → dense ``(n_nodes, fanout)`` int64 table."""
    table = np.zeros(n_nodes * fanout, dtype=np.int64)
    if idx.size:
        table[idx] = cnt
    return table.reshape(n_nodes, fanout)


def children_of(prefixes: np.ndarray, fanout: int) -> np.ndarray:
    """All ``fanout`` children of each prefix, row-major: ``(F * fanout, d + 1)``."""
    f, d = prefixes.shape
    out = np.empty((f * fanout, d + 1), dtype=prefixes.dtype)
    out[:, :d] = np.repeat(prefixes, fanout, axis=0)
    out[:, d] = np.tile(np.arange(1, fanout + 1), f).astype(prefixes.dtype)
    return out


# -- allocation: discounts and Center ------------------------------------------------------------------
def _cyclic_first(elig: np.ndarray, k: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Mark the first ``k[r]`` eligible cells of row ``r``, cycling from column ``start[r]``."""
    f, a = elig.shape
    cols = (start[:, None] + np.arange(a)[None, :]) % a
    rolled = np.take_along_axis(elig, cols, axis=1)
    sel = rolled & (np.cumsum(rolled, axis=1) <= k[:, None])
    out = np.zeros_like(elig)
    np.put_along_axis(out, cols, sel, axis=1)
    return out


def round_robin_remove(s: np.ndarray, r: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """Units removed per cell when ``r[row]`` units are taken one at a time round robin.

    Each pass takes one unit from every cell still positive, in cyclic order from ``start``
    (column 0 if None). Equivalent closed form: ``min(s, m)`` plus one for the first remaining
    cells with ``s > m``, where ``m`` is the number of full passes. Requires ``0 ≤ r ≤ Σ s``.
    """
    s = np.asarray(s, dtype=np.int64)
    r = np.asarray(r, dtype=np.int64)
    f = s.shape[0]
    if start is None:
        start = np.zeros(f, dtype=np.int64)
    if f == 0:
        return np.zeros_like(s)
    if np.any(r < 0) or np.any(r > s.sum(axis=1)):
        raise ValueError("round_robin_remove needs 0 <= r <= row sums")
    lo = np.zeros(f, dtype=np.int64)  # sum(min(s, lo)) <= r always
    hi = s.max(axis=1) + 1  # sum(min(s, hi)) = row sum; search largest m with sum <= r
    while np.any(hi - lo > 1):
        mid = (lo + hi) // 2
        ok = np.minimum(s, mid[:, None]).sum(axis=1) <= r
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    base = np.minimum(s, lo[:, None])
    rest = r - base.sum(axis=1)
    extra = _cyclic_first(s > lo[:, None], rest, start)
    return base + extra


def _skip_remove(s: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Remove the first ``r`` units in child order (the paper's ``Skip`` over a fixed record order).

    Subtrees are contiguous in the lexicographic order of keys, so "the first records" of a node
    are always the first records of its first children: removal is determined by counts alone.
    """
    before = np.cumsum(s, axis=1) - s
    return np.clip(r[:, None] - before, 0, s)


def _proportional_remove(s: np.ndarray, r: np.ndarray, rs: RandomSource) -> np.ndarray:
    """Remove a uniformly random subset of ``r`` units (multivariate hypergeometric per row, from
    exact urn draws of the secure source: :func:`~beamsynth.transforms.noise.hypergeometric`)."""
    f, a = s.shape
    out = np.zeros_like(s)
    left = r.astype(np.int64).copy()
    total = s.sum(axis=1)
    for j in range(a):
        good = s[:, j]
        bad = total - good
        active = left > 0
        if np.any(active):
            out[active, j] = hypergeometric(rs, good[active], bad[active], left[active])
        left -= out[:, j]
        total = bad
    return out


def allocate_discount(counts: np.ndarray, owed: np.ndarray, discount: int, rule: str,
                      rs: RandomSource) -> np.ndarray:
    """Records removed per child: ``min(owed + t, Σ children)`` spread by a stable t-discount rule.

    ``owed`` is what ancestors already removed from each node's subtree (not yet located among
    its children); every child of a split node ends with at least ``t`` fewer records than its
    (discounted) parent (Appendix A).
    """
    r = np.minimum(owed + int(discount), counts.sum(axis=1))
    if rule == "uniform":
        return round_robin_remove(counts, r)
    if rule == "skip":
        return _skip_remove(counts, r)
    if rule == "proportional":
        return _proportional_remove(counts, r, rs)
    raise ValueError(f"discount rule ({rule!r}) must be one of {DISCOUNTS}")


def center(count: np.ndarray, sub: np.ndarray, valid: np.ndarray | None = None,
           start: np.ndarray | None = None) -> np.ndarray:
    """The paper's ``Center`` (Figure 4 / Figure 14), vectorized over rows.

    Clip each noisy subcount to ``[0, count]``, then move subcounts one unit at a time round robin
    (from ``start``) toward the target until each row sums to ``count``; decrements skip zeros.
    Result: non-negative, sums exactly to ``count``; invalid children stay 0.
    """
    count = np.asarray(count, dtype=np.int64)
    s = np.clip(np.asarray(sub, dtype=np.int64), 0, count[:, None])
    f, a = s.shape
    if valid is None:
        valid = np.ones_like(s, dtype=bool)
    if start is None:
        start = np.zeros(f, dtype=np.int64)
    s[~valid] = 0
    if np.any(count < 0) or np.any((count > 0) & ~valid.any(axis=1)):
        raise ValueError("center needs count >= 0 and a valid child wherever count > 0")
    diff = count - s.sum(axis=1)
    up = diff > 0
    if np.any(up):
        nv = valid[up].sum(axis=1)
        d = diff[up]
        s[up] += np.where(valid[up], (d // nv)[:, None], 0)
        s[up] += _cyclic_first(valid[up], d % nv, start[up]).astype(np.int64)
    down = diff < 0
    if np.any(down):
        s[down] -= round_robin_remove(s[down], -diff[down], start[down])
    return s


def prune_and_center(alloc: np.ndarray, noisy: np.ndarray, valid: np.ndarray, start: np.ndarray,
                     threshold: float | np.ndarray | None, whole: np.ndarray | None = None
                     ) -> tuple[np.ndarray, int]:
    """Allocate each row's count over its children (post-processing of noisy counts only).

    ``threshold=None``: the paper's :func:`center` over every valid child. Otherwise (a number,
    or one per cell) only children with ``noisy ≥ threshold`` take part (clipped, then moved one unit at a time round
    robin until they sum to the parent's allocation). A row where no child reaches it falls back
    to :func:`center` over every valid child when the row's node is itself a whole key
    (``whole``: spatial cells, hierarchy nodes, the root), else (a text prefix, which is no key)
    allocates nothing and its allocation is returned as dropped. A child without records
    reaches the threshold with probability ``P(Z ≥ threshold)`` only, so noise alone rarely
    gets mass.
    """
    if threshold is None:
        return center(alloc, noisy, valid, start), 0
    alloc = np.asarray(alloc, dtype=np.int64)
    keep = valid & (noisy >= threshold)
    alive = keep.any(axis=1)
    fallback = ~alive & (np.ones_like(alive) if whole is None else np.asarray(whole, bool))
    keep[fallback] = valid[fallback]
    used = alive | fallback
    sub = np.zeros_like(noisy, dtype=np.int64)
    if np.any(used):
        sub[used] = center(alloc[used], noisy[used], keep[used], start[used])
    return sub, int(alloc[~used].sum())
