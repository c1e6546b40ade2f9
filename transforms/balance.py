"""Pair-balanced selection of ``n`` rows from a weighted pool (post-processing only).

A model that is a weighted pool of records (:class:`~beamsynth.transforms.refine.RefinedModel`)
is turned into ``n`` synthetic rows by sampling. Independent sampling adds its own error on top
of the model's: each cell of a 2-way table of ``n`` rows drawn i.i.d. is off by about
``√(n·p)``. At Adult's size (32k rows) that sampling error is a quarter of the whole TVD2
between a refined ε = 1 model and the real test data. Systematic sampling over sorted rows
(:func:`~beamsynth.transforms.refine.systematic_resample`) removes it from the leading sort
columns only.

:func:`balance_pairs` starts from such a sample and improves it by local search:

- **Objective**: ``Σ_pairs ‖C_ab − T_ab‖₁``, where ``C_ab`` is the sample's count table of the
  column pair ``(a, b)`` and ``T_ab`` the pool's weighted table scaled to ``n`` rows (the model's
  expectation). All pairs are balanced at once; with more than ``max_pairs`` column pairs a
  random subset of ``max_pairs`` is used.
- **Moves**: swap a random sampled row out and a pool row drawn ∝ its weight in. Proposals come
  in batches; a swap is a candidate when it lowers the objective given the tables at the start
  of its batch. Candidates of one batch may push the same cell past zero together, so the batch
  is checked exactly and, while it would not lower the objective, cut to its better-ranked half:
  the objective never grows.
- **Effort**: ``proposals`` swaps per sampled row, linear in ``n``.

Only the pool and its weights are read: both are post-processing of released measurements, so
this step costs no privacy budget. Its randomness (which rows are proposed) is post-processing
randomness from the caller's :class:`~beamsynth.transforms.noise.RandomSource`.

Measured on Adult at ε = 1 (Beam-free harness, seeds 0–13, pool of 8n; ``docs/privbayes.md``):
mean per-pair TVD against the pool 0.0078 → 0.0032 (6 seeds); TVD2 / TVD3 against the real test split
0.0389 / 0.0776 → 0.0382 / 0.0768; about 0.5 s per 32k rows with the default effort.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from beamsynth.transforms.noise import RandomSource

__all__ = [
    "BALANCE_BATCH",
    "BALANCE_MAX_CELLS",
    "BALANCE_MAX_PAIR_CELLS",
    "BALANCE_MAX_PAIRS",
    "BALANCE_PROPOSALS",
    "balance_pairs",
    "pair_balance_error",
]

BALANCE_PROPOSALS = 5  # swap proposals per sampled row (Adult, 14 seeds: as good as 10)
BALANCE_BATCH = 100  # proposals evaluated together (a batch that overshoots is cut in half)
BALANCE_MAX_PAIRS = 200  # column pairs balanced at most (a random subset beyond this)
BALANCE_MAX_PAIR_CELLS = 1 << 18  # a pair with more (pool-present) cells is not balanced
BALANCE_MAX_CELLS = 1 << 22  # all balanced pairs' cells together (the dense error table)


def _compact(codes: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Every column's codes renumbered over the values present (smaller dense tables), in the
    narrowest of int16/int32 that holds them. ``codes`` is the model's pool (drawn from released
    tables: post-processing), never the private input, so its extremes may be read."""
    lows = codes.min(axis=0).astype(np.int64)
    highs = codes.max(axis=0).astype(np.int64)
    widest = int(min((highs - lows).max() + 1, codes.shape[0]))
    out = np.empty(codes.shape, dtype=np.int16 if widest < 2**15 else np.int32)
    sizes = []
    for j in range(codes.shape[1]):
        column = codes[:, j]
        low, high = int(lows[j]), int(highs[j])
        if high - low < 4 * column.size:  # small range: renumber by a presence table, O(rows)
            present = np.zeros(high - low + 1, dtype=bool)
            present[column - low] = True
            renumber = np.cumsum(present, dtype=np.int64) - 1
            out[:, j] = renumber[column - low]
            sizes.append(int(present.sum()))
        else:
            values, inverse = np.unique(column, return_inverse=True)
            out[:, j] = inverse.ravel()
            sizes.append(int(values.size))
    return out, sizes


def _pair_layout(sizes: Sequence[int], rs: RandomSource, max_pairs: int, max_pair_cells: int,
                 max_cells: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Columns, strides and offsets of the balanced pairs in one flat table."""
    d = len(sizes)
    pairs = [(a, b) for a in range(d) for b in range(a + 1, d)
             if sizes[a] * sizes[b] <= max_pair_cells]
    if len(pairs) > max_pairs:
        keep = np.sort(rs.child("pairs").numpy_generator().permutation(len(pairs))[:max_pairs])
        pairs = [pairs[i] for i in keep]
    chosen, offsets, total = [], [], 0
    for a, b in pairs:
        cells = sizes[a] * sizes[b]
        if total + cells > max_cells:
            continue
        chosen.append((a, b))
        offsets.append(total)
        total += cells
    cols = np.array(chosen, dtype=np.int64).reshape(-1, 2)
    strides = np.array([sizes[b] for _, b in chosen], dtype=np.int64)
    return cols, strides, np.array(offsets, dtype=np.int64), total


def _keys(compact: np.ndarray, rows: np.ndarray, cols: np.ndarray, strides: np.ndarray,
          offsets: np.ndarray) -> np.ndarray:
    """Flat cell of every balanced pair for ``rows``: shape ``[pairs, len(rows)]``."""
    x = compact[rows].astype(np.int64)
    return offsets[:, None] + x[:, cols[:, 0]].T * strides[:, None] + x[:, cols[:, 1]].T


def pair_balance_error(codes: np.ndarray, weights: np.ndarray, picked: np.ndarray) -> float:
    """Mean over all column pairs of the TVD between the rows ``codes[picked]`` and the weighted
    ``codes`` (a diagnostic of :func:`balance_pairs`; 0 for a single column)."""
    codes = np.asarray(codes)
    compact, sizes = _compact(codes)
    w = np.asarray(weights, dtype=np.float64)
    d = codes.shape[1]
    errs = []
    for a in range(d):
        for b in range(a + 1, d):
            key = compact[:, a].astype(np.int64) * sizes[b] + compact[:, b]
            cells = sizes[a] * sizes[b]
            target = np.bincount(key, weights=w, minlength=cells)
            got = np.bincount(key[picked], minlength=cells)
            errs.append(0.5 * np.abs(got / max(got.sum(), 1) - target / target.sum()).sum())
    return float(np.mean(errs)) if errs else 0.0


def balance_pairs(codes: np.ndarray, weights: np.ndarray, picked: np.ndarray, rs: RandomSource, *,
                  proposals: float = BALANCE_PROPOSALS, batch: int = BALANCE_BATCH,
                  max_pairs: int = BALANCE_MAX_PAIRS, max_pair_cells: int = BALANCE_MAX_PAIR_CELLS,
                  max_cells: int = BALANCE_MAX_CELLS) -> np.ndarray:
    """Improve the sample ``picked`` (indices into the pool ``codes``) so that its 2-way tables
    come closer to the pool's ``weights``-weighted ones (module docstring; post-processing).

    Returns new indices, as many as ``picked``; ``picked`` is not modified. The sum over the
    balanced pairs of ``‖C − T‖₁`` never grows.
    """
    codes = np.asarray(codes)
    w = np.asarray(weights, dtype=np.float64)
    sample = np.array(picked, dtype=np.int64, copy=True)
    if codes.ndim != 2 or w.shape != (codes.shape[0],):
        raise ValueError(f"codes ({codes.shape}) must be rows × columns with one weight per row "
                         f"(weights {w.shape})")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch ({batch!r}) must be an int >= 1")
    if not proposals >= 0:
        raise ValueError(f"proposals ({proposals!r}) must be >= 0")
    n, pool = sample.size, codes.shape[0]
    if n < 2 or codes.shape[1] < 2 or proposals == 0 or not np.isfinite(w.sum()) or w.sum() <= 0:
        return sample
    compact, sizes = _compact(codes)
    cols, strides, offsets, cells = _pair_layout(sizes, rs, max_pairs, max_pair_cells, max_cells)
    if cols.shape[0] == 0:
        return sample
    expected = w * (n / w.sum())
    # error table D = C − T over all balanced pairs' cells, laid end to end
    error = np.zeros(cells)
    chunk = max(1, 1_000_000 // cols.shape[0])  # pool rows per pass: ~16 MB of keys and weights
    for start in range(0, pool, chunk):
        rows = np.arange(start, min(pool, start + chunk))
        keys = _keys(compact, rows, cols, strides, offsets)
        error -= np.bincount(keys.ravel(), weights=np.broadcast_to(expected[rows], keys.shape).ravel(),
                             minlength=cells)
    error += np.bincount(_keys(compact, sample, cols, strides, offsets).ravel(), minlength=cells)
    cdf = np.cumsum(expected)
    cdf /= cdf[-1]
    rng = rs.child("swaps").numpy_generator()
    size = min(batch, n)
    for _ in range(math.ceil(proposals * n / size)):
        slots = rng.choice(n, size, replace=False)
        incoming = np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), pool - 1)
        out_keys = _keys(compact, sample[slots], cols, strides, offsets)  # [pairs, size]
        in_keys = _keys(compact, incoming, cols, strides, offsets)
        e_out, e_in = error[out_keys], error[in_keys]
        change = (np.abs(e_out - 1) - np.abs(e_out)) + (np.abs(e_in + 1) - np.abs(e_in))
        gain = np.where(out_keys == in_keys, 0.0, change).sum(axis=0)
        keep = np.flatnonzero(gain < 0)
        # swaps kept together may push one cell past zero: keep the better-ranked half until the
        # batch as a whole lowers the objective (so it never grows)
        keep = keep[np.argsort(gain[keep], kind="stable")]
        while keep.size:
            cell, where = np.unique(np.concatenate([out_keys[:, keep].ravel(), in_keys[:, keep].ravel()]),
                                    return_inverse=True)
            step = np.repeat([-1.0, 1.0], out_keys.shape[0] * keep.size)
            delta = np.bincount(where.ravel(), weights=step, minlength=cell.size)
            if (np.abs(error[cell] + delta) - np.abs(error[cell])).sum() < 0:
                error[cell] += delta
                sample[slots[keep]] = incoming[keep]
                break
            keep = keep[:keep.size // 2]
    return sample
