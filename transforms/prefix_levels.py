"""Prefix trees (seed 003), the three release algorithms, one level at a time, and their PTransforms.

* :func:`basic_step` (Figure 1), :func:`improved_step` (Figure 2, implicit stable discount),
  :func:`direct_step` (Figures 3, 4): one level's Beam-free arithmetic, frontier and sparse child
  counts → next frontier and :class:`~beamsynth.transforms.prefix_tree.LevelRelease`;
* ``_PrefixLevels`` — the shared wiring, and :class:`DPBasicPrefixHistogram`,
  :class:`DPImprovedPrefixHistogram`, :class:`DPDirectPrefixSynthesis`; ``run_in_memory`` runs the
  same steps and labelled draws without Beam.

Shapes: ``PCollection[EncodedBatch]`` (key codes ``(n, depth)``, contribution-bounded) → per level
``(cells, counts)`` per batch (the frontier is a side input) → one merged ``(cells, counts)`` per
window → ``LevelState`` (main output, the next frontier) and ``LevelRelease`` (tag ``release``) →
one flattened ``PCollection[LevelRelease]``.

Privacy (add/remove one unit of at most ``k`` records): each transform spends its accounting's
pure ε (:mod:`~beamsynth.transforms.prefix_accounting`) on the accountant when it is built
(step ``prefixes/<method>``, discrete Laplace). basic: ``(ε, 0)``-DP (Corollary 2 plus the second
pass); improved: ``ε`` per unit by :func:`~beamsynth.transforms.prefix_accounting.improved_privacy_loss`
(tight) or Theorem 3 (``2kε₀``), internal counts withheld; direct: ``(ε, 0)``-DP, the allocations
(pruned ``Center``) post-processing. Draws come from the streams ``(step, "level", depth,
window)`` of the run secret, so a retried level redraws identically.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindow

from beamsynth.schemas.keys import KeyCodec, prefix_bytes
from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import combine_globally, window_labels
from beamsynth.transforms.noise import RandomSource, discrete_laplace, run_seed
from beamsynth.transforms.prefix_accounting import (
    PrefixAccounting,
    basic_accounting,
    direct_accounting,
    direct_scales,
    improved_accounting,
)
from beamsynth.transforms.prefix_tree import (
    DISCOUNTS,
    LevelRelease,
    LevelState,
    SparseCountsCombineFn,
    allocate_discount,
    child_cells,
    children_of,
    dense_counts,
    prune_and_center,
    root_state,
)

__all__ = [
    "DPBasicPrefixHistogram",
    "DPDirectPrefixSynthesis",
    "DPImprovedPrefixHistogram",
    "basic_step",
    "direct_step",
    "improved_step",
]


# -- level steps (Beam-free) ---------------------------------------------------------------------------
def _same(state: LevelState) -> LevelState:
    """Identity (a one-output step in front of a side input; see ``_PrefixLevels.expand``)."""
    return state


def _release(depth: int, prefixes: np.ndarray, counts: np.ndarray, leaf: np.ndarray) -> LevelRelease:
    return LevelRelease(depth, prefixes, counts.astype(np.int64), leaf.astype(bool))


def _sorted_state(depth: int, prefixes: np.ndarray, carry: np.ndarray) -> LevelState:
    if prefixes.shape[0] > 1:
        order = np.argsort(prefix_bytes(prefixes, depth), kind="stable")
        prefixes, carry = prefixes[order], carry[order]
    return LevelState(depth, np.ascontiguousarray(prefixes), carry.astype(np.int64))


def basic_step(state: LevelState, idx: np.ndarray, cnt: np.ndarray, codec: KeyCodec, *,
               acct: PrefixAccounting, rs: RandomSource, last: bool) -> tuple[LevelState, LevelRelease]:
    """One level of Figure 1: noisy child counts; ≥ b splits, else leaf re-measured (fresh noise)."""
    a = codec.fanout
    counts = dense_counts(len(state), a, idx, cnt)
    valid = codec.valid_children(state.prefixes)
    noisy = counts + discrete_laplace(rs.child("level"), acct.scale, counts.shape)
    kids = children_of(state.prefixes, a)
    v = valid.ravel()
    terminal = codec.is_terminal(kids)
    expand = v & (noisy.ravel() >= acct.threshold) & ~terminal & (not last)
    leaf = v & ~expand
    final = counts.ravel() + discrete_laplace(rs.child("final"), acct.final_scale, counts.size)
    out_counts = np.where(expand, noisy.ravel(), final)
    keep = expand | (leaf & (out_counts > 0))  # dropping non-positive leaves is post-processing
    nxt = _sorted_state(state.depth + 1, kids[expand], np.zeros(int(expand.sum()), np.int64))
    return nxt, _release(state.depth + 1, kids[keep], out_counts[keep], leaf[keep])


def improved_step(state: LevelState, idx: np.ndarray, cnt: np.ndarray, codec: KeyCodec, *,
                  acct: PrefixAccounting, rule: str, rs: RandomSource) -> tuple[LevelState, LevelRelease]:
    """One level of Figure 2 with an implicit stable discount; internal counts are not released."""
    a = codec.fanout
    counts = dense_counts(len(state), a, idx, cnt)
    valid = codec.valid_children(state.prefixes)
    removed = allocate_discount(counts, state.carry, int(acct.discount or 0), rule, rs.child("discount"))
    eff = counts - removed
    noisy = eff + discrete_laplace(rs.child("level"), acct.scale, counts.shape)
    kids = children_of(state.prefixes, a)
    v = valid.ravel()
    terminal = codec.is_terminal(kids)
    expand = v & (noisy.ravel() >= acct.threshold) & ~terminal
    leaf = v & ~expand
    keep = expand | (leaf & (noisy.ravel() > 0))
    out_counts = np.where(expand, -1, noisy.ravel())
    nxt = _sorted_state(state.depth + 1, kids[expand], removed.ravel()[expand])
    return nxt, _release(state.depth + 1, kids[keep], out_counts[keep], leaf[keep])


def direct_step(state: LevelState, idx: np.ndarray, cnt: np.ndarray, codec: KeyCodec, *,
                acct: PrefixAccounting, rs: RandomSource, last: bool) -> tuple[LevelState, LevelRelease]:
    """One level of Figure 3: noisy child counts centred on each node's allocated count.

    At the root (``depth == 0``) the node's count is first measured: noisy total, clipped at 0.
    With ``acct.threshold`` (pruned Center) only children whose noisy count reaches it share the
    allocation (:func:`prune_and_center`); a node with none drops its allocation (an internal
    prefix is no key: ``LevelRelease.dropped``). Children with allocation 1, terminal children
    and the last level are leaves; allocation ≥ 2 continues.
    """
    a = codec.fanout
    counts = dense_counts(len(state), a, idx, cnt)
    valid = codec.valid_children(state.prefixes)
    alloc = state.carry
    if state.depth == 0:
        total = counts.sum() + discrete_laplace(rs.child("root"), acct.scale, 1)
        alloc = np.maximum(total, 0).astype(np.int64)
    kids = children_of(state.prefixes, a)
    cell_terminal = codec.is_terminal(kids).reshape(counts.shape)
    scale, t_scale, thr, t_thr = direct_scales(acct, state.depth + 1, a)
    noisy = counts + np.where(cell_terminal, discrete_laplace(rs.child("terminal"), t_scale, counts.shape),
                              discrete_laplace(rs.child("level"), scale, counts.shape))
    start = rs.child("start").integers(a, len(state)) if len(state) else np.zeros(0, np.int64)
    whole = codec.is_complete(state.prefixes) if state.depth else np.ones(len(state), bool)
    thresholds = None if thr is None else np.where(cell_terminal, t_thr, thr)
    sub, dropped = prune_and_center(alloc, noisy, valid, start, thresholds, whole)
    sub = sub.ravel()
    terminal = cell_terminal.ravel() | last
    expand = (sub >= 2) & ~terminal
    leaf = (sub >= 1) & ~expand
    keep = expand | leaf
    nxt = _sorted_state(state.depth + 1, kids[expand], sub[expand])
    rel = _release(state.depth + 1, kids[keep], sub[keep], leaf[keep])
    rel.dropped = dropped
    return nxt, rel


# -- Beam wiring ---------------------------------------------------------------------------------------
class _CountChildrenFn(beam.DoFn):
    """EncodedBatch → sparse child counts of the frontier (side input) at one depth."""

    def __init__(self, depth: int, fanout: int) -> None:
        self._depth, self._fanout = depth, fanout
        self._cache: tuple[LevelState, np.ndarray | None] | None = None

    def process(self, batch: EncodedBatch, state: LevelState | None = None):
        keys = None
        if state is not None:
            if self._cache is None or self._cache[0] is not state:  # holds the state: no id reuse
                self._cache = (state, state.keys)
            keys = self._cache[1]
        # always emit (possibly empty) so every window with data gets a state at every level
        yield child_cells(batch.codes, self._depth, keys, self._fanout)


class _LevelStepFn(beam.DoFn):
    """Sparse counts + frontier → next frontier (main) and released nodes (tag ``release``)."""

    def __init__(self, *, method: str, codec: KeyCodec, acct: PrefixAccounting, rule: str,
                 seed: int | None, step: str, depth: int, last: bool) -> None:
        self._method, self._codec, self._acct, self._rule = method, codec, acct, rule
        self._seed, self._step, self._depth, self._last = seed, step, depth, last

    def process(self, counts, state: LevelState, window=beam.DoFn.WindowParam):
        yield from self._emit(*self.step(counts, state, window))

    def step(self, counts: tuple[np.ndarray, np.ndarray], state: LevelState, window: Any
             ) -> tuple[LevelState, LevelRelease]:
        """The level's arithmetic (Beam-free): next frontier and released nodes."""
        idx, cnt = counts
        rs = RandomSource(seed=self._seed).child(self._step, "level", self._depth, *window_labels(window))
        if self._method == "basic":
            return basic_step(state, idx, cnt, self._codec, acct=self._acct, rs=rs, last=self._last)
        if self._method == "improved":
            return improved_step(state, idx, cnt, self._codec, acct=self._acct, rule=self._rule, rs=rs)
        return direct_step(state, idx, cnt, self._codec, acct=self._acct, rs=rs, last=self._last)

    @staticmethod
    def _emit(nxt: LevelState, rel: LevelRelease):
        yield nxt
        if len(rel) or rel.dropped:
            yield beam.pvalue.TaggedOutput("release", rel)


class _RootStepFn(_LevelStepFn):
    """Level 0: the frontier is the root (no side input)."""

    def process(self, counts, window=beam.DoFn.WindowParam):
        yield from self._emit(*self.step(counts, root_state(self._codec.symbol_dtype), window))


@element_types(input=EncodedBatch, output=LevelRelease)
class _PrefixLevels(beam.PTransform):
    """Shared level-by-level wiring; subclasses set the method and its accounting."""

    method = ""

    def __init__(self, *, codec: KeyCodec, acct: PrefixAccounting, levels: int, rule: str = "proportional",
                 seed: int | None = None, accountant: PrivacyAccountant | None = None,
                 label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(codec, KeyCodec):
            raise TypeError(f"codec must be a KeyCodec, got {type(codec).__name__}")
        if rule not in DISCOUNTS:
            raise ValueError(f"discount ({rule!r}) must be one of {DISCOUNTS}")
        if not 1 <= levels <= codec.depth:
            raise ValueError(f"max_depth ({levels!r}) must be in [1, {codec.depth}] for this key")
        seed = run_seed(seed)  # validates it; None → this transform's run secret, drawn at build time
        self._codec, self._acct, self._levels, self._rule, self._seed = codec, acct, levels, rule, seed
        if accountant is not None:
            accountant.spend(f"prefixes/{self.method}", PureDP(epsilon=acct.epsilon),
                             mechanism="discrete Laplace", details=acct.to_dict())

    @property
    def accounting(self) -> PrefixAccounting:
        """The privacy arithmetic of this transform."""
        return self._acct

    def default_label(self) -> str:
        return f"{type(self).__name__}(ε={self._acct.epsilon:g})"

    def display_data(self) -> dict[str, Any]:
        return display_items(
            mechanism=f"DP prefix tree ({self.method}; discrete Laplace per level)",
            method=self.method, epsilon=self._acct.epsilon, delta=0.0, noise="discrete Laplace",
            scale=self._acct.scale, key=self._codec.kind, fanout=self._codec.fanout,
            levels=self._levels, discount=self._rule)

    def step_fn(self, depth: int) -> _LevelStepFn:
        """The DoFn of level ``depth`` (its Beam-free ``step`` does the level's arithmetic)."""
        fn = _LevelStepFn if depth else _RootStepFn
        return fn(method=self.method, codec=self._codec, acct=self._acct, rule=self._rule,
                  seed=self._seed, step=self.label, depth=depth, last=depth == self._levels - 1)

    def run_in_memory(self, codes: np.ndarray) -> list[LevelRelease]:
        """All levels on one in-memory array of key codes, Beam-free (benchmarks, tests, audits).

        The same level functions and labelled draws as :meth:`expand` on the global window, so a
        seeded run releases the same tree as the pipeline given the same (bounded) keys.
        """
        state = root_state(self._codec.symbol_dtype)
        releases = []
        for d in range(self._levels):
            idx, cnt = child_cells(codes, d, state.keys, self._codec.fanout)
            state, rel = self.step_fn(d).step((idx, cnt), state, GlobalWindow())
            releases.append(rel)
        return releases

    def expand(self, batches):
        # batches: EncodedBatch (codes (n, depth) of symbols), contribution-bounded
        state = None
        releases = []
        for d in range(self._levels):
            empty = LevelState(d, np.zeros((0, d), self._codec.symbol_dtype), np.zeros(0, np.int64))
            side = () if state is None else (beam.pvalue.AsSingleton(state, default_value=empty),)
            partial = batches | f"Count{d}" >> beam.ParDo(_CountChildrenFn(d, self._codec.fanout), *side)
            # (cells int64[], counts int64[]) per batch
            counts = combine_globally(partial, SparseCountsCombineFn(), f"Sum{d}")
            # (cells, counts) merged, one per window
            out = counts | f"Step{d}" >> beam.ParDo(self.step_fn(d), *side).with_outputs(
                "release", main="state")
            # state: LevelState (frontier at depth d+1); release: LevelRelease
            state = out.state | f"State{d}" >> beam.Map(_same)
            # LevelState, from a one-output step: Beam's BundleBasedDirectRunner (the DirectRunner
            # on streams) handed the singleton view of a multi-output step's main output both
            # outputs, at random (apache/beam#19540: 'PCollection of size 2 ... singleton view')
            releases.append(out.release)
        return releases | "Released" >> beam.Flatten()
        # -> LevelRelease (released nodes of every level)


class DPBasicPrefixHistogram(_PrefixLevels):
    """Basic adaptive histogram with the re-measurement pass (seed 003 §2.3, Figure 1).

    Neighbours: add/remove one unit (≤ ``max_contributions`` = k records). Sensitivity k per level
    (nodes of a level are disjoint). Discrete Laplace, scale ``k/ε_level`` per level and
    ``k/ε_final`` for the leaves' second measurement. ``(B·ε_level + ε_final, 0)`` = ``(ε, 0)``-DP
    (Corollary 2). Output: ``PCollection[LevelRelease]``.
    """

    method = "basic"

    def __init__(self, *, codec: KeyCodec, budget: ApproxDP, max_depth: int | None = None,
                 max_contributions: int = 1, final_fraction: float = 0.25,
                 threshold: float | None = None, seed: int | None = None,
                 accountant: PrivacyAccountant | None = None, label: str | None = None) -> None:
        depth = codec.depth if max_depth is None else max_depth
        _check_budget(budget)
        acct = basic_accounting(epsilon=budget.epsilon, max_depth=depth, max_contributions=max_contributions,
                                final_fraction=final_fraction, fanout=codec.fanout, threshold=threshold)
        super().__init__(codec=codec, acct=acct, levels=depth, seed=seed, accountant=accountant, label=label)


class DPImprovedPrefixHistogram(_PrefixLevels):
    """Improved adaptive histogram with a stable discount (seed 003 §3, Figure 2, Theorem 3, App. A).

    Neighbours: add/remove one unit (≤ k records). Discrete Laplace scale ``1/ε₀ = 2k/ε`` on each
    discounted child count; threshold ``b``, discount ``t = ⌈b + ln 2/ε₀⌉``. ``2ε₀`` per record
    (Theorem 3, independent of depth), ``(2kε₀, 0) = (ε, 0)``-DP per unit by group privacy. The tree
    runs to the key's full depth. Output: ``PCollection[LevelRelease]`` (internal counts withheld).
    """

    method = "improved"

    def __init__(self, *, codec: KeyCodec, budget: ApproxDP, max_contributions: int = 1,
                 discount: str = "proportional", threshold: float | None = None,
                 calibration: str = "tight", seed: int | None = None,
                 accountant: PrivacyAccountant | None = None, label: str | None = None) -> None:
        _check_budget(budget)
        acct = improved_accounting(epsilon=budget.epsilon, max_contributions=max_contributions,
                                   fanout=codec.fanout, threshold=threshold, depth=codec.depth,
                                   calibration=calibration)
        super().__init__(codec=codec, acct=acct, levels=codec.depth, rule=discount, seed=seed,
                         accountant=accountant, label=label)


class DPDirectPrefixSynthesis(_PrefixLevels):
    """Direct data synthesis with ``Center`` (seed 003 §4, Figures 3, 4).

    Neighbours: add/remove one unit (≤ k records). Sensitivity k per level; discrete Laplace scale
    ``k(maxdepth + 1)/ε`` on the root total and on every non-terminal child count of ``maxdepth``
    levels; terminal cells (end of string, full depth) at level ``d`` get scale
    ``k/((maxdepth + 1 − d)·ε_level)`` (``terminal_budget``; each record's path of cells still
    sums to ε) → ``(ε, 0)``-DP. Allocations (pruned ``Center``) are post-processing. Output:
    ``PCollection[LevelRelease]`` (allocated counts of all nodes; leaves carry the synthetic
    multiplicities).
    """

    method = "direct"

    def __init__(self, *, codec: KeyCodec, budget: ApproxDP, max_depth: int | None = None,
                 max_contributions: int = 1, prune: bool | None = None, terminal_budget: bool = True,
                 seed: int | None = None, accountant: PrivacyAccountant | None = None,
                 label: str | None = None) -> None:
        depth = codec.depth if max_depth is None else max_depth
        _check_budget(budget)
        if prune is None:  # text: an internal prefix is no key; cells and hierarchy nodes are
            prune = codec.kind == "text"
        for name, value in (("prune", prune), ("terminal_budget", terminal_budget)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} ({value!r}) must be True or False")
        acct = direct_accounting(epsilon=budget.epsilon, max_depth=depth, max_contributions=max_contributions,
                                 fanout=codec.fanout, prune=prune, terminal_budget=terminal_budget)
        super().__init__(codec=codec, acct=acct, levels=depth, seed=seed, accountant=accountant, label=label)


def _check_budget(budget: Any) -> None:
    if not isinstance(budget, ApproxDP) or budget.delta != 0:
        raise ValueError(f"budget must be pure ε (PureDP), got {budget!r}")
