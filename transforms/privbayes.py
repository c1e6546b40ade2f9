"""PrivBayes: a differentially private Bayesian network, fitted from noisy marginals on Beam.

Seed paper: Zhang, Cormode, Procopiuc, Srivastava, Xiao, "PrivBayes: Private Data Release via
Bayesian Networks" (SIGMOD 2014 / TODS 2017), as implemented by DataSynthesizer's correlated
attribute mode (Ping, Stoyanovich, Howe 2017, seed 004, §3 "GreedyBayes"). Formulas:
``shared/notes/algorithms.md``.

Pipeline (one pass over the private data, plus the row count done by the caller; the default
k is 1 with the refinement below, 2 without):

1. **Count** (``CountCandidates``): one :class:`~beamsynth.transforms.measure.MarginalCountsCombineFn`
   computes the exact counts of every ``(k+1)``-column subset (the candidate families). Nothing
   leaves this step but what step 2 releases.
2. **Measure** (``ChooseAndMeasure``, :class:`PrivBayesMeasureFn`), both on the exact tables:

   a. *Structure* — greedy network construction (PrivBayes Alg. 4 / DataSynthesizer GreedyBayes):
      the root is drawn uniformly (data-independent), then each of the ``d−1`` remaining
      attributes is added with its parent set ``Π ⊆ V, |Π| = min(k, |V|)`` chosen by
      **permute-and-flip** (:func:`~beamsynth.transforms.noise.permute_and_flip`, McKenna &
      Sheldon 2020, an ε-DP drop-in for the exponential mechanism with a never-worse expected
      score) with budget ``ε_s/(d−1)`` each on the score
      ``indif(X, Π) − cells(X, Π)·b`` where ``indif`` (:func:`indif_score`, PrivSyn's InDif,
      Zhang et al. 2021 §4) is the L1 distance, in counts, between the joint table of ``(X, Π)``
      and the product of its two marginals, and ``cells·b`` is a **data-independent** penalty,
      the expected L1 noise of that family's released table (b = its discrete Laplace scale):
      the analogue of PrivBayes' θ-usefulness (§4.4) in count units. PrivBayes' own F/R scores
      are analysed for replace-one neighbours with a public ``n``; InDif needs no ``n``.
      **Sensitivity** (add/remove one record; proof in :func:`indif_score`): ``Δ ≤ 4``; with at most
      ``m`` records per privacy unit, ``Δ ≤ 4m``. The penalty does not change ``Δ``.
   b. *Marginals* — the chosen families ``X ∪ Π`` (the root's 1-way table only if it lies in no
      other family) released with discrete Laplace noise of scale ``m/ε_t`` on every declared cell
      (:func:`~beamsynth.transforms.measure.noisy_marginals`), ``ε_t ∝ √cells_t``, ``Σ ε_t = ε_m``.
      Under ``noise="gaussian"`` (zCDP, :func:`gaussian_plan`) every column also gets its own
      1-way table on every declared cell: discrete Gaussian, L2 Δ = m per table,
      ``GAUSSIAN_ONE_WAY_SHARE`` = 0.2 of the tables' ρ split ∝ cells^⅔ over them, the families
      the rest; zCDP composition, the tables' ρ still add up to ρ_marginals (H38: no pure-ε
      share pays, docs/privbayes.md "Twelfth session: explicit 1-way tables").

   Privacy: ``ε = ε_s + ε_m`` by sequential composition, pure DP (δ = 0), add/remove-one-unit
   neighbours. Default split ``ε_s = 0.1·ε`` (PrivBayes uses β = 0.3, §6.2; InDif scores are
   in counts, so a smaller share already separates candidates, and measured on Adult at ε = 1
   the marginals gain more from the rest); ``ε_m`` is split over the tables ∝ √cells
   (:func:`split_marginal_budget`).
3. **Fit** (post-processing, :func:`fit_privbayes`, consumes only :class:`NoisyMarginal`):
   mutual consistency of the released tables on their shared 1-way marginals
   (:func:`make_consistent`, inverse-variance weighted means + least-squares projection, as in
   PriView, Qardaji et al. 2014 §4.2), then non-negativity with the total kept
   (:func:`norm_sub`, PrivSyn's Norm-Sub), then each column's 1-way estimate as the
   inverse-variance weighted mean of its sums over the tables holding it and every table given
   those margins by IPF (``privbayes_model._one_way_estimates``, ``_with_margins``; issue 18), then
   conditionals ``P(X | Π)`` shrunk toward ``P(X)`` in parent cells with little mass
   (:func:`conditional_from_table`).
4. **Sample** (post-processing): ancestral sampling, vectorized, in parallel shards via
   :class:`~beamsynth.transforms.synthesis.SampleSynthetic` (:meth:`PrivBayesModel.sample_codes`).
   Default ``sampling="balanced"``: within each shard, the rows sharing a parent cell get their
   child values by systematic sampling (random order, uniforms ``(j + U)/n_cell``), so each
   conditional's realized counts are its expected counts ±1 instead of a multinomial draw; every
   row is still marginally drawn from ``P(X | Π)`` and the child stays independent of the
   non-parent columns given the parents. It reads only the fitted model (post-processing), and
   removes part of the synthetic sample's own sampling error (Adult, ε = 1: see
   ``docs/privbayes.md``). ``sampling="iid"`` is plain i.i.d. ancestral sampling.

**Refinement** (default on, :mod:`beamsynth.transforms.refine`; ``refine_pairs=0`` turns it off):
after step 2b, inside the same measurement step, the network fitted from the released tables
(post-processing) is refined with ``refine_pairs`` coarsened 2-way marginals chosen privately in
rounds (permute-and-flip on the current model's L1 error, Δ = m) and released with discrete
Laplace; sampling then rakes a pool drawn from the network to them
(:class:`~beamsynth.transforms.refine.RefinedModel`). Its ε (``refine_fraction`` of the method's,
default 0.25) is taken before the network's split, so the total stays the method's ε by
sequential composition; the network then defaults to k = 1 (:data:`DEFAULT_REFINED_DEGREE`).

**Model size** (``sizing="auto"``, the default of ``--method privbayes``; issue 18): the degree is
the largest ``k`` whose typical family is θ-useful for ``n̂·ε`` (:func:`choose_network_degree`,
:data:`NETWORK_THETA`), down to ``k = 0``: every column's 1-way table plus a private forest of
the 2-way tables that are θ-useful at that size (:func:`plan_forest`, :func:`choose_forest`)
when its structure steps can single out a strongly dependent pair
(:func:`~beamsynth.transforms.privbayes_sizing.forest_resolves`), or else the independent model (every column's 1-way table with
the whole ε, ∝ √cells). ``n̂`` is
the public input size ``rows`` (``--input-rows``; decided at build time) or a DP count spent in the measurement step
(:data:`SIZE_COUNT_FRACTION` of ε); the decision is post-processing and the ε split is fixed at
build time (``docs/privbayes.md`` "Model size from n̂·ε").

Modules (this one re-exports their public names, ``__all__``, and the tuning constants outside
it; import from here in user code):

* :mod:`~beamsynth.transforms.privbayes_structure` — InDif scores, candidate families, the greedy
  k-degree network by permute-and-flip (Beam-free);
* :mod:`~beamsynth.transforms.privbayes_sizing` — model size from ``n̂·ε``, the small-input forest
  model, ``split_marginal_budget`` (Beam-free);
* :mod:`~beamsynth.transforms.privbayes_star` — the small-input star around a declared
  prediction target (``target``; issue 18, Beam-free);
* :mod:`~beamsynth.transforms.privbayes_plan` — the build-time plans (Laplace, zCDP) and their
  spends on the accountant;
* :mod:`~beamsynth.transforms.privbayes_model` — the fit (consistency, Norm-Sub, weighted margins,
  conditionals) and :class:`PrivBayesModel`'s sampling (post-processing, Beam-free;
  ``ONE_WAY_ESTIMATE`` is read there);
* :mod:`~beamsynth.transforms.privbayes_measure` — :func:`measure_privbayes`, the only step that
  reads exact counts, and :class:`PrivBayesMeasureFn`;
* :mod:`~beamsynth.transforms.privbayes_beam` — the PTransforms :class:`DPPrivBayes` and
  :class:`PrivBayesSynthesizer`.
"""

from __future__ import annotations

from beamsynth.transforms.consistency import norm_sub
from beamsynth.transforms.privbayes_beam import (
    DPPrivBayes,
    PrivBayesSynthesizer,
    ordered_columns,
)
from beamsynth.transforms.privbayes_measure import (
    SIZING_METRICS_NAMESPACE as SIZING_METRICS_NAMESPACE,
)
from beamsynth.transforms.privbayes_measure import (
    PrivBayesMeasureFn,
    PrivBayesMeasurement,
    measure_privbayes,
)
from beamsynth.transforms.privbayes_model import (
    DEFAULT_SAMPLING,
    DEFAULT_SHRINK,
    SAMPLING_MODES,
    PrivBayesModel,
    balanced_uniforms,
    conditional_from_table,
    fit_privbayes,
    make_consistent,
)
from beamsynth.transforms.privbayes_model import MARGIN_SWEEPS as MARGIN_SWEEPS
from beamsynth.transforms.privbayes_model import (
    NETWORK_TARGET_MAX_CELLS as NETWORK_TARGET_MAX_CELLS,
)
from beamsynth.transforms.privbayes_model import ONE_WAY_ESTIMATE as ONE_WAY_ESTIMATE
from beamsynth.transforms.privbayes_plan import (
    AUTO_EXACT_MAX_COLUMNS,
    AUTO_EXACT_MIN_TABLE_EPSILON,
    DEFAULT_DEGREE,
    DEFAULT_REFINED_DEGREE,
    DEFAULT_STRUCTURE_FRACTION,
    GAUSSIAN_REFINE_GROUPS,
    GAUSSIAN_REFINE_PAIRS,
    GAUSSIAN_SHARES,
    MAX_CANDIDATE_CELLS,
    NOISE_MODES,
    PARENT_MODES,
    SIZING_MODES,
    PrivBayesPlan,
    ZCDPPlan,
    gaussian_plan,
    plan_privbayes,
    spend_privbayes,
    spend_zcdp,
)
from beamsynth.transforms.privbayes_plan import (
    GAUSSIAN_REFINE_MIN_TABLE_RHO as GAUSSIAN_REFINE_MIN_TABLE_RHO,
)
from beamsynth.transforms.privbayes_sizing import (
    FOREST_ONE_WAY_FRACTION,
    FOREST_SCORE,
    FOREST_STRUCTURE_FRACTION,
    FOREST_THETA,
    NETWORK_THETA,
    SIZE_COUNT_FRACTION,
    SIZING_THETA,
    SPLIT_CELLS_CAP,
    ForestPlan,
    NetworkSizing,
    choose_forest,
    choose_network_degree,
    margin_score,
    network_usefulness,
    plan_forest,
    split_marginal_budget,
)
from beamsynth.transforms.privbayes_sizing import SIZING_CELLS_CAP as SIZING_CELLS_CAP
from beamsynth.transforms.privbayes_star import (
    STAR_THETA,
    StarPlan,
    measure_star,
    plan_star,
    resolve_target,
    star_specs,
    star_wording,
)
from beamsynth.transforms.privbayes_structure import (
    INDIF_SENSITIVITY,
    MAX_FAMILY_CELLS,
    candidate_families,
    choose_structure,
    family_cells,
    family_specs,
    indif_score,
    marginalize,
)

__all__ = [
    "DEFAULT_DEGREE",
    "DEFAULT_REFINED_DEGREE",
    "DEFAULT_SAMPLING",
    "DEFAULT_SHRINK",
    "DEFAULT_STRUCTURE_FRACTION",
    "INDIF_SENSITIVITY",
    "SIZE_COUNT_FRACTION",
    "SIZING_MODES",
    "SIZING_THETA",
    "NetworkSizing",
    "FOREST_ONE_WAY_FRACTION",
    "FOREST_SCORE",
    "FOREST_STRUCTURE_FRACTION",
    "FOREST_THETA",
    "NETWORK_THETA",
    "ForestPlan",
    "plan_forest",
    "choose_forest",
    "margin_score",
    "network_usefulness",
    "choose_network_degree",
    "MAX_CANDIDATE_CELLS",
    "MAX_FAMILY_CELLS",
    "SPLIT_CELLS_CAP",
    "DPPrivBayes",
    "PrivBayesMeasureFn",
    "PrivBayesMeasurement",
    "PrivBayesModel",
    "PrivBayesPlan",
    "PrivBayesSynthesizer",
    "SAMPLING_MODES",
    "PARENT_MODES",
    "AUTO_EXACT_MAX_COLUMNS",
    "AUTO_EXACT_MIN_TABLE_EPSILON",
    "balanced_uniforms",
    "candidate_families",
    "family_cells",
    "choose_structure",
    "conditional_from_table",
    "fit_privbayes",
    "indif_score",
    "make_consistent",
    "measure_privbayes",
    "family_specs",
    "spend_privbayes",
    "GAUSSIAN_REFINE_GROUPS",
    "GAUSSIAN_REFINE_PAIRS",
    "GAUSSIAN_SHARES",
    "NOISE_MODES",
    "ZCDPPlan",
    "gaussian_plan",
    "spend_zcdp",
    "split_marginal_budget",
    "marginalize",
    "norm_sub",
    "ordered_columns",
    "plan_privbayes",
    "STAR_THETA",
    "StarPlan",
    "measure_star",
    "plan_star",
    "resolve_target",
    "star_specs",
    "star_wording",
]
