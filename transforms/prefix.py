"""Hierarchical prefix counting and synthesis (seed 003): adaptive histograms and direct synthesis.

Keys are symbol sequences from a declared hierarchy (:mod:`beamsynth.schemas.keys`: text, spatial
cells, categorical trees). All three algorithms of the paper run **one level at a time**: level
``d`` counts, over the distributed data, the children of the current *frontier* (the nodes at
depth ``d`` still being refined). The frontier is a side input (sorted prefix bytes), batches are
columnar :class:`~beamsynth.schemas.schema.EncodedBatch` of symbol codes, counts are sparse
``(cell, count)`` arrays merged by :class:`SparseCountsCombineFn`; the per-level decision runs on
one small element per window whose size follows the frontier, never the data.

Neighbours: add/remove one privacy unit, which contributes at most ``k`` records after
:class:`~beamsynth.transforms.units.BoundContributions` (``k = 1`` without a privacy id). The
paper's Definition 1 (Section 2.1) already uses the symmetric difference, i.e. add/remove of one
record; nothing here is a replace-one analysis. Noise is discrete Laplace
(``P(Z = z) ∝ exp(-|z|/s)``), integer-valued, from :class:`~beamsynth.transforms.noise.RandomSource`.

Accounting per method (functions :func:`basic_accounting`, :func:`improved_accounting`,
:func:`direct_accounting`; tests check each against its theorem):

* **basic** (Section 2.3, Figure 1, Corollary 2): the root is always split (a data-independent
  choice); levels ``1..B`` each measure the children of the frontier, disjoint nodes, L1
  sensitivity ``k``, scale ``k/ε_level`` → ``ε_level`` per level; the re-measurement of the leaves
  (Section 2.3's second pass) uses fresh noise of scale ``k/ε_final`` on every leaf (a partition)
  → ``ε_final``. Total ``B·ε_level + ε_final`` (Corollary 2's ``εB`` plus the second pass).
* **improved** (Section 3, Figure 2, Theorem 3; Appendix A): record-level ``ε₀``, noise scale
  ``1/ε₀``, threshold ``b``, stable discount ``t`` removed before every split (implicitly, folded
  into the children's counts, Appendix A's remark). Theorem 3: ``2ε₀``-DP for one record with
  ``t = ⌈b + ln 2/ε₀⌉``, **independent of depth**. Read tightly, the proof gives
  ``ε₀ + Σ_{j≥1} h(jt)`` (:func:`improved_privacy_loss`; about ``1.12ε₀`` for the paper's
  parameters), and the default ``calibration="tight"`` picks ``(ε₀, b, t)`` that spend ``ε/k``
  per record by that formula (:func:`improved_accounting`); ``"theorem3"`` keeps the paper's
  ``ε₀ = ε/(2k)``. Only the split decisions and the leaves' noisy counts are released (internal
  counts would cost ``ε₀`` per level). A unit of ``k`` records: group privacy.
* **direct** (Section 4, Figures 3, 4): the root total and ``maxdepth`` levels of children counts
  are measured, ``maxdepth + 1`` levels, each scale ``k(maxdepth + 1)/ε`` (the paper's
  ``R = maxdepth/ε``, plus the root count) → ``ε`` total; end-of-string (terminal) cells get the
  budget their records' shorter path leaves unused (:func:`direct_scales`). ``Center`` — pruned
  to children whose noisy count reaches a public threshold for text keys — is post-processing.

Discounts (Section 3 and Appendix A), all applied implicitly: each node carries the number of
records its ancestors removed from its subtree ("owed"), and a split spreads ``owed + t`` over the
children.

* ``skip``: the paper's ``Skip`` over the fixed lexicographic order of keys. Subtrees are
  contiguous in that order, so the removed records of every node are its first ones and the
  deferred bookkeeping is *exactly* the explicit Skip; Theorem 3's proof applies verbatim.
* ``proportional`` (default): ``Skip`` over a uniformly random order of the records, which
  Appendix A calls proportional discounting. The deferred version draws the children's shares
  from the multivariate hypergeometric law, which has the same joint law as the explicit random
  order (the remaining records stay exchangeable); for every fixed order the mechanism is a
  stable Skip, so the mixture is 2ε₀-DP and this randomness is not privacy-critical.
* ``uniform``: round robin over the children in a fixed order (equal shares, empty children
  skipped). Stability of the whole deferred discount is checked by property tests on random
  trees (``tests/unit/test_prefix.py``), not proved; prefer ``skip``/``proportional`` when a
  proof is required. (Progressive discounting with deferral is *not* stable — the tests keep a
  counterexample — so it is not offered.)

Modules (this one re-exports their public names, ``__all__``, and ``SPURIOUS_RATE``; import from
here in user code):

* :mod:`~beamsynth.transforms.prefix_accounting` — :class:`PrefixAccounting`, the three methods'
  calibration and thresholds (the proofs; Beam-free);
* :mod:`~beamsynth.transforms.prefix_tree` — frontier and released levels, sparse child counts,
  the discount rules and ``Center`` (Beam-free, plus :class:`SparseCountsCombineFn`);
* :mod:`~beamsynth.transforms.prefix_levels` — the level steps of the three algorithms and the
  PTransforms :class:`DPBasicPrefixHistogram`, :class:`DPImprovedPrefixHistogram`,
  :class:`DPDirectPrefixSynthesis`;
* :mod:`~beamsynth.transforms.prefix_decode` — post-processing: tree tables, synthetic keys
  (:class:`DecodeLeaves`, :func:`synthetic_keys`), :func:`restore_discount`,
  :func:`reduce_to_ancestor`.
"""

from __future__ import annotations

from beamsynth.transforms.prefix_accounting import (
    CALIBRATIONS,
    PrefixAccounting,
    basic_accounting,
    default_threshold,
    direct_accounting,
    direct_scales,
    improved_accounting,
    improved_privacy_loss,
    spurious_threshold,
)
from beamsynth.transforms.prefix_accounting import SPURIOUS_RATE as SPURIOUS_RATE
from beamsynth.transforms.prefix_decode import (
    DecodeLeaves,
    leaves_to_keys,
    reduce_to_ancestor,
    release_to_table,
    restore_discount,
    synth_sizes,
    synthetic_keys,
)
from beamsynth.transforms.prefix_levels import (
    DPBasicPrefixHistogram,
    DPDirectPrefixSynthesis,
    DPImprovedPrefixHistogram,
    basic_step,
    direct_step,
    improved_step,
)
from beamsynth.transforms.prefix_tree import (
    DISCOUNTS,
    LevelRelease,
    LevelState,
    SparseCountsCombineFn,
    allocate_discount,
    center,
    child_cells,
    children_of,
    dense_counts,
    prune_and_center,
    root_state,
    round_robin_remove,
)

__all__ = [
    "CALIBRATIONS",
    "DISCOUNTS",
    "DPBasicPrefixHistogram",
    "DPDirectPrefixSynthesis",
    "DPImprovedPrefixHistogram",
    "DecodeLeaves",
    "LevelRelease",
    "LevelState",
    "PrefixAccounting",
    "SparseCountsCombineFn",
    "allocate_discount",
    "basic_accounting",
    "basic_step",
    "center",
    "child_cells",
    "children_of",
    "default_threshold",
    "dense_counts",
    "direct_accounting",
    "direct_scales",
    "direct_step",
    "improved_accounting",
    "improved_privacy_loss",
    "improved_step",
    "leaves_to_keys",
    "prune_and_center",
    "reduce_to_ancestor",
    "release_to_table",
    "restore_discount",
    "root_state",
    "round_robin_remove",
    "spurious_threshold",
    "synth_sizes",
    "synthetic_keys",
]
