"""Plausible deniability: seed-based synthesis filtered by a privacy test (seed 001).

Bindschaedler, Shokri, Gunter, "Plausible Deniability for Privacy-Preserving Data Synthesis",
VLDB 2017 (``../shared/seeds/001_a58ab0304eaaa797.txt``; formulas restated in
``../shared/notes/algorithms.md`` and re-derived/checked by brute force in ``tests/unit``).

Pipeline (one composite transform per mechanism, arithmetic in Beam-free functions; modules below):

1. :class:`SplitForPlausible` — a random, order-independent split of the (bounded) records into
   disjoint parts: seeds ``D_S``, structure ``D_T`` and parameters ``D_P`` (Section 3.5).
2. :class:`DPPlausibleBayesNet` — the generative model of Section 3, learned with privacy:
   structure by correlation-based feature selection (CFS, Section 3.3) on noisy entropies from one
   pass of pairwise counts over ``D_T``; parameters by sampling Dirichlet posteriors over noisy
   conditional counts of ``D_P`` (Section 3.4), the noise of a parent configuration derived lazily
   from a **secret** HMAC key. Everything after the two measurements is post-processing.
   Or :class:`DPPrivBayesGenerator` — the PrivBayes model (``transforms/privbayes.py``, with its
   refinement and its own accounting) on ``D_T ∪ D_P``, turned by post-processing into a
   :class:`NetworkGenerator` (:func:`privbayes_generator`). Both are
   :class:`SeedResamplingNetwork` s: ``Pr{y = M(d)} = 1[y_C = d_C]·Π_{resampled i} P(y_i | y_Π_i)``.
3. :class:`GenerateCandidates` — Mechanism 1 (Section 2): seeds drawn uniformly from ``D_S``
   (Poissonized: seed ``d`` yields ``Poisson(rows/|D_S|)`` candidates), the last ``ω`` attributes of a
   topological order resampled, the rest copied (Section 3.1).
4. :class:`PlausibleDeniabilityFilter` — Privacy Test 1 (deterministic) or 2 (randomized threshold)
   with two outputs, ``released`` and ``rejected`` (Section 2.2). A generic path works for any
   :class:`PlausibleModel`; the fast path for seed-resampling networks groups candidates and seed
   records by their copied-attribute values (no candidate × record cross product).

Privacy (add/remove one privacy unit, contributions bounded to one record per unit before this
stage; with ``max_contributions = c`` every sensitivity below is multiplied by ``c``):

* structure: ``|H|+1`` queries on ``D_T`` (every single and pairwise entropy, plus the count of
  ``D_T``), basic sequential composition, see :func:`entropy_sum_sensitivity`;
* parameters: one table per attribute on ``D_P``, each record in exactly one cell per table, discrete
  Laplace of scale ``m/ε`` on every cell (sequential composition over the ``m`` tables);
* ``D_T``, ``D_P`` and ``D_S`` are disjoint and a unit's part depends only on the unit, so the model is
  ε-DP by parallel composition (structure and parameters each get the full model ε);
* with the PrivBayes generator, the model is PrivBayes's ε on ``D_T ∪ D_P`` (its own sequential
  composition, ``docs/privbayes.md``); the generator fitted to it is post-processing;
* Theorem 1 conditions on the model, which is a function of ``D_T ∪ D_P`` only, so it holds for
  either generator when a unit of ``D_S`` changes;
* the release of one candidate by Privacy Test 2 is ``(ε0 + ln(1 + γ/t), exp(-ε0(k - t)))``-DP
  (Theorem 1, :func:`theorem1_guarantee`); the ``Poisson(rows)`` invocations compose sequentially
  and are charged over a public bound ``C`` (:func:`candidate_release_cost`). Test 1 has no DP
  guarantee (only (k, γ)-plausible deniability, Definition 1).

Modules (this one re-exports their public names, ``__all__``, and ``METRICS_NAMESPACE``,
``lookup_counts``, ``fast_plausible_counts``; import from here in user code):

* :mod:`~beamsynth.transforms.plausible_structure` — entropy sensitivity, noisy entropies, CFS
  structure (Section 3.3; Beam-free);
* :mod:`~beamsynth.transforms.plausible_model` — the seed-based models: :class:`PlausibleModel`,
  :class:`PerturbationModel`, :class:`SeedResamplingNetwork`, :class:`PlausibleBayesNet`,
  :class:`NetworkGenerator` and its fitting (Sections 3.1-3.4; Beam-free);
* :mod:`~beamsynth.transforms.plausible_privacy` — the privacy tests, Theorem 1, the Poissonized
  invocations and their cost ``(C·ε₁, C·δ₁ + δ_tail)`` (Section 2.2, Appendix C; Beam-free);
* :mod:`~beamsynth.transforms.plausible_split` — :class:`SplitForPlausible`, per-record draws,
  value shards and :class:`OrderReleased`;
* :mod:`~beamsynth.transforms.plausible_learn` — :class:`DPPlausibleBayesNet` and
  :class:`DPPrivBayesGenerator`;
* :mod:`~beamsynth.transforms.plausible_filter` — :class:`GenerateCandidates` and
  :class:`PlausibleDeniabilityFilter`.
"""

from __future__ import annotations

from beamsynth.transforms.plausible_filter import METRICS_NAMESPACE as METRICS_NAMESPACE
from beamsynth.transforms.plausible_filter import (
    REJECT_BELOW_K,
    REJECT_NOISY_THRESHOLD,
    CandidateBatch,
    GenerateCandidates,
    PlausibleDeniabilityFilter,
    RejectedCandidates,
    check_sample,
)
from beamsynth.transforms.plausible_filter import lookup_counts as lookup_counts
from beamsynth.transforms.plausible_learn import (
    DEFAULT_MAX_RECORDS,
    DPPlausibleBayesNet,
    DPPrivBayesGenerator,
    copy_first_order,
    model_sample,
    param_tables,
    privbayes_generator,
)
from beamsynth.transforms.plausible_model import (
    GENERATOR_MAX_CELLS,
    GENERATOR_MAX_CONFIGS,
    GENERATOR_MAX_PARENTS,
    GENERATOR_POOL_ROWS,
    NetworkGenerator,
    PerturbationModel,
    PlausibleBayesNet,
    PlausibleModel,
    SeedResamplingNetwork,
    choose_parents,
    fit_network_generator,
)
from beamsynth.transforms.plausible_privacy import (
    candidate_bound,
    candidate_release_cost,
    count_plausible_generic,
    plausible_interval,
    poisson_counts,
    privacy_test,
    theorem1_guarantee,
)
from beamsynth.transforms.plausible_privacy import (
    fast_plausible_counts as fast_plausible_counts,
)
from beamsynth.transforms.plausible_split import (
    OrderReleased,
    SplitForPlausible,
    group_keys,
    ordered_release,
    record_ranks,
    record_split_assignments,
    record_uniforms,
    release_order,
    release_shards,
    seed_shards,
    split_assignments,
    unit_split_assignments,
)
from beamsynth.transforms.plausible_structure import (
    PlausibleStructure,
    cfs_structure,
    clamped_entropy_sum_sensitivity,
    entropy_sensitivity_add_remove,
    entropy_sensitivity_replace_one,
    entropy_sum,
    entropy_sum_sensitivity,
    learn_structure,
    noisy_entropies,
    structure_specs,
    symmetrical_uncertainty,
    topological_order,
)

__all__ = [
    "DEFAULT_MAX_RECORDS",
    "REJECT_BELOW_K",
    "REJECT_NOISY_THRESHOLD",
    "CandidateBatch",
    "DPPlausibleBayesNet",
    "DPPrivBayesGenerator",
    "GENERATOR_MAX_CELLS",
    "GENERATOR_MAX_CONFIGS",
    "GENERATOR_MAX_PARENTS",
    "GENERATOR_POOL_ROWS",
    "NetworkGenerator",
    "SeedResamplingNetwork",
    "choose_parents",
    "copy_first_order",
    "fit_network_generator",
    "model_sample",
    "privbayes_generator",
    "GenerateCandidates",
    "OrderReleased",
    "PlausibleBayesNet",
    "PlausibleDeniabilityFilter",
    "PlausibleModel",
    "PlausibleStructure",
    "PerturbationModel",
    "RejectedCandidates",
    "SplitForPlausible",
    "cfs_structure",
    "count_plausible_generic",
    "clamped_entropy_sum_sensitivity",
    "entropy_sensitivity_add_remove",
    "entropy_sensitivity_replace_one",
    "entropy_sum",
    "entropy_sum_sensitivity",
    "group_keys",
    "learn_structure",
    "param_tables",
    "structure_specs",
    "noisy_entropies",
    "ordered_release",
    "candidate_bound",
    "candidate_release_cost",
    "check_sample",
    "plausible_interval",
    "poisson_counts",
    "privacy_test",
    "release_order",
    "release_shards",
    "seed_shards",
    "split_assignments",
    "symmetrical_uncertainty",
    "theorem1_guarantee",
    "topological_order",
    "unit_split_assignments",
    "record_ranks",
    "record_split_assignments",
    "record_uniforms",
]
