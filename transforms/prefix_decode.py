"""Prefix trees (seed 003), post-processing of released trees: tables, keys, restore, reduce.

* :func:`release_to_table` — released nodes as a table (depth, prefix, count or null, leaf);
* :func:`leaves_to_keys`, :class:`DecodeLeaves` (the PTransform), :func:`synthetic_keys` (the same
  draws Beam-free, global window), :func:`synth_sizes` — synthetic keys from released leaves;
* :func:`restore_discount` — improved: the ``t`` records each split removed given back to the
  leaves below it, in proportion to their released counts;
* :func:`reduce_to_ancestor` — direct: unresolved mass moved onto the nearest released complete
  keys (largest remainder, integer totals kept).

Shapes: ``PCollection[LevelRelease]`` → (for restore/reduce, gathered per window as
``(0, Iterable[LevelRelease])``: its size follows the released tree, never the data) →
``pyarrow.Table`` of the codec's output columns.

Privacy: post-processing only, no budget: everything here reads released values (which nodes
split, the leaves' noisy counts, the allocations). The decoding draws (uniform inside spatial
cells and below partial hierarchy nodes) come from the streams ``(step, depth, window)`` of the
run secret.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindow

from beamsynth.schemas.keys import KeyCodec, prefix_bytes
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import window_labels
from beamsynth.transforms.noise import RandomSource, run_seed
from beamsynth.transforms.prefix_tree import LevelRelease

__all__ = [
    "DecodeLeaves",
    "leaves_to_keys",
    "reduce_to_ancestor",
    "release_to_table",
    "restore_discount",
    "synth_sizes",
    "synthetic_keys",
]


# -- released nodes → table, leaves → keys ------------------------------------------------------------
def release_to_table(rel: LevelRelease, codec: KeyCodec) -> pa.Table:
    """Released nodes as a table: depth, prefix (readable), count (null when not released), leaf."""
    counts = pa.array(rel.counts, type=pa.int64(), mask=rel.counts < 0) if len(rel) else pa.array([], pa.int64())
    return pa.table({
        "depth": pa.array(np.full(len(rel), rel.depth, dtype=np.int64)),
        "prefix": pa.array(codec.labels(rel.prefixes), type=pa.string()),
        "count": counts,
        "leaf": pa.array(rel.leaf, type=pa.bool_()),
    })


def leaves_to_keys(rel: LevelRelease, codec: KeyCodec, rs: RandomSource,
                   *, complete_only: bool = True) -> tuple[dict[str, np.ndarray], int]:
    """Synthetic keys from released leaves: ``count`` copies of each leaf, decoded.

    Text leaves that do not end in EOS are not complete strings; with ``complete_only`` they are
    dropped and their (noisy, already released) mass is returned as the second value.
    """
    m = rel.leaf & (rel.counts > 0)
    pre, cnt = rel.prefixes[m], rel.counts[m]
    dropped = int(rel.dropped)
    if complete_only:
        ok = codec.is_complete(pre) if pre.shape[1] else np.zeros(pre.shape[0], bool)
        dropped += int(cnt[~ok].sum())
        pre, cnt = pre[ok], cnt[ok]
    rows = np.repeat(pre, cnt, axis=0)
    return codec.decode(rows, rs), dropped


class _DecodeLeavesFn(beam.DoFn):
    def __init__(self, codec: KeyCodec, seed: int | None, step: str, complete_only: bool) -> None:
        self._codec, self._seed, self._step, self._complete = codec, seed, step, complete_only

    def process(self, rel: LevelRelease, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child(self._step, rel.depth, *window_labels(window))
        cols, dropped = leaves_to_keys(rel, self._codec, rs, complete_only=self._complete)
        if dropped:
            beam.metrics.Metrics.counter("beamsynth", "incomplete_leaf_mass_dropped").inc(dropped)
        n = len(next(iter(cols.values()))) if cols else 0
        if n:
            yield pa.table({k: pa.array(v) for k, v in cols.items()})


# -- the whole released tree: restore (improved), reduce (direct) -------------------------------------
def restore_discount(releases: Sequence[LevelRelease], discount: int) -> list[LevelRelease]:
    """Post-processing for ``improved``: give back the ``t`` records each split removed.

    Uses only released values (which nodes split, the leaves' noisy counts): every split node
    hands ``t`` back to the leaves below it in proportion to their released counts, so leaf
    ``ℓ`` becomes ``round(c_ℓ · (1 + Σ_{split ancestors a} t / M_a))`` with ``M_a`` the released
    leaf mass under ``a`` (the root included). An estimate: a split removes at most ``t``.
    """
    leaves = [r for r in releases if len(r)]
    if not leaves or discount <= 0:
        return list(releases)
    factor = [np.ones(len(r)) for r in leaves]
    positive = [r.leaf & (r.counts > 0) for r in leaves]
    total = sum(float(r.counts[m].sum()) for r, m in zip(leaves, positive))
    if total <= 0:
        return list(releases)
    for i in range(len(leaves)):
        factor[i][positive[i]] += discount / total  # the root always splits
    max_depth = max(r.depth for r in leaves)
    for a in range(1, max_depth):
        splits = [r.prefixes[~r.leaf] for r in leaves if r.depth == a]
        if not splits or sum(x.shape[0] for x in splits) == 0:
            continue
        split_keys = np.sort(prefix_bytes(np.concatenate(splits), a))
        below = [(i, r) for i, r in enumerate(leaves) if r.depth > a]
        anc = [prefix_bytes(r.prefixes[positive[i]], a) for i, r in below]
        cnts = [r.counts[positive[i]].astype(np.float64) for i, r in below]
        if not anc or sum(x.size for x in anc) == 0:
            continue
        uniq, inv = np.unique(np.concatenate(anc), return_inverse=True)
        mass = np.bincount(inv.ravel(), weights=np.concatenate(cnts))
        is_split = np.isin(uniq, split_keys)
        add = np.where(is_split & (mass > 0), discount / np.where(mass > 0, mass, 1.0), 0.0)
        start = 0
        for (i, _r), keys in zip(below, anc):
            factor[i][positive[i]] += add[inv.ravel()[start:start + keys.size]]
            start += keys.size
    out = []
    for r, f, m in zip(leaves, factor, positive):
        counts = np.where(m, np.rint(r.counts * f).astype(np.int64), r.counts)
        out.append(LevelRelease(r.depth, r.prefixes, counts, r.leaf))
    return out


def _ancestor_bytes(prefixes: np.ndarray, j: int) -> np.ndarray:
    """Bytes of each prefix's ancestor at depth ``j`` (the root, ``j = 0``, is the empty key)."""
    if j == 0:
        return np.zeros(prefixes.shape[0], dtype="S1")
    return prefix_bytes(prefixes, j)


def _spread(mass: np.ndarray, group: np.ndarray, weight: np.ndarray, n_groups: int) -> np.ndarray:
    """Integer shares of ``mass[g]`` over the members of each group, proportional to ``weight``.

    Largest remainder (ties: the earlier member); exact integer arithmetic, so every group's
    shares sum to its mass. ``group`` is each member's group index, every group has weight > 0.
    """
    total = np.bincount(group, weights=weight, minlength=n_groups).astype(np.int64)
    num = mass[group] * weight
    base = num // total[group]
    frac = num % total[group]
    rest = mass - np.bincount(group, weights=base, minlength=n_groups).astype(np.int64)
    order = np.lexsort((np.arange(group.size), -frac, group))  # by group, then largest remainder
    first = np.searchsorted(group[order], np.arange(n_groups))
    rank = np.empty(group.size, dtype=np.int64)
    rank[order] = np.arange(group.size) - first[group[order]]
    return base + (rank < rest[group])


def reduce_to_ancestor(releases: Sequence[LevelRelease], codec: KeyCodec) -> tuple[list[LevelRelease], int]:
    """Post-processing for ``direct``: put unresolved mass on the nearest released complete keys.

    Uses only released values. Unresolved mass is (a) a released leaf that is no complete key
    (an allocation of 1 inside a string, a cut at ``maxdepth``) and (b) the part of an internal
    node's released allocation that none of its released children carries (pruned ``Center``
    dropped it: no child reached the threshold). Each such mass at prefix ``q`` goes to the
    complete keys released below the deepest ancestor-or-self of ``q`` that has any, in
    proportion to their released counts (largest remainder, so totals stay integers). Every
    unit of the noisy total then lands on a complete key: the number of rows written equals the
    released total (the depth-1 allocations). Mass with no complete key anywhere stays dropped
    (second value). Only counts of released leaves change; internal nodes keep their values.
    """
    rels = [r for r in releases if len(r)]
    if not rels:
        return list(releases), int(sum(r.dropped for r in releases))
    complete = [r.leaf & (r.counts > 0) & codec.is_complete(r.prefixes) for r in rels]
    # unresolved mass per node: incomplete leaves, and internal allocation no released child carries
    by_depth: dict[int, list[LevelRelease]] = {}
    for r in rels:
        by_depth.setdefault(r.depth, []).append(r)
    lost_pre: list[np.ndarray] = []
    lost_mass: list[np.ndarray] = []
    for r, ok in zip(rels, complete):
        m = r.leaf & (r.counts > 0) & ~ok
        lost_pre.append(r.prefixes[m])
        lost_mass.append(r.counts[m].astype(np.int64))
        internal = ~r.leaf & (r.counts > 0)
        if not internal.any():
            continue
        kids = by_depth.get(r.depth + 1, [])
        parent = prefix_bytes(r.prefixes[internal], r.depth)
        carried = np.zeros(parent.size, dtype=np.int64)
        if kids:
            kid_pre = np.concatenate([k.prefixes for k in kids])
            kid_cnt = np.concatenate([np.maximum(k.counts, 0) for k in kids]).astype(np.int64)
            order = np.argsort(parent, kind="stable")
            pos = np.minimum(np.searchsorted(parent[order], prefix_bytes(kid_pre, r.depth)), parent.size - 1)
            hit = parent[order][pos] == prefix_bytes(kid_pre, r.depth)
            np.add.at(carried, order[pos[hit]], kid_cnt[hit])
        rest = r.counts[internal].astype(np.int64) - carried
        lost_pre.append(r.prefixes[internal][rest > 0])
        lost_mass.append(rest[rest > 0])
    # targets: the released complete keys, one row per leaf (release index, position)
    t_rel = np.concatenate([np.full(int(ok.sum()), i, np.int64) for i, ok in enumerate(complete)])
    t_pos = np.concatenate([np.flatnonzero(ok) for ok in complete])
    t_weight = np.concatenate([r.counts[ok] for r, ok in zip(rels, complete)]).astype(np.int64)
    new_counts = [r.counts.copy() for r in rels]
    pending = [(p, m) for p, m in zip(lost_pre, lost_mass) if m.size]
    for j in range(max((p.shape[1] for p, _m in pending), default=-1), -1, -1):
        if not pending or t_rel.size == 0:
            break
        # ancestors at depth j of every target deep enough to have one, in target order
        deep = [(i, r) for i, r in enumerate(rels) if r.depth > j and complete[i].any()]
        if not deep:
            continue
        under = np.flatnonzero(np.isin(t_rel, [i for i, _r in deep]))
        t_anc = np.concatenate([_ancestor_bytes(r.prefixes[complete[i]], j) for i, r in deep])
        keys = np.unique(t_anc)
        still, placed_keys, placed_mass = [], [], []
        for pre, mass in pending:
            if pre.shape[1] < j:
                still.append((pre, mass))
                continue
            anc = _ancestor_bytes(pre, j)
            hit = np.isin(anc, keys)
            placed_keys.append(anc[hit])
            placed_mass.append(mass[hit])
            if (~hit).any():
                still.append((pre[~hit], mass[~hit]))
        pending = still
        if sum(k.size for k in placed_keys) == 0:
            continue
        groups, inv = np.unique(np.concatenate(placed_keys), return_inverse=True)
        gmass = np.bincount(inv.ravel(), weights=np.concatenate(placed_mass), minlength=groups.size)
        member = np.isin(t_anc, groups)
        share = _spread(gmass.astype(np.int64), np.searchsorted(groups, t_anc[member]),
                        t_weight[under[member]], groups.size)
        for idx, add in zip(under[member], share):
            new_counts[t_rel[idx]][t_pos[idx]] += add
    unplaced = int(sum(int(m.sum()) for _p, m in pending))
    out = []
    for r, c in zip(rels, new_counts):
        incomplete = r.leaf & ~codec.is_complete(r.prefixes)
        out.append(LevelRelease(r.depth, r.prefixes, np.where(incomplete & (c > 0), 0, c), r.leaf))
    out[0].dropped = unplaced  # only mass whose prefix has no complete key below any ancestor
    return out, unplaced


# -- Beam: decoding -----------------------------------------------------------------------------------
@element_types(input=LevelRelease, output=pa.Table)
class DecodeLeaves(beam.PTransform):
    """``LevelRelease`` → ``pyarrow.Table`` of synthetic keys (post-processing only).

    ``count`` copies of every released leaf, decoded by the codec (uniform inside spatial cells
    and below partial hierarchy nodes); incomplete text leaves are dropped (counted in a metric).
    With ``restore_discount = t`` (improved only) or ``reduce=True`` (direct) the released tree
    of each window is first gathered (its size follows the tree, not the data) and
    :func:`restore_discount` or :func:`reduce_to_ancestor` applied (the mass moved is counted in
    the metric ``mass_reduced_to_keys``).
    """

    def __init__(self, *, codec: KeyCodec, seed: int | None = None, complete_only: bool = True,
                 restore_discount: int | None = None, reduce: bool = False,
                 label: str | None = None) -> None:
        super().__init__(label)
        if restore_discount is not None and (not isinstance(restore_discount, int) or restore_discount < 0):
            raise ValueError(f"restore_discount ({restore_discount!r}) must be None or an int >= 0")
        if not isinstance(reduce, bool):
            raise TypeError(f"reduce ({reduce!r}) must be True or False")
        self._codec, self._seed, self._complete = codec, run_seed(seed), complete_only
        self._restore, self._reduce = restore_discount, reduce

    def display_data(self) -> dict[str, Any]:
        """How released leaves are decoded (post-processing: no budget)."""
        return display_items(mechanism="decoding released leaves (post-processing, no budget)",
                             key=self._codec.kind, fanout=self._codec.fanout,
                             complete_only=self._complete, restore_discount=self._restore,
                             reduce_to_ancestor=self._reduce)

    def expand(self, releases):
        if self._restore:
            t = self._restore
            releases = (
                releases
                | "KeyTree" >> beam.Map(lambda r: (0, r))
                # (0, LevelRelease)
                | "GatherTree" >> beam.GroupByKey()
                # (0, Iterable[LevelRelease]) per window: the released tree only
                | "Restore" >> beam.FlatMap(lambda kv: restore_discount(list(kv[1]), t))
                # LevelRelease with restored leaf counts
            )
        if self._reduce:
            releases = (
                releases
                | "KeyTreeReduce" >> beam.Map(lambda r: (0, r))
                # (0, LevelRelease)
                | "GatherTreeReduce" >> beam.GroupByKey()
                # (0, Iterable[LevelRelease]) per window: the released tree only
                | "ReduceToAncestor" >> beam.FlatMap(_reduce_gathered, self._codec)
                # LevelRelease: unresolved mass moved onto released complete keys
            )
        return releases | "Decode" >> beam.ParDo(
            _DecodeLeavesFn(self._codec, self._seed, "decode", self._complete))
        # -> pyarrow.Table with the codec's output columns


def _reduce_gathered(kv: tuple[Any, Iterable[LevelRelease]], codec: KeyCodec) -> list[LevelRelease]:
    """One window's released tree → :func:`reduce_to_ancestor`; counts the mass moved."""
    rels = sorted(kv[1], key=lambda r: r.depth)
    out, _unplaced = reduce_to_ancestor(rels, codec)
    moved = synth_sizes(out) - sum(int(r.counts[r.leaf & (r.counts > 0) & codec.is_complete(r.prefixes)].sum())
                                   for r in rels if len(r))
    if moved > 0:
        beam.metrics.Metrics.counter("beamsynth", "mass_reduced_to_keys").inc(moved)
    return out


def synthetic_keys(releases: Sequence[LevelRelease], codec: KeyCodec, *, seed: int | None = None,
                   restore: int | None = None, reduce: bool = False,
                   step: str = "decode") -> tuple[dict[str, np.ndarray], int]:
    """Beam-free :class:`DecodeLeaves` on the global window: decoded keys and dropped mass.

    Same draws as the pipeline (``seed``, ``step``, depth, window labels); ``restore`` is the
    improved method's ``t`` for :func:`restore_discount`, ``reduce`` applies
    :func:`reduce_to_ancestor` (both post-processing).
    """
    rels = restore_discount(list(releases), restore) if restore else list(releases)
    if reduce:
        rels, _unplaced = reduce_to_ancestor(rels, codec)
    seed = run_seed(seed)
    parts: list[dict[str, np.ndarray]] = []
    dropped = 0
    for rel in rels:
        rs = RandomSource(seed=seed).child(step, rel.depth, *window_labels(GlobalWindow()))
        cols, lost = leaves_to_keys(rel, codec, rs)
        parts.append(cols)
        dropped += lost
    out = {c: np.concatenate([p[c] for p in parts]) if parts else np.zeros(0, object)
           for c in codec.output_columns}
    return out, dropped


def synth_sizes(releases: Sequence[LevelRelease]) -> int:
    """Total synthetic multiplicity of released leaves (helper for reports and tests)."""
    return int(sum(int(r.counts[r.leaf & (r.counts > 0)].sum()) for r in releases))
