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
   those margins by IPF (:func:`_one_way_estimates`, :func:`_with_margins`; issue 18), then
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
the 2-way tables that are θ-useful at that size (:func:`plan_forest`, :func:`choose_forest`),
or, with none, the independent model (every column's 1-way table with the whole ε). ``n̂`` is
the public input size ``rows`` (``--input-rows``; decided at build time) or a DP count spent in the measurement step
(:data:`SIZE_COUNT_FRACTION` of ε); the decision is post-processing and the ε split is fixed at
build time (``docs/privbayes.md`` "Model size from n̂·ε").
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from beamsynth.schemas.schema import EncodedBatch, Schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP, zcdp_approx, zcdp_rho
from beamsynth.transforms.consistency import norm_sub
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import (
    MarginalCountsCombineFn,
    NoisyMarginal,
    combine_globally,
    gaussian_marginals,
    noisy_marginals,
    window_labels,
)
from beamsynth.transforms.noise import (
    RandomSource,
    discrete_laplace,
    discrete_laplace_scale,
    permute_and_flip,
    run_seed,
)
from beamsynth.transforms.refine import (
    DEFAULT_REFINE_FRACTION,
    DEFAULT_REFINE_GROUPS,
    DEFAULT_REFINE_PAIRS,
    DEFAULT_REFINE_ROUNDS,
    REFINE_MIN_PAIRS,
    REFINE_MIN_TABLE_EPSILON,
    SELECTION_SHARE,
    RakeTarget,
    RefinedModel,
    RefineMeasurement,
    RefinePlan,
    measure_refinement,
    plan_refinement,
    smoothed_proportions,
    spend_refinement,
)
from beamsynth.transforms.synthesis import DPCount, SampleSynthetic, SynthesisModel

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
    "FOREST_STRUCTURE_FRACTION",
    "FOREST_THETA",
    "NETWORK_THETA",
    "ForestPlan",
    "plan_forest",
    "forest_zcdp_epsilon",
    "choose_forest",
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
]

DEFAULT_DEGREE = 2  # parents per column without the refinement
DEFAULT_REFINED_DEGREE = 1  # ... and with it (the refinement adds the pairs a tree misses)
DEFAULT_STRUCTURE_FRACTION = 0.1
DEFAULT_SHRINK = 0.1
SAMPLING_MODES = ("balanced", "iid")
PARENT_MODES = ("auto", "adaptive", "exact")
AUTO_EXACT_MAX_COLUMNS = 16  # "auto": exact k-subsets only for schemas this narrow ...
AUTO_EXACT_MIN_TABLE_EPSILON = 0.05  # ... and at least this much ε per table and unit (docs/privbayes.md)
DEFAULT_SAMPLING = "balanced"
INDIF_SENSITIVITY = 4.0  # per record, add/remove neighbours (see indif_score)
MAX_CANDIDATE_CELLS = 16_000_000  # exact candidate counts kept in one accumulator
MAX_FAMILY_CELLS = 2_000_000  # a larger (X, Π) table is never a candidate (declared cells)
SIZING_MODES = ("auto", "off")
NOISE_MODES = ("laplace", "gaussian")
# noise="gaussian" (zCDP, issue 18): shares of ρ and refinement size (docs/privbayes.md "zCDP")
GAUSSIAN_SHARES = {"structure": 0.03, "marginals": 0.45, "selection": 0.10, "measure": 0.42}
GAUSSIAN_REFINE_PAIRS = 40
GAUSSIAN_REFINE_GROUPS = 8
GAUSSIAN_REFINE_MIN_TABLE_RHO = 2.5e-5  # σ ≤ 141: the std of the Laplace rule's b = 100 tables
SIZING_THETA = 2.5  # usefulness a k-parent family needs (docs/privbayes.md "Model size from n̂·ε")
SIZE_COUNT_FRACTION = 0.02  # share of ε for n̂ when no public row count is given
SIZING_METRICS_NAMESPACE = "beamsynth"
SIZING_CELLS_CAP = 1_000  # a column counts with at most this many cells in the typical family
FOREST_ONE_WAY_FRACTION = 0.8  # small inputs: share of ε on every column's 1-way table ...
FOREST_STRUCTURE_FRACTION = 0.1  # ... on choosing the forest's edges (the rest: its 2-way tables)
FOREST_THETA = 4.0  # usefulness a forest edge's 2-way table needs (n̂·ε_t/(m·cells))
NETWORK_THETA = 4.5  # PrivBayes keeps a k = 1 network from here (below: the forest model)


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
                       max_family_cells: int | None = None) -> list[tuple[int, ...]]:
    """The column subsets whose exact counts cover every candidate family.

    Without ``shape``: all ``(degree+1)``-column subsets (all columns if there are fewer). With
    ``shape`` and ``max_family_cells`` (both declared, so the list is data-independent): the
    ``(degree+1)``-subsets of at most ``max_family_cells`` cells, then, size by size down to
    single columns, every smaller subset within the limit that no listed subset contains. A
    family larger than the limit is never a candidate (:func:`choose_structure`), so one
    huge-domain column (a declared integer range of 10^6 values) does not force ``degree`` down
    for every other column.
    """
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
            top = min(degree, len(placed))
            for size in range(top, -1, -1):
                fits = [ps for ps in itertools.combinations(sorted(placed), size)
                        if max_family_cells is None or size == 0
                        or family_cells(shape, (x, *ps)) <= max_family_cells]
                for parents in fits:
                    key = (x, parents)
                    if key not in scored:
                        cells = family_cells(shape, (x, *parents))
                        gain = indif_score(sub((x, *parents)).reshape(shape[x], -1)) if parents else 0.0
                        scored[key] = gain - cells * noise_scale
                    cands.append(key)
                    scores.append(scored[key])
                if exact_degree and fits:
                    break
        pick = permute_and_flip(rs.child("step", step), np.asarray(scores),
                                epsilon=epsilon, sensitivity=sensitivity)
        order.append(cands[pick])
        placed.append(cands[pick][0])
    return order


def family_specs(structure: Sequence[tuple[int, tuple[int, ...]]]) -> list[tuple[int, ...]]:
    """Tables to release for a structure: ``(X, *Π)`` per attribute with parents, plus 1-way
    tables for parentless attributes that appear in no other family."""
    fams = [(x, *ps) for x, ps in structure if ps]
    covered = {c for f in fams for c in f}
    singles = [(x,) for x, ps in structure if not ps and x not in covered]
    return singles + fams


# -- model size from n̂ and ε ---------------------------------------------------------------------
def network_usefulness(rows: float, epsilon: float, shape: Sequence[int], degree: int, *,
                       max_contributions: int = 1) -> float:
    """θ-usefulness of a typical ``degree``-parent family (PrivBayes §4.4, in count units).

    ``rows·ε / (d·m·g^(k+1))``: the signal per cell of a ``(k+1)``-way table, ``rows/g^(k+1)``
    (``g`` = geometric mean of the declared column sizes, each capped at
    :data:`SIZING_CELLS_CAP`), over the discrete Laplace scale ``m·d/ε`` a table gets when ``ε``
    is split evenly over the ``d`` tables of the network. A pure function of public values:
    ``rows`` is a public row count or a DP estimate (post-processing), the rest is declared.
    """
    d = max(1, len(shape))
    g = math.exp(float(np.mean(np.log(np.minimum(np.asarray(shape, dtype=np.float64),
                                                 SIZING_CELLS_CAP)))))
    return max(float(rows), 0.0) * float(epsilon) / (d * max_contributions * g ** (degree + 1))


def choose_network_degree(rows: float, epsilon: float, shape: Sequence[int], *, max_degree: int,
                          max_contributions: int = 1, theta: float = SIZING_THETA) -> int:
    """The largest ``k ≤ max_degree`` whose families are θ-useful
    (:func:`network_usefulness` ``≥ theta``), else 0: the independent model.

    AIM-style budget-aware sizing (McKenna et al. 2022 §4: a marginal is worth measuring only if
    its noise per cell is small against ``n̂/cells``), with PrivBayes' θ-usefulness as the rule
    (Zhang et al. §4.4, θ = 4 there). ``theta`` (:data:`SIZING_THETA`) is calibrated on Adult
    subsamples (docs/privbayes.md "Model size from n̂·ε"). Monotone in ``rows·ε``; one column
    has nothing to condition on (0).
    """
    if len(shape) < 2:
        return 0
    for k in range(int(max_degree), 0, -1):
        if network_usefulness(rows, epsilon, shape, k, max_contributions=max_contributions) >= theta:
            return k
    return 0


@dataclass(frozen=True)
class NetworkSizing:
    """How the network's size is chosen: from a public row count ``rows`` at build time, or from
    a DP count (``count_budget``, discrete Laplace, Δ = m) in the measurement step. ``epsilon`` is
    the model's total ε, the one the rule (:func:`choose_network_degree`) weighs n̂ against."""

    epsilon: float
    max_degree: int
    shape: tuple[int, ...]
    max_contributions: int = 1
    rows: int | None = None
    count_budget: PureDP | None = None
    theta: float = NETWORK_THETA

    def degree(self, rows_hat: float) -> int:
        """The degree for an estimate ``rows_hat`` (public or DP: post-processing)."""
        return choose_network_degree(rows_hat, self.epsilon, self.shape, max_degree=self.max_degree,
                                     max_contributions=self.max_contributions, theta=self.theta)

    def details(self) -> dict[str, Any]:
        """Manifest details: the rule, where n̂ comes from, and (public rows) the decision."""
        out: dict[str, Any] = {
            "rule": "largest k <= max_degree with n̂·ε/(d·m·g^(k+1)) >= theta, else 0 = every "
                    "1-way table + a forest of θ-useful pairs (plan_forest), or with no such pair "
                    "independent 1-way marginals with the whole ε (AIM-style sizing, PrivBayes "
                    "θ-usefulness)",
            "theta": self.theta, "max_degree": self.max_degree, "epsilon": self.epsilon,
            "rows_source": "public --input-rows" if self.rows is not None
            else "DP count in the measurement step (discrete Laplace, Δ = m)"}
        if self.count_budget is not None:
            out["count_epsilon"] = self.count_budget.epsilon
        if self.rows is not None:
            k = self.degree(self.rows)
            out.update(rows=self.rows, chosen_degree=k,
                       usefulness_k1=network_usefulness(self.rows, self.epsilon, self.shape, 1,
                                                        max_contributions=self.max_contributions),
                       chosen="1-way tables + forest of affordable pairs (plan 'forest'; "
                              "none affordable: independent 1-way marginals)" if k == 0
                       else f"network with {k} parent(s) per column")
        return out


# -- the small-input model: 1-way tables + a budget-aware forest -----------------------------------
@dataclass(frozen=True)
class ForestPlan:
    """The model where a network is not θ-useful (issue 18): every column's 1-way table plus a
    forest of at most ``steps`` edges among the **affordable** pairs (declared 2-way tables of at
    most ``max_pair_cells`` cells), each edge chosen by permute-and-flip, each chosen edge's
    2-way table released. Data-independent (from n̂, ε and the declared shape)."""

    steps: int
    max_pair_cells: int
    structure_budget: PureDP | None  # None with no step (no affordable pair)
    one_way_budget: PureDP
    pair_budget: PureDP | None
    max_contributions: int = 1
    rows: float = 0.0
    theta: float = FOREST_THETA

    @property
    def step_epsilon(self) -> float:
        """Permute-and-flip budget of each edge step."""
        return 0.0 if self.structure_budget is None else self.structure_budget.epsilon / self.steps

    @property
    def pair_scale(self) -> float:
        """Discrete Laplace scale of an edge table when ``steps`` tables share the pair budget
        evenly (the penalty's data-independent scale)."""
        if self.pair_budget is None:
            return math.inf
        return discrete_laplace_scale(sensitivity=self.max_contributions,
                                      epsilon=self.pair_budget.epsilon / self.steps)

    def details(self) -> dict[str, Any]:
        """Manifest details."""
        return {"model": "1-way tables + forest of affordable 2-way tables", "steps": self.steps,
                "max_pair_cells": self.max_pair_cells, "theta": self.theta,
                "structure_epsilon": self.step_epsilon * self.steps,
                "epsilon_per_step": self.step_epsilon,
                "one_way_epsilon": self.one_way_budget.epsilon,
                "pair_epsilon": 0.0 if self.pair_budget is None else self.pair_budget.epsilon,
                "score": "InDif − cells·b (permute-and-flip; a 'no edge' candidate scores 0)"}


def _forest_edges(pairs: Sequence[tuple[int, int]], d: int) -> int:
    """Size of a spanning forest of the graph ``pairs`` on ``d`` columns."""
    root = list(range(d))

    def find(x: int) -> int:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    edges = 0
    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            root[ra], edges = rb, edges + 1
    return edges


def plan_forest(rows: float, epsilon: float, shape: Sequence[int], *, max_contributions: int = 1,
                one_way_fraction: float = FOREST_ONE_WAY_FRACTION,
                structure_fraction: float = FOREST_STRUCTURE_FRACTION,
                theta: float = FOREST_THETA,
                max_family_cells: int = MAX_FAMILY_CELLS) -> ForestPlan:
    """Size the small-input model from public values only (``rows`` public or a DP count).

    ``ε`` is split into ``one_way_fraction`` (every column's 1-way table), ``structure_fraction``
    (the edge steps) and the rest (the edges' 2-way tables). With ``r`` edges sharing the pair
    budget evenly, a pair is affordable when its table is θ-useful,
    ``rows·(ε_pairs/r)/(m·cells) ≥ theta`` (PrivBayes §4.4's usefulness per table, the rule of
    :func:`network_usefulness` for one declared pair); ``steps`` is the largest ``r ≤ d−1``
    whose affordable pairs hold a forest of ``r`` edges (0: no pair is affordable, the model is
    the independent one and gets the whole ε on its 1-way tables).
    """
    shape = [int(c) for c in shape]
    d, m = len(shape), int(max_contributions)
    eps_s, eps_1 = epsilon * structure_fraction, epsilon * one_way_fraction
    eps_2 = epsilon - eps_s - eps_1
    pairs = list(itertools.combinations(range(d), 2))

    def cap(r: int) -> int:
        return int(min(max(float(rows), 0.0) * eps_2 / r / (m * theta), max_family_cells))

    steps = 0
    for r in range(d - 1, 0, -1):
        if _forest_edges([(a, b) for a, b in pairs if shape[a] * shape[b] <= cap(r)], d) >= r:
            steps = r
            break
    if steps == 0:
        return ForestPlan(0, 0, None, PureDP(epsilon=float(epsilon)), None, m, float(rows), theta)
    return ForestPlan(steps, cap(steps), PureDP(epsilon=eps_s), PureDP(epsilon=eps_1),
                      PureDP(epsilon=eps_2), m, float(rows), theta)


def forest_zcdp_epsilon(rho: float, shape: Sequence[int], *,
                        one_way_fraction: float = FOREST_ONE_WAY_FRACTION,
                        structure_fraction: float = FOREST_STRUCTURE_FRACTION) -> float:
    """The total pure ε ``E`` of a forest plan (:func:`plan_forest`) whose parts cost at most
    ``rho`` in zCDP: the run-time small-input fallback of a ``noise="gaussian"`` plan.

    Each part is pure DP and an ε-DP part is ``ε²/2``-zCDP (Bun & Steinke 2016, Prop. 1.4); zCDP
    parts add up. With ``E`` split as in :func:`plan_forest` and :func:`_measure_forest`: the
    structure's ``r`` steps of ``ε_s/r`` cost ``≤ ε_s²/2``; the 1-way tables (ε ∝ √cells,
    :func:`split_marginal_budget`, weights ``w``) cost ``ε_1²·Σw²/2``; the edge tables cost
    ``≤ ε_2²/2`` (one table is the worst split); with no edge chosen the 1-way tables get
    ``ε_1 + ε_2``. So the cost is at most ``E²·c`` with
    ``c = (f_s² + max(f_1²·Σw² + f_2², (f_1 + f_2)²·Σw²))/2`` and ``E = √(ρ/c)``. The network's
    ``_planned_epsilon`` of a zCDP plan is a sum of Laplace-*equivalent* ε (same noise std as
    the Gaussian tables), not budget: spent as pure ε it cost up to 7× the planned ρ (Adult,
    ε = 1, δ = 1e-9: ρ 0.109 against 0.0148).
    """
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho ({rho!r}) must be a finite number > 0")
    w = np.sqrt(np.minimum(np.asarray(shape, dtype=np.float64), SPLIT_CELLS_CAP))
    sq = float(((w / w.sum()) ** 2).sum())
    f_s, f_1 = float(structure_fraction), float(one_way_fraction)
    f_2 = 1.0 - f_s - f_1
    c = (f_s ** 2 + max(f_1 ** 2 * sq + f_2 ** 2, (f_1 + f_2) ** 2 * sq)) / 2
    return math.sqrt(rho / c)


def choose_forest(tables: dict[tuple[int, ...], np.ndarray], shape: Sequence[int], *,
                  plan: ForestPlan, rs: RandomSource) -> list[tuple[int, tuple[int, ...]]]:
    """Private forest over the affordable pairs (the small-input model's structure).

    ``plan.steps`` steps; each picks by permute-and-flip (``plan.step_epsilon``, sensitivity
    ``4m``: :func:`indif_score`) one pair joining two trees of the forest so far, scored
    ``InDif(a, b) − cells(a, b)·b`` (``b`` = :attr:`ForestPlan.pair_scale`, data-independent), or
    the 'no edge' candidate of score 0 (a constant: it adds no sensitivity). Each step is
    ``step_epsilon``-DP, the structure ``steps·step_epsilon``-DP by sequential composition (the
    candidate set of a step depends only on earlier outputs). The forest is oriented from its
    lowest-numbered column of each tree (post-processing). Returns ``[(column, parents), ...]``
    in sampling order.
    """
    d = len(shape)
    cands = [(a, b) for a, b in itertools.combinations(range(d), 2)
             if shape[a] * shape[b] <= plan.max_pair_cells]
    scores = {p: indif_score(_family_table(tables, p)) - family_cells(shape, p) * plan.pair_scale
              for p in cands}
    root = list(range(d))

    def find(x: int) -> int:
        while root[x] != x:
            x = root[x]
        return x

    edges: list[tuple[int, int]] = []
    for step in range(plan.steps):
        open_pairs = [p for p in cands if find(p[0]) != find(p[1])]
        if not open_pairs:
            break
        pick = permute_and_flip(rs.child("edge", step),
                                np.asarray([scores[p] for p in open_pairs] + [0.0]),
                                epsilon=plan.step_epsilon,
                                sensitivity=INDIF_SENSITIVITY * plan.max_contributions)
        if pick < len(open_pairs):
            a, b = open_pairs[pick]
            edges.append((a, b))
            root[find(a)] = find(b)
    adjacent: dict[int, list[int]] = {c: [] for c in range(d)}
    for a, b in edges:
        adjacent[a].append(b)
        adjacent[b].append(a)
    seen: set[int] = set()
    order: list[tuple[int, tuple[int, ...]]] = []
    for top in range(d):
        if top in seen:
            continue
        seen.add(top)
        order.append((top, ()))
        queue = [top]
        while queue:
            u = queue.pop(0)
            for v in sorted(adjacent[u]):
                if v not in seen:
                    seen.add(v)
                    order.append((v, (u,)))
                    queue.append(v)
    return order


# -- budget plan ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ZCDPPlan:
    """zCDP accounting of a ``noise="gaussian"`` run: the method's (ε, δ) converted to ρ
    (:func:`~beamsynth.transforms.budget.zcdp_rho`, Canonne-Kamath-Steinke 2020 Cor. 13) and its
    split. Pure-DP parts (the DP size count, each permute-and-flip step) cost ``ε²/2`` each (Bun
    & Steinke 2016, Prop. 1.4); a discrete Gaussian table of L2 sensitivity ``m`` costs
    ``m²/(2σ²)`` (CKS 2020 Thm. 4); the parts add up (zCDP composition, adaptive)."""

    budget: ApproxDP
    rho: float
    count_rho: float
    structure_rho: float
    marginal_rho: float
    selection_rho: float
    measure_rho: float

    @property
    def spent_rho(self) -> float:
        return (self.count_rho + self.structure_rho + self.marginal_rho + self.selection_rho
                + self.measure_rho)

    def details(self) -> dict[str, Any]:
        """Manifest details."""
        return {"accounting": "zCDP, converted to (ε, δ) by Canonne-Kamath-Steinke 2020 Cor. 13",
                "epsilon": self.budget.epsilon, "delta": self.budget.delta, "rho": self.rho,
                "rho_size_count": self.count_rho, "rho_structure": self.structure_rho,
                "rho_marginals": self.marginal_rho, "rho_refine_selection": self.selection_rho,
                "rho_refine_marginals": self.measure_rho, "rho_spent": self.spent_rho}


@dataclass(frozen=True)
class PrivBayesPlan:
    """Data-independent parameters of one PrivBayes run (fixed when the pipeline is built)."""

    degree: int
    structure_budget: PureDP | None
    marginal_budget: PureDP
    n_columns: int
    max_contributions: int
    penalty: float = 1.0
    max_family_cells: int = MAX_FAMILY_CELLS
    exact_degree: bool = False
    refine: RefinePlan | None = None
    sizing: NetworkSizing | None = None
    zcdp: ZCDPPlan | None = None  # noise="gaussian" (gaussian_plan): zCDP accounting
    forest: ForestPlan | None = None  # the small-input model (public rows, network not useful)

    @property
    def step_epsilon(self) -> float:
        """Exponential-mechanism budget of each of the ``d−1`` structure steps."""
        if self.structure_budget is None:
            return 0.0
        return self.structure_budget.epsilon / max(1, self.n_columns - 1)

    @property
    def score_sensitivity(self) -> float:
        """InDif sensitivity for ``max_contributions`` records per unit."""
        return INDIF_SENSITIVITY * self.max_contributions

    @property
    def max_tables(self) -> int:
        """Upper bound on the number of released tables (one per column)."""
        return self.n_columns

    def table_scale(self, tables: int) -> float:
        """Discrete Laplace scale per cell when the marginal budget is split over ``tables``."""
        return discrete_laplace_scale(sensitivity=self.max_contributions,
                                      epsilon=self.marginal_budget.epsilon / tables)

    def details(self) -> dict[str, Any]:
        """Manifest details."""
        return {
            "degree": self.degree,
            "structure_epsilon": 0.0 if self.structure_budget is None else self.structure_budget.epsilon,
            "structure_steps": max(0, self.n_columns - 1),
            "epsilon_per_step": self.step_epsilon,
            "score": "InDif − cells·b (permute-and-flip)",
            "score_sensitivity": self.score_sensitivity,
            "marginal_epsilon": self.marginal_budget.epsilon,
            "max_tables": self.max_tables,
            "max_family_cells": self.max_family_cells,
            "parent_sets": "exact k" if self.exact_degree else "any size ≤ k",
            "refine": None if self.refine is None else self.refine.details(),
            "sizing": None if self.sizing is None
            else self.sizing.details(),
            **({} if self.zcdp is None else {"noise": "discrete Gaussian", "zcdp": self.zcdp.details()}),
            "forest": None if self.forest is None else self.forest.details(),
        }


def plan_privbayes(
    shape: Sequence[int],
    budget: ApproxDP,
    *,
    degree: int | None = None,
    structure_fraction: float = DEFAULT_STRUCTURE_FRACTION,
    max_contributions: int = 1,
    max_candidate_cells: int = MAX_CANDIDATE_CELLS,
    max_family_cells: int = MAX_FAMILY_CELLS,
    parents: str = "auto",
    names: Sequence[str] | None = None,
    refine_pairs: int = DEFAULT_REFINE_PAIRS,
    refine_rounds: int = DEFAULT_REFINE_ROUNDS,
    refine_groups: int = DEFAULT_REFINE_GROUPS,
    refine_fraction: float = DEFAULT_REFINE_FRACTION,
    sizing: str = "off",
    rows: int | None = None,
) -> PrivBayesPlan:
    """Validate parameters and split the budget; lowers ``degree`` (from the declared shape
    only) until the counts of all candidate families (each at most ``max_family_cells`` cells,
    :func:`candidate_families`) fit in ``max_candidate_cells``.

    ``parents``: ``"adaptive"`` offers parent sets of any size ≤ k (the noise penalty decides),
    ``"exact"`` only k-subsets (PrivBayes Alg. 4), ``"auto"`` (default) exact when the schema has
    at most :data:`AUTO_EXACT_MAX_COLUMNS` declared columns **and** the marginal budget per table
    and unit, ``ε_m/(d·m)``, is at least :data:`AUTO_EXACT_MIN_TABLE_EPSILON`, adaptive otherwise
    — a choice from declared quantities only. Measured (TVD2/TVD3): Adult (15 columns) at ε = 1,
    Beam-free harness, exact 0.0435/0.0869 vs adaptive 0.0444/0.0889 and GBM accuracy/AUC
    0.839/0.883 vs 0.827/0.863 (12–16 seeds), at ε = 2 0.0382/0.0789 vs 0.0408/0.0836; at ε = 0.5
    even (0.0540 vs 0.0537); at ε = 0.1 (benchmark, 3 seeds) exact worse, 0.1177 vs 0.1058. Two
    random 15-column subsets of ACS at ε = 1: even (±0.001 TVD2). ACS (24 columns) at ε = 1:
    exact 0.0727/0.1377 vs adaptive 0.0653/0.1264 (6 seeds), at ε = 2 0.0552 vs 0.0538.

    ``sizing="auto"`` (the default of ``--method privbayes``) lets the model size follow ``n̂·ε``
    (:func:`choose_network_degree`, :class:`NetworkSizing`): with a public input size ``rows``
    (``--input-rows``) the degree is chosen here, at build time (0 = the independent model: no
    structure, no refinement, the whole ε on 1-way marginals); without it
    :data:`SIZE_COUNT_FRACTION` of ε is set aside for a DP count released in the measurement
    step, the split below is the planned network's, and a smaller degree chosen there spends the
    same shares (in the fallback the structure and refinement shares go to the 1-way tables)."""
    if not isinstance(budget, ApproxDP):
        raise TypeError(f"budget must be an ApproxDP/PureDP, got {type(budget).__name__}")
    if degree is not None and (isinstance(degree, bool) or not isinstance(degree, int)
                               or not 0 <= degree <= 8):
        raise ValueError(f"degree ({degree!r}) must be an int in [0, 8]")
    if not isinstance(structure_fraction, (int, float)) or not 0 < structure_fraction < 1:
        raise ValueError(f"structure_fraction ({structure_fraction!r}) must be in (0, 1)")
    if isinstance(max_contributions, bool) or not isinstance(max_contributions, int) or max_contributions < 1:
        raise ValueError(f"max_contributions ({max_contributions!r}) must be an int >= 1")
    if not isinstance(max_candidate_cells, int) or max_candidate_cells < 1:
        raise ValueError(f"max_candidate_cells ({max_candidate_cells!r}) must be an int >= 1")
    if parents not in PARENT_MODES:
        raise ValueError(f"parents ({parents!r}) must be one of {PARENT_MODES}")
    if isinstance(max_family_cells, bool) or not isinstance(max_family_cells, int) or max_family_cells < 1:
        raise ValueError(f"max_family_cells ({max_family_cells!r}) must be an int >= 1")
    if isinstance(refine_pairs, bool) or not isinstance(refine_pairs, int) or refine_pairs < 0:
        raise ValueError(f"refine_pairs ({refine_pairs!r}) must be an int >= 0")
    if not isinstance(refine_fraction, (int, float)) or not 0 < refine_fraction < 1:
        raise ValueError(f"refine_fraction ({refine_fraction!r}) must be in (0, 1)")
    if sizing not in SIZING_MODES:
        raise ValueError(f"sizing ({sizing!r}) must be one of {SIZING_MODES}")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
        raise ValueError(f"rows ({rows!r}) must be None or an int >= 0")
    shape = [int(s) for s in shape]
    model_epsilon, count_budget = budget.epsilon, None
    sized = sizing == "auto" and len(shape) > 1
    if sized and rows is None:  # n̂ from a DP count in the measurement step
        count_budget = PureDP(epsilon=budget.epsilon * SIZE_COUNT_FRACTION)
        budget = PureDP(epsilon=budget.epsilon - count_budget.epsilon)
    if not shape:
        raise ValueError("shape must name at least one column")
    huge = [f"{names[i] if names is not None else i!r} ({c:,} cells)"
            for i, c in enumerate(shape) if c > max_family_cells]
    if huge:
        raise ValueError(
            f"privbayes: column(s) {', '.join(huge)} declare more than {max_family_cells:,} "
            "cells (max_family_cells); declare bins (integer/float `edges`) or a smaller domain, "
            "or use --method independent (open columns go through CatHist)")
    # refinement size, from declared quantities only: pairs with exact counts (every pair within
    # max_family_cells is in a candidate family), and as many tables as get ≥ REFINE_MIN_TABLE_EPSILON
    countable = sum(1 for a, b in itertools.combinations(range(len(shape)), 2)
                    if shape[a] * shape[b] <= max_family_cells)
    refine_budget = PureDP(epsilon=budget.epsilon * float(refine_fraction))
    if refine_pairs > 0:
        # validate the refinement parameters whether or not the refinement ends up used
        plan_refinement(refine_budget, pairs=refine_pairs, rounds=min(refine_rounds, refine_pairs),
                        groups=refine_groups, max_contributions=max_contributions)
    afford = int(refine_budget.epsilon * (1 - SELECTION_SHARE)
                 / (max_contributions * REFINE_MIN_TABLE_EPSILON) + 1e-9)
    pairs = min(refine_pairs, countable, afford)
    if pairs < REFINE_MIN_PAIRS or len(shape) < 2:
        pairs = 0
    if degree is None:
        degree = DEFAULT_REFINED_DEGREE if pairs else DEFAULT_DEGREE
    while degree > 0 and sum(
        family_cells(shape, f) for f in candidate_families(
            len(shape), degree, shape=shape, max_family_cells=max_family_cells)
    ) > max_candidate_cells:
        degree -= 1
    spec = None
    if sized:
        spec = NetworkSizing(epsilon=model_epsilon, max_degree=degree, shape=tuple(shape),
                             max_contributions=max_contributions, rows=rows,
                             count_budget=count_budget)
        if rows is not None:  # public row count: the size is a build-time decision
            degree = spec.degree(rows)
    if sized and rows is not None and degree == 0:
        # not θ-useful as a network: 1-way tables + a forest of affordable pairs (plan_forest),
        # or, if no pair is affordable, the independent model with the whole ε
        forest = plan_forest(rows, budget.epsilon, shape, max_contributions=max_contributions,
                             max_family_cells=max_family_cells)
        if forest.steps > 0:
            return PrivBayesPlan(
                degree=1, structure_budget=forest.structure_budget,
                marginal_budget=forest.pair_budget, n_columns=len(shape),
                max_contributions=max_contributions, max_family_cells=max_family_cells,
                sizing=spec, forest=forest)
    refine = None
    network = budget.epsilon
    if pairs and degree > 0:
        refine = plan_refinement(refine_budget, pairs=pairs, rounds=min(refine_rounds, pairs),
                                 groups=refine_groups, max_contributions=max_contributions)
        network = budget.epsilon - refine.selection_budget.epsilon - refine.measure_budget.epsilon
    if len(shape) == 1 or degree == 0:  # nothing to choose: all of it on the 1-way tables
        structure, rest = 0.0, network
    else:
        structure = network * float(structure_fraction)
        rest = network - structure
    return PrivBayesPlan(
        degree=degree,
        structure_budget=PureDP(epsilon=structure) if structure > 0 else None,
        marginal_budget=PureDP(epsilon=rest),
        n_columns=len(shape),
        max_contributions=max_contributions,
        max_family_cells=max_family_cells,
        exact_degree=parents == "exact" or (
            parents == "auto" and len(shape) <= AUTO_EXACT_MAX_COLUMNS
            and rest / (len(shape) * max_contributions) >= AUTO_EXACT_MIN_TABLE_EPSILON),
        refine=refine,
        sizing=spec,
    )


def gaussian_plan(plan: PrivBayesPlan, budget: ApproxDP, *, pairs: int = GAUSSIAN_REFINE_PAIRS,
                  rounds: int = DEFAULT_REFINE_ROUNDS,
                  groups: int = GAUSSIAN_REFINE_GROUPS) -> PrivBayesPlan:
    """The zCDP variant of a network ``plan`` (``noise="gaussian"``, issue 18: AIM's accounting).

    ``budget`` (δ > 0) becomes ``ρ = zcdp_rho(ε, δ)``; the DP size count (if planned) keeps its
    pure ε and costs ``ε_c²/2``; the rest is split by :data:`GAUSSIAN_SHARES`: the structure's
    ``d−1`` permute-and-flip steps (``ε_step = √(2ρ_s/(d−1))``, same scores and Δ = 4m), the
    network's tables (discrete Gaussian, ρ split ∝ cells^⅔, :func:`_release_tables`), the
    refinement's picks (``ε_pick = √(2ρ_sel/pairs)``, Δ = m) and its ``pairs`` coarse tables
    (discrete Gaussian, ``σ = m/√(2ρ_meas/pairs)``). Under add/remove of one unit of ≤ m records
    a table's L2 sensitivity is ≤ its L1 sensitivity m. The degree, sizing and structure rules
    are the Laplace plan's; ``marginal_budget`` and the refinement's ``measure_budget`` become the
    Laplace-equivalent ε (same noise std), used only for data-independent penalties. Plans of
    the small-input models (``forest``/``one_way``, if present) stay pure DP (returned as is).
    """
    if budget.delta <= 0:
        raise ValueError("noise='gaussian' needs delta > 0 (zCDP converted to (ε, δ)); got δ = 0")
    if getattr(plan, "forest", None) is not None or getattr(plan, "one_way_budget", None) is not None:
        return plan
    d, m = plan.n_columns, plan.max_contributions
    rho = zcdp_rho(budget.epsilon, budget.delta)
    count_rho = 0.0
    if plan.sizing is not None and plan.sizing.count_budget is not None:
        count_rho = plan.sizing.count_budget.epsilon ** 2 / 2
    rest = rho - count_rho
    if rest <= 0:
        raise ValueError(f"noise='gaussian': the size count alone exceeds ρ = {rho:.3g}")
    sh = GAUSSIAN_SHARES
    refine = None
    n_pairs = min(pairs, d * (d - 1) // 2, int(sh["measure"] * rest / GAUSSIAN_REFINE_MIN_TABLE_RHO + 1e-9))
    if plan.refine is None or n_pairs < REFINE_MIN_PAIRS or plan.degree == 0 or d < 2:
        n_pairs = 0
    shares = dict(sh)
    if not n_pairs:  # no refinement: its shares go to the network's tables
        shares["marginals"] += shares.pop("selection") + shares.pop("measure")
        shares["selection"] = shares["measure"] = 0.0
    if plan.structure_budget is None:
        shares["marginals"] += shares["structure"]
        shares["structure"] = 0.0
    structure_rho, marginal_rho = shares["structure"] * rest, shares["marginals"] * rest
    selection_rho, measure_rho = shares["selection"] * rest, shares["measure"] * rest
    structure_budget = None
    if structure_rho > 0:
        structure_budget = PureDP(epsilon=math.sqrt(2 * structure_rho / (d - 1)) * (d - 1))
    # Laplace-equivalent ε of the tables (same std: σ = √2·m/ε_t) for the penalties only
    sigma_eq = m / math.sqrt(2 * marginal_rho / plan.max_tables)
    marginal_budget = PureDP(epsilon=plan.max_tables * math.sqrt(2) * m / sigma_eq)
    if n_pairs:
        sigma_r = m / math.sqrt(2 * measure_rho / n_pairs)
        refine = RefinePlan(
            pairs=n_pairs, rounds=min(rounds, n_pairs), groups=groups,
            selection_budget=PureDP(epsilon=math.sqrt(2 * selection_rho / n_pairs) * n_pairs),
            measure_budget=PureDP(epsilon=n_pairs * math.sqrt(2) * m / sigma_r),
            max_contributions=m, sigma=sigma_r, delta=budget.delta)
    zcdp = ZCDPPlan(budget=budget, rho=rho, count_rho=count_rho, structure_rho=structure_rho,
                    marginal_rho=marginal_rho, selection_rho=selection_rho, measure_rho=measure_rho)
    return dataclasses.replace(plan, structure_budget=structure_budget,
                               marginal_budget=marginal_budget, refine=refine, zcdp=zcdp)


def spend_zcdp(accountant: PrivacyAccountant, plan: PrivBayesPlan, prefix: str = "privbayes") -> None:
    """One (ε, δ) spend for a ``noise="gaussian"`` plan: its parts compose in zCDP, not by adding
    ε's, so the manifest lists them (mechanism, ρ, σ or ε per step) in the spend's details."""
    z = plan.zcdp
    parts: dict[str, Any] = {}
    if z.count_rho:
        parts["size_count"] = {"mechanism": "discrete Laplace on the record count (pure ε)",
                               "epsilon": plan.sizing.count_budget.epsilon, "rho": z.count_rho,
                               "sensitivity": plan.max_contributions,
                               "fallback": "no θ-useful network at n̂: the forest model (pure-DP "
                                           "discrete Laplace) with ε = forest_zcdp_epsilon(ρ − "
                                           "ρ_count) (its parts' Σ ε_i²/2 ≤ that ρ), or independent "
                                           "discrete Gaussian 1-way tables with that ρ"}
    if plan.structure_budget is not None:
        parts["structure"] = {"mechanism": "permute-and-flip on InDif − cells·b, greedy network",
                              "steps": plan.n_columns - 1, "epsilon_per_step": plan.step_epsilon,
                              "rho": z.structure_rho, "sensitivity": plan.score_sensitivity}
    parts["marginals"] = {"mechanism": "discrete Gaussian on the chosen (k+1)-way marginals",
                          "rho": z.marginal_rho, "split": "ρ_i ∝ min(cells_i, 10⁴)^⅔",
                          "l2_sensitivity_per_table": plan.max_contributions}
    if plan.refine is not None:
        parts["refine.selection"] = {
            "mechanism": "permute-and-flip on ‖T − M‖₁ − cells·b of coarse 2-way tables",
            "picks": plan.refine.pairs, "epsilon_per_pick": plan.refine.pick_epsilon,
            "rho": z.selection_rho, "sensitivity": plan.max_contributions}
        parts["refine.marginals"] = {
            "mechanism": "discrete Gaussian on the selected coarse 2-way marginals",
            "tables": plan.refine.pairs, "sigma": plan.refine.sigma, "rho": z.measure_rho,
            "groups_per_column": plan.refine.groups,
            "l2_sensitivity_per_table": plan.max_contributions}
    accountant.spend(
        f"{prefix}.zcdp", z.budget,
        mechanism="PrivBayes network + refinement under zCDP (discrete Gaussian tables)",
        details={**z.details(), "parts": parts, "neighbours": "add/remove one privacy unit",
                 "paper": "AIM (McKenna et al. 2022) accounting; discrete Gaussian (Canonne, "
                          "Kamath & Steinke 2020); PrivBayes (Zhang et al. 2014)"})


def spend_privbayes(accountant: PrivacyAccountant, plan: PrivBayesPlan, prefix: str = "privbayes") -> None:
    """Record the spends (size count, structure, marginals, refinement) on ``accountant`` (raises
    if overspent)."""
    if plan.zcdp is not None:
        spend_zcdp(accountant, plan, prefix)
        return
    if plan.sizing is not None and plan.sizing.count_budget is not None:
        accountant.spend(
            f"{prefix}.size_count", plan.sizing.count_budget,
            mechanism="discrete Laplace on the record count (n̂ for the model size)",
            details={"sensitivity": plan.max_contributions,
                     "scale": discrete_laplace_scale(sensitivity=plan.max_contributions,
                                                     epsilon=plan.sizing.count_budget.epsilon),
                     "use": "post-processing: the network degree (choose_network_degree); 0 = "
                            "independent 1-way marginals with the structure/refinement shares",
                     "paper": "AIM budget-aware sizing (McKenna et al. 2022 §4); PrivBayes §4.4"})
    if plan.forest is not None:
        forest = plan.forest
        accountant.spend(
            f"{prefix}.structure", forest.structure_budget,
            mechanism="permute-and-flip on InDif − cells·b over affordable pairs, forest edges",
            details={"steps": forest.steps, "epsilon_per_step": forest.step_epsilon,
                     "max_pair_cells": forest.max_pair_cells, "no_edge_score": 0.0,
                     "sensitivity": INDIF_SENSITIVITY * plan.max_contributions,
                     "neighbours": "add/remove one privacy unit",
                     "paper": "PrivBayes §4.4 θ-usefulness (affordable pairs); InDif score "
                              "(PrivSyn §4); permute-and-flip (McKenna & Sheldon 2020)"})
        accountant.spend(
            f"{prefix}.one_way", forest.one_way_budget,
            mechanism="discrete Laplace on every column's 1-way marginal",
            details={"tables": plan.n_columns, "sensitivity_per_table": plan.max_contributions,
                     "split": "ε_i ∝ √cells_i (split_marginal_budget)",
                     "paper": "consistency with the forest's tables (PriView §4.2) is "
                              "post-processing"})
        accountant.spend(
            f"{prefix}.marginals", forest.pair_budget,
            mechanism="discrete Laplace on the forest's chosen 2-way marginals",
            details={"max_tables": forest.steps, "sensitivity_per_table": plan.max_contributions,
                     "penalty_scale": forest.pair_scale,
                     "split": "ε_i ∝ √cells_i over the chosen edges' tables; with no edge "
                              "chosen, the 1-way tables get this share too",
                     "paper": "PrivBayes §4.2 (noisy conditionals), converted to add/remove counts"})
        return
    if plan.structure_budget is not None:
        accountant.spend(
            f"{prefix}.structure", plan.structure_budget,
            mechanism="permute-and-flip on InDif − cells·b, greedy network",
            details={"steps": plan.n_columns - 1, "epsilon_per_step": plan.step_epsilon,
                     "parent_sets": "exact k" if plan.exact_degree else "any size ≤ k",
                     "sensitivity": plan.score_sensitivity, "degree": plan.degree,
                     "neighbours": "add/remove one privacy unit",
                     "paper": "PrivBayes Alg. 4 (Zhang et al. 2014); InDif score (PrivSyn §4); "
                              "permute-and-flip (McKenna & Sheldon 2020)"},
        )
    accountant.spend(
        f"{prefix}.marginals", plan.marginal_budget,
        mechanism="discrete Laplace on the chosen (k+1)-way marginals",
        details={"max_tables": plan.max_tables, "sensitivity_per_table": plan.max_contributions,
                 "penalty_scale": plan.table_scale(plan.max_tables),
                 "penalty_scale_note": "the scale the structure penalty assumes (ε split equally "
                                       "over max_tables; data-independent)",
                 "split": "ε_i ∝ √cells_i over the released tables (split_marginal_budget); the "
                          "tables are chosen privately, so each table's ε and scale are released "
                          "with the model's noisy marginals",
                 "paper": "PrivBayes §4.2 (noisy conditionals), converted to add/remove counts"},
    )
    if plan.refine is not None:
        spend_refinement(accountant, plan.refine, f"{prefix}.refine")


SPLIT_CELLS_CAP = 10_000  # tables above this many cells earn no larger share of ε


def split_marginal_budget(budget: PureDP, cells: Sequence[int]) -> list[PureDP]:
    """ε_i ∝ √min(cells_i, 10⁴): ``√cells`` minimizes the expected total L1 noise
    Σ cells_i·m/ε_i for Σ ε_i = ε (Lagrange); the cap (:data:`SPLIT_CELLS_CAP`) stops one huge
    declared table (a parentless column with a 10⁶-value declared range) from taking nearly all
    of ε from the small tables that carry the correlations: beyond ~10⁴ cells a table's noise
    swamps any realistic count per cell whatever its share. No Adult table chosen at ε ≤ 5 is that
    large, so the split there is unchanged. Depends only on the chosen structure and the declared
    shape."""
    w = np.sqrt(np.minimum(np.asarray(cells, dtype=np.float64), SPLIT_CELLS_CAP))
    w = w / w.sum()
    return [PureDP(epsilon=float(budget.epsilon * wi)) for wi in w]


# -- measurement (the only step that reads exact counts) -----------------------------------------
@dataclass(frozen=True)
class PrivBayesMeasurement:
    """What the measurement releases: the private structure and the noisy family tables."""

    structure: tuple[tuple[int, tuple[int, ...]], ...]
    marginals: tuple[NoisyMarginal, ...]
    refinement: RefineMeasurement | None = None
    sizing: dict[str, Any] | None = None  # run-time size decision (DP n̂, degree): public


def measure_privbayes(
    counts: Sequence[np.ndarray],
    families: Sequence[tuple[int, ...]],
    *,
    shape: Sequence[int],
    names: Sequence[str],
    plan: PrivBayesPlan,
    rs: RandomSource,
    ordered: Sequence[bool] | None = None,
    shrink: float = DEFAULT_SHRINK,
    sampling: str = DEFAULT_SAMPLING,
) -> PrivBayesMeasurement:
    """Structure (permute-and-flip) then noisy family tables from exact candidate counts, then
    (``plan.refine``) the refinement rounds of :func:`~beamsynth.transforms.refine.measure_refinement`
    on the network fitted from those tables (``shrink``, ``sampling`` as in :func:`fit_privbayes`;
    ``ordered``: whether each column's declared domain is ordered, default all unordered)."""
    tables = {tuple(f): np.asarray(t) for f, t in zip(families, counts)}
    d = len(shape)
    degree, sizing = plan.degree, None
    if plan.sizing is not None and plan.sizing.count_budget is not None and plan.degree > 0:
        # n̂: the exact count (every family table sums to it) + discrete Laplace, Δ = m
        exact_rows = int(np.asarray(counts[0]).sum()) if len(counts) else 0
        count_scale = discrete_laplace_scale(sensitivity=plan.max_contributions,
                                             epsilon=plan.sizing.count_budget.epsilon)
        rows_hat = exact_rows + int(discrete_laplace(rs.child("size_count"), count_scale, 1)[0])
        degree = plan.sizing.degree(rows_hat)  # post-processing of the DP count
        sizing = {"rows_hat": rows_hat, "degree": degree, "max_degree": plan.degree}
        if degree == 0:
            # a zCDP plan's network ε are Laplace-equivalents, not budget: the pure-DP forest gets
            # the ε whose parts cost at most the planned ρ (forest_zcdp_epsilon)
            forest_eps = (_planned_epsilon(plan) if plan.zcdp is None else forest_zcdp_epsilon(
                plan.zcdp.spent_rho - plan.zcdp.count_rho, shape))
            forest = plan_forest(rows_hat, forest_eps, shape,
                                 max_contributions=plan.max_contributions,
                                 max_family_cells=plan.max_family_cells)
            sizing["forest_steps"] = forest.steps
            if forest.steps > 0:
                return _measure_forest(tables, shape, names, forest, rs, sizing)
            return _measure_independent(tables, shape, names, plan, rs, sizing)
    if plan.forest is not None:
        return _measure_forest(tables, shape, names, plan.forest, rs, None)
    # the penalty uses the scale the tables would get if every column had a family (data-independent)
    scale = plan.penalty * plan.table_scale(plan.max_tables)
    if d > 1 and degree > 0:
        structure = choose_structure(
            tables, shape, degree=degree, epsilon=plan.step_epsilon,
            sensitivity=plan.score_sensitivity, noise_scale=scale, rs=rs.child("structure"),
            max_family_cells=plan.max_family_cells, exact_degree=plan.exact_degree)
    else:
        structure = [(c, ()) for c in range(d)]
    specs = family_specs(structure)
    exact = [_family_table(tables, s) for s in specs]
    budgets = split_marginal_budget(plan.marginal_budget, [t.size for t in exact])
    released = _release_tables(exact, specs, names, budgets, plan, rs,
                               None if plan.zcdp is None else plan.zcdp.marginal_rho)
    measurement = PrivBayesMeasurement(tuple((x, tuple(p)) for x, p in structure), released,
                                       sizing=sizing)
    if plan.refine is None:
        return measurement
    # post-processing: the network (and its tables as targets) from the released tables only
    network, base_targets = _fit_network(measurement, shape, names, shrink, sampling)
    total = max(float(np.mean([m.values.sum() for m in released])), 1.0)
    pairs = [(a, b) for a in range(d) for b in range(a + 1, d)
             if any(a in f and b in f for f in tables)]
    refinement = measure_refinement(
        lambda a, b: _family_table(tables, (a, b)), network, total=total,
        ordered=list(ordered) if ordered is not None else [False] * d, names=names,
        plan=plan.refine, rs=rs.child("refine"), candidates=pairs, base_targets=base_targets)
    return PrivBayesMeasurement(measurement.structure, released, refinement, sizing=sizing)


def _planned_epsilon(plan: PrivBayesPlan) -> float:
    """The network ε planned at build time: structure + marginals + refinement shares."""
    total = plan.marginal_budget.epsilon
    if plan.structure_budget is not None:
        total += plan.structure_budget.epsilon
    if plan.refine is not None:
        total += plan.refine.selection_budget.epsilon + plan.refine.measure_budget.epsilon
    return total


def _measure_forest(tables: dict[tuple[int, ...], np.ndarray], shape: Sequence[int],
                    names: Sequence[str], forest: ForestPlan, rs: RandomSource,
                    sizing: dict[str, Any] | None) -> PrivBayesMeasurement:
    """The small-input model: the private forest (:func:`choose_forest`), then every column's
    1-way table (``forest.one_way_budget``, ∝ √cells) and each chosen edge's 2-way table
    (``forest.pair_budget``, ∝ √cells; with no edge chosen the 1-way tables get it too), all
    discrete Laplace. Sequential composition: structure + one-way + pairs = the planned ε."""
    d = len(shape)
    structure = choose_forest(tables, shape, plan=forest, rs=rs.child("forest"))
    fams = [(x, *ps) for x, ps in structure if ps]
    specs = [(c,) for c in range(d)] + fams
    exact = [_family_table(tables, s) for s in specs]
    if fams:
        budgets = (split_marginal_budget(forest.one_way_budget, [int(shape[c]) for c in range(d)])
                   + split_marginal_budget(forest.pair_budget, [t.size for t in exact[d:]]))
    else:
        budgets = split_marginal_budget(
            PureDP(epsilon=forest.one_way_budget.epsilon + forest.pair_budget.epsilon),
            [int(shape[c]) for c in range(d)])
    released = noisy_marginals(exact, specs=specs, names=names, budgets=budgets,
                               sensitivity=float(forest.max_contributions), rs=rs.child("marginals"))
    if sizing is not None:
        sizing = {**sizing, "forest_edges": len(fams)}
    return PrivBayesMeasurement(tuple((x, tuple(p)) for x, p in structure), released,
                                sizing=sizing)


def _measure_independent(tables: dict[tuple[int, ...], np.ndarray], shape: Sequence[int],
                         names: Sequence[str], plan: PrivBayesPlan, rs: RandomSource,
                         sizing: dict[str, Any]) -> PrivBayesMeasurement:
    """The run-time fallback (degree 0): every column's 1-way table, discrete Laplace, with the
    whole network ε planned at build time (structure + marginals + refinement shares; sequential
    composition, nothing left unspent), split ∝ √cells (:func:`split_marginal_budget`)."""
    total = _planned_epsilon(plan)
    specs = [(c,) for c in range(len(shape))]
    exact = [_family_table(tables, s) for s in specs]
    budgets = split_marginal_budget(PureDP(epsilon=total), [t.size for t in exact])
    # zCDP plan: the whole planned ρ but the size count's on the 1-way tables
    released = _release_tables(exact, specs, names, budgets, plan, rs,
                               None if plan.zcdp is None else plan.zcdp.spent_rho - plan.zcdp.count_rho)
    return PrivBayesMeasurement(tuple((c, ()) for c in range(len(shape))), released, sizing=sizing)


def _release_tables(exact: Sequence[np.ndarray], specs: Sequence[tuple[int, ...]],
                    names: Sequence[str], budgets: Sequence[PureDP], plan: PrivBayesPlan,
                    rs: RandomSource, rho: float | None) -> tuple[NoisyMarginal, ...]:
    """The tables with discrete Laplace at ``budgets`` (pure plan), or, with ``rho`` (zCDP plan),
    discrete Gaussian with ρ split ∝ min(cells, 10⁴)^⅔ (minimizes the expected total L1 noise
    Σ cells_i·σ_i for Σ m²/(2σ_i²) = ρ; cap as :data:`SPLIT_CELLS_CAP`)."""
    m = float(plan.max_contributions)
    if rho is None:
        return noisy_marginals(exact, specs=specs, names=names, budgets=budgets, sensitivity=m,
                               rs=rs.child("marginals"))
    w = np.minimum(np.asarray([t.size for t in exact], dtype=np.float64), SPLIT_CELLS_CAP) ** (2 / 3)
    rhos = rho * w / w.sum()
    sigmas = m / np.sqrt(2 * rhos)
    delta = plan.zcdp.budget.delta
    table_budgets = [zcdp_approx(float(r), delta) for r in rhos]
    return gaussian_marginals(exact, specs=specs, names=names, sigmas=sigmas, rhos=rhos,
                              budgets=table_budgets, sensitivity=m, rs=rs.child("marginals"))


class PrivBayesMeasureFn(beam.DoFn):
    """Exact candidate counts (one element per window) → :class:`PrivBayesMeasurement`.

    Randomness from ``(seed, "privbayes", window)``, never worker or arrival order.
    """

    def __init__(self, *, families: Sequence[tuple[int, ...]], shape: Sequence[int],
                 names: Sequence[str], plan: PrivBayesPlan, seed: int | None,
                 ordered: Sequence[bool] | None = None, shrink: float = DEFAULT_SHRINK,
                 sampling: str = DEFAULT_SAMPLING) -> None:
        self._families = [tuple(f) for f in families]
        self._shape, self._names = tuple(shape), tuple(names)
        self._plan, self._seed = plan, seed
        self._ordered = None if ordered is None else tuple(bool(o) for o in ordered)
        self._shrink, self._sampling = float(shrink), sampling

    def process(self, counts, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child("privbayes", *window_labels(window))
        out = measure_privbayes(counts, self._families, shape=self._shape, names=self._names,
                                plan=self._plan, rs=rs, ordered=self._ordered,
                                shrink=self._shrink, sampling=self._sampling)
        if out.sizing is not None:  # the run-time size decision (DP n̂): public, for the manifest
            beam.metrics.Metrics.counter(
                SIZING_METRICS_NAMESPACE, f"privbayes_degree_{out.sizing['degree']}").inc()
        yield out


# -- post-processing: consistency, non-negativity, conditionals ----------------------------------
def make_consistent(marginals: Sequence[NoisyMarginal], rounds: int = 3) -> list[np.ndarray]:
    """Tables made to agree on every shared column's 1-way marginal (post-processing).

    For each column in two or more tables, the 1-way estimate is the inverse-variance weighted
    mean of the tables' sums (a table of ``C`` cells summed to a column of ``c`` cells has
    per-cell variance ``(C/c)·var``); each table is then moved by the least-squares projection
    onto that constraint (the difference spread evenly over the summed cells). Repeated
    ``rounds`` times for overlapping constraints. Totals are made equal the same way.
    """
    tables = [m.values.astype(np.float64).copy() for m in marginals]
    var = [max(m.variance, 1e-12) for m in marginals]
    cols = [list(m.columns) for m in marginals]
    all_cols = sorted({c for cs in cols for c in cs})
    for _ in range(rounds):
        # totals
        w = np.array([1.0 / (var[i] * tables[i].size) for i in range(len(tables))])
        totals = np.array([t.sum() for t in tables])
        target = float((w * totals).sum() / w.sum())
        for i, t in enumerate(tables):
            t += (target - totals[i]) / t.size
        for c in all_cols:
            holders = [i for i, cs in enumerate(cols) if c in cs]
            if len(holders) < 2:
                continue
            sums, weights = [], []
            for i in holders:
                s = marginalize(tables[i], cols[i], [c])
                spread = tables[i].size / s.size
                sums.append(s)
                weights.append(1.0 / (var[i] * spread))
            est = sum(wi * si for wi, si in zip(weights, sums)) / sum(weights)
            for i, s in zip(holders, sums):
                axis = cols[i].index(c)
                spread = tables[i].size / s.size
                shape = [1] * tables[i].ndim
                shape[axis] = s.size
                tables[i] += ((est - s) / spread).reshape(shape)
    return tables


def conditional_from_table(table: np.ndarray, prior: np.ndarray, strength: float) -> np.ndarray:
    """``P(X | Π)`` rows from a non-negative table ``[x, π...]`` (post-processing).

    Row ``π`` is ``(T[·, π] + strength·prior) / (T[π] + strength)``: parent cells with little
    (noisy) mass fall back on the child's marginal ``prior`` instead of on noise. Returns an
    array ``[π_flat, x]`` of probability rows.
    """
    t = np.asarray(table, dtype=np.float64)
    cx = t.shape[0]
    rows = t.reshape(cx, -1).T
    prior = np.asarray(prior, dtype=np.float64)
    prior = prior / prior.sum() if prior.sum() > 0 else np.full(cx, 1.0 / cx)
    out = rows + strength * prior[None, :]
    sums = out.sum(axis=1, keepdims=True)
    zero = sums[:, 0] <= 0
    out[zero] = 1.0 / cx
    sums[zero] = 1.0
    return out / sums


def balanced_uniforms(groups: np.ndarray, rs: RandomSource) -> np.ndarray:
    """Stratified uniforms: row ``i`` in a group of ``n_g`` rows gets ``(r_i + U_g)/n_g``, where
    ``r_i`` is a uniformly random rank within the group and ``U_g ~ U[0, 1)`` one offset per group.

    Each value is marginally ``U[0, 1)``; inverted through a CDF, a group of ``n_g`` rows receives
    every category ``c`` exactly ``⌊n_g p_c⌋`` or ``⌈n_g p_c⌉`` times (systematic sampling), and
    which rows get which value is a uniformly random assignment (independent of everything but
    the group). Post-processing randomness only.
    """
    g = np.asarray(groups, dtype=np.int64).ravel()
    n = g.size
    if n == 0:
        return np.zeros(0)
    order = np.lexsort((rs.child("order").uniform(n), g))
    sorted_g = g[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_g)) + 1]
    sizes = np.diff(np.r_[starts, n])
    which = np.repeat(np.arange(starts.size), sizes)
    offsets = rs.child("offset").uniform(starts.size)
    u = np.empty(n)
    u[order] = (np.arange(n) - starts[which] + offsets[which]) / sizes[which]
    return u


def _invert_cdf_rows(cdf: np.ndarray, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``min(#{j : cdf[rows[i], j] ≤ u[i]}, K−1)`` for every ``i`` without an ``n × K`` array.

    One ``searchsorted`` over the rows laid end to end, row ``r`` shifted by ``r`` (its values lie
    in ``[r, r+1]``), so memory is ``O(n + R·K)`` whatever the domain size ``K`` (a declared
    integer column can have millions of cells). Exact for the single-row case; with ``R`` parent
    cells the shift costs ``log2(R)`` bits of the uniform's 53 (post-processing only).
    """
    k = cdf.shape[1]
    if cdf.shape[0] == 1:
        idx = np.searchsorted(cdf[0], u, side="right")
    else:
        r = np.asarray(rows, dtype=np.int64)
        flat = (cdf + np.arange(cdf.shape[0], dtype=np.float64)[:, None]).ravel()
        idx = np.searchsorted(flat, r + u, side="right") - r * k
    return np.clip(idx, 0, k - 1)


class PrivBayesModel(SynthesisModel):
    """Bayesian network ``Π_i P(X_i | Π_i)`` sampled ancestrally (post-processing only).

    ``sampling``: ``"balanced"`` (default; systematic sampling of each child within each parent
    cell, :func:`balanced_uniforms`) or ``"iid"`` (independent uniforms per row).
    """

    def __init__(self, shape: Sequence[int], structure: Sequence[tuple[int, tuple[int, ...]]],
                 conditionals: Sequence[np.ndarray], names: Sequence[str] | None = None,
                 *, sampling: str = DEFAULT_SAMPLING) -> None:
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling ({sampling!r}) must be one of {SAMPLING_MODES}")
        self._sampling = sampling
        self._shape = tuple(int(s) for s in shape)
        self._structure = [(int(x), tuple(int(p) for p in ps)) for x, ps in structure]
        if sorted(x for x, _ in self._structure) != list(range(len(self._shape))):
            raise ValueError(f"structure must place every column once, got {self._structure}")
        self._cdfs = []
        for (x, ps), cond in zip(self._structure, conditionals):
            rows = math.prod(self._shape[p] for p in ps)
            if cond.shape != (rows, self._shape[x]):
                raise ValueError(f"conditional of column {x} has shape {cond.shape}, "
                                 f"expected {(rows, self._shape[x])}")
            cdf = np.cumsum(cond, axis=1)
            cdf[:, -1] = 1.0
            self._cdfs.append(cdf)
        self._names = list(names) if names is not None else None

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def structure(self) -> list[tuple[int, tuple[int, ...]]]:
        """``(column, parents)`` in sampling order."""
        return list(self._structure)

    def conditional(self, column: int) -> np.ndarray:
        """``P(column | parents)`` as ``[parent cell, value]`` probability rows."""
        for (x, _), cdf in zip(self._structure, self._cdfs):
            if x == column:
                return np.diff(cdf, axis=1, prepend=0.0)
        raise KeyError(column)

    def sample_codes(self, n: int, rs: RandomSource) -> np.ndarray:
        out = np.zeros((n, len(self._shape)), dtype=np.int64)
        for (x, ps), cdf in zip(self._structure, self._cdfs):
            if ps:
                pidx = np.ravel_multi_index(tuple(out[:, p] for p in ps), [self._shape[p] for p in ps])
            else:
                pidx = np.zeros(n, dtype=np.int64)
            if self._sampling == "balanced":
                u = balanced_uniforms(pidx, rs.child("balanced", x))
            else:
                u = rs.child("column", x).uniform(n)
            out[:, x] = _invert_cdf_rows(cdf, pidx, u)
        return out

    def describe(self) -> dict[str, Any]:
        name = (lambda c: self._names[c]) if self._names else (lambda c: c)
        return {"model": "PrivBayes network", "sampling": self._sampling,
                "structure": [[name(x), [name(p) for p in ps]] for x, ps in self._structure]}


NETWORK_TARGET_MAX_CELLS = 100_000  # network tables above this size are not raking targets


def _fit_network(measurement: PrivBayesMeasurement, shape: Sequence[int],
                 names: Sequence[str] | None, shrink: float,
                 sampling: str) -> tuple[PrivBayesModel, list[RakeTarget]]:
    """The network from released tables only, those tables (consistent, non-negative) as
    raking targets for the refinement (multi-column tables of at most
    :data:`NETWORK_TARGET_MAX_CELLS` cells), and every column's 1-way estimate (the mean of
    its sums over the non-negative tables that hold it)."""
    ms = list(measurement.marginals)
    tables = make_consistent(ms)
    total = max(float(np.mean([t.sum() for t in tables])), 0.0)
    tables = [norm_sub(t, total) for t in tables]
    one_way = _one_way_estimates(ms, tables)
    if ONE_WAY_ESTIMATE == "mean":
        tables = [_with_margins(t, m.columns, one_way) if len(m.columns) > 1 else one_way[m.columns[0]]
                  for m, t in zip(ms, tables)]
    conditionals = []
    for x, ps in measurement.structure:
        i = next(j for j, m in enumerate(ms) if m.columns == (x, *ps)) if ps else None
        if i is None:
            prior = one_way[x]
            conditionals.append((prior / prior.sum() if prior.sum() > 0
                                 else np.full(shape[x], 1.0 / shape[x]))[None, :])
            continue
        strength = shrink * shape[x] * ms[i].scale
        conditionals.append(conditional_from_table(tables[i], one_way[x], strength))
    network = PrivBayesModel(shape, measurement.structure, conditionals, names, sampling=sampling)
    targets = [RakeTarget(tuple(m.columns), tuple(np.arange(int(shape[c])) for c in m.columns),
                          smoothed_proportions(t))
               for m, t in zip(ms, tables)
               if len(m.columns) > 1 and t.size <= NETWORK_TARGET_MAX_CELLS and t.sum() > 0]
    return network, targets


ONE_WAY_ESTIMATE = "mean"  # A/B switch for benchmarks: "first" = the first holder's sums, no IPF (before)
MARGIN_SWEEPS = 50


def _with_margins(table: np.ndarray, columns: Sequence[int], one_way: dict[int, np.ndarray],
                  sweeps: int = MARGIN_SWEEPS) -> np.ndarray:
    """``table`` (non-negative, over ``columns``) given the 1-way margins ``one_way[c]`` by
    iterative proportional fitting (post-processing). Empty cells stay empty unless a margin
    needs mass where the whole slice is empty; there the slice gets the product of the other
    margins."""
    t = np.asarray(table, dtype=np.float64).copy()
    total = float(t.sum())
    if total <= 0:
        return t
    targets = []
    for axis, c in enumerate(columns):
        m = np.clip(np.asarray(one_way[c], dtype=np.float64), 0.0, None)
        targets.append(m * total / m.sum() if m.sum() > 0 else t.sum(
            axis=tuple(a for a in range(t.ndim) if a != axis)))
    # a slice with target mass but no table mass: seed it with the independence product
    seed = np.ones(())
    for m in targets:
        seed = np.multiply.outer(seed, m / total) if seed.ndim else m / total
    t = np.where(t > 0, t, 1e-6 * total * seed)
    for _ in range(sweeps):
        for axis, m in enumerate(targets):
            others = tuple(a for a in range(t.ndim) if a != axis)
            cur = t.sum(axis=others)
            shape = [1] * t.ndim
            shape[axis] = m.size
            t *= np.where(cur > 0, m / np.maximum(cur, 1e-300), 0.0).reshape(shape)
    return t


def _one_way_estimates(ms: Sequence[NoisyMarginal],
                       tables: Sequence[np.ndarray]) -> dict[int, np.ndarray]:
    """Each column's 1-way estimate from the consistent, non-negative tables (post-processing):
    the mean of its sums over every table that holds it, weighted by the inverse noise variance
    of the sum (a table of ``C`` cells with per-cell variance ``v`` summed to ``c`` cells:
    ``v·C/c`` per cell; public: scales and declared sizes). The tables agree on it before
    Norm-Sub (:func:`make_consistent`); Norm-Sub then moves each table's sums differently, and
    their mean is closer to the truth than any one of them (docs/privbayes.md, issue 18)."""
    sums: dict[int, list[tuple[float, np.ndarray]]] = {}
    for m, t in zip(ms, tables):
        for c in m.columns:
            s = marginalize(t, m.columns, [c])
            sums.setdefault(c, []).append((s.size / (max(m.variance, 1e-12) * t.size), s))
    if ONE_WAY_ESTIMATE == "first":
        return {c: v[0][1] for c, v in sums.items()}
    return {c: sum(w * s for w, s in v) / sum(w for w, _ in v) for c, v in sums.items()}


def fit_privbayes(
    measurement: PrivBayesMeasurement, shape: Sequence[int], names: Sequence[str] | None = None,
    *, shrink: float = DEFAULT_SHRINK, sampling: str = DEFAULT_SAMPLING,
) -> PrivBayesModel | RefinedModel:
    """Fit the network from released tables only: consistency → Norm-Sub → shrunk conditionals;
    with a refinement, the network wrapped in a :class:`~beamsynth.transforms.refine.RefinedModel`
    that rakes it to the network's own multi-column tables and then to the refinement's targets
    (keeping the network's tables as targets: Adult ε = 1, 12 paired seeds, TVD2/TVD3 −0.0006 /
    −0.0009, better in 10 / 12 of them).

    ``shrink`` multiplies the fallback strength ``c_X · b`` (about the noise mass one row of the
    conditional carries) used by :func:`conditional_from_table`. ``sampling`` is passed to
    :class:`PrivBayesModel`, or with a refinement to the
    :class:`~beamsynth.transforms.refine.RefinedModel` (``"balanced"``: pair-balanced rows from
    the raked pool; ``"iid"``: independent draws from it), whose pool the network draws i.i.d.
    (Adult ε = 1, 14 seeds: same TVD2/TVD3 as a balanced pool, without its per-column sort).
    """
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"sampling ({sampling!r}) must be one of {SAMPLING_MODES}")
    if measurement.refinement is None or not measurement.refinement.targets:
        return _fit_network(measurement, shape, names, shrink, sampling)[0]
    # refined: the network only feeds the raked pool, which the refined model samples itself
    # (``sampling`` applies there); i.i.d. pool draws are as good and cost no per-column sort
    network, targets = _fit_network(measurement, shape, names, shrink, "iid")
    return RefinedModel(network, [*targets, *measurement.refinement.targets], names=names,
                        base_targets=len(targets), sampling=sampling)


# -- Beam transforms -------------------------------------------------------------------------------
def ordered_columns(schema: Schema) -> list[bool]:
    """Whether each column's declared domain is ordered (integer, float, datetime): how the
    refinement coarsens it (:func:`~beamsynth.transforms.refine.coarse_groups`)."""
    from beamsynth.schemas.domains import DatetimeDomain, FloatDomain, IntegerDomain

    return [isinstance(c.domain, (IntegerDomain, FloatDomain, DatetimeDomain)) for c in schema.columns]


@element_types(input=EncodedBatch, output=SynthesisModel)
class DPPrivBayes(beam.PTransform):
    """PrivBayes measurement + fit: ``PCollection[EncodedBatch]`` → one :class:`PrivBayesModel`
    per window.

    Privacy: ``budget.epsilon``-DP (pure), add/remove one privacy unit of at most
    ``max_contributions`` records (bound them first with ``BoundContributions``); split and
    mechanisms in the module docstring. Spends are recorded on ``accountant`` (if given) here,
    when the pipeline is built.

    Args (keyword-only): schema, budget, degree (parents per attribute, default 1 with the
    refinement and 2 without, :func:`plan_privbayes`; lowered
    automatically if the candidate counts exceed ``max_candidate_cells``), structure_fraction
    (share of ε for the structure, default 0.1), max_contributions, seed (``None`` = secure),
    shrink (conditional fallback strength, post-processing), sampling (``"balanced"`` default or
    ``"iid"``, post-processing, see :class:`PrivBayesModel`), parents (``"auto"``, ``"adaptive"``
    or ``"exact"``, see :func:`plan_privbayes`; exact means parent sets of
    exactly k columns instead of any size ≤ k, :func:`choose_structure`), refine_pairs /
    refine_rounds / refine_groups / refine_fraction (the refinement of
    :mod:`beamsynth.transforms.refine`; ``refine_pairs=0`` turns it off, see
    :func:`plan_privbayes`), sizing (``"auto"``: the degree follows ``n̂·ε``,
    :func:`choose_network_degree`, down to 0 = independent 1-way marginals, the default of
    ``--method privbayes``; ``"off"``, the default here: the planned degree), rows (a public row
    count of the *input* for the sizing, ``--input-rows``; without it a DP count is spent,
    :func:`plan_privbayes`),
    accountant.
    """

    def __init__(self, *, schema: Schema, budget: ApproxDP, degree: int | None = None,
                 structure_fraction: float = DEFAULT_STRUCTURE_FRACTION, max_contributions: int = 1,
                 seed: int | None = None, shrink: float = DEFAULT_SHRINK,
                 sampling: str = DEFAULT_SAMPLING, max_candidate_cells: int = MAX_CANDIDATE_CELLS,
                 parents: str = "auto", refine_pairs: int = DEFAULT_REFINE_PAIRS,
                 refine_rounds: int = DEFAULT_REFINE_ROUNDS, refine_groups: int = DEFAULT_REFINE_GROUPS,
                 refine_fraction: float = DEFAULT_REFINE_FRACTION, sizing: str = "off",
                 rows: int | None = None, noise: str = "laplace",
                 accountant: PrivacyAccountant | None = None, label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(schema, Schema):
            raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
        if not isinstance(shrink, (int, float)) or not 0 <= shrink <= 100:
            raise ValueError(f"shrink ({shrink!r}) must be a number in [0, 100]")
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling ({sampling!r}) must be one of {SAMPLING_MODES}")
        self._sampling = sampling
        self._schema = schema
        self._epsilon = budget.epsilon
        self.plan = plan_privbayes(schema.shape, budget, degree=degree,
                                   structure_fraction=structure_fraction,
                                   max_contributions=max_contributions,
                                   max_candidate_cells=max_candidate_cells,
                                   parents=parents, names=schema.names,
                                   refine_pairs=refine_pairs, refine_rounds=refine_rounds,
                                   refine_groups=refine_groups, refine_fraction=refine_fraction,
                                   sizing=sizing, rows=rows)
        if noise not in NOISE_MODES:
            raise ValueError(f"noise ({noise!r}) must be one of {NOISE_MODES}")
        if noise == "gaussian":  # zCDP (issue 18): needs δ > 0, refinement sized for it
            self.plan = gaussian_plan(self.plan, budget, pairs=refine_pairs,
                                      rounds=refine_rounds, groups=refine_groups)
        self._delta = budget.delta if self.plan.zcdp is not None else 0.0
        if accountant is not None:
            spend_privbayes(accountant, self.plan)
        self._families = candidate_families(len(schema.shape), self.plan.degree, shape=schema.shape,
                                            max_family_cells=self.plan.max_family_cells)
        self._seed, self._shrink = run_seed(seed), float(shrink)

    def display_data(self) -> dict[str, Any]:
        """Mechanism, ε split, δ, degree and declared sizes (never data values)."""
        plan = self.plan
        return display_items(
            mechanism="PrivBayes (permute-and-flip structure, discrete Laplace tables"
                      + (", refinement" if plan.refine is not None else "") + ")",
            epsilon=self._epsilon, delta=self._delta, degree=plan.degree,
            structure_epsilon=0.0 if plan.structure_budget is None else plan.structure_budget.epsilon,
            marginal_epsilon=plan.marginal_budget.epsilon,
            refine_pairs=0 if plan.refine is None else plan.refine.pairs,
            table_noise_scale=plan.table_scale(plan.max_tables), columns=plan.n_columns,
            sensitivity=plan.max_contributions, max_family_cells=plan.max_family_cells,
            sizing="off" if plan.sizing is None else (
                "public rows" if plan.sizing.rows is not None else "DP count"),
            declared_cells=sum(self._schema.shape))

    def expand(self, batches):
        shape, names, shrink, sampling = (self._schema.shape, self._schema.names, self._shrink,
                                          self._sampling)
        counts = combine_globally(batches, MarginalCountsCombineFn(self._families, shape),
                                  "CountCandidates")
        # tuple[np.ndarray, ...]: exact counts of every (k+1)-column family, one per window
        measured = counts | "ChooseAndMeasure" >> beam.ParDo(PrivBayesMeasureFn(
            families=self._families, shape=shape, names=names, plan=self.plan, seed=self._seed,
            ordered=ordered_columns(self._schema), shrink=shrink, sampling=sampling))
        # PrivBayesMeasurement (structure + NoisyMarginal tables + refinement tables): the DP boundary
        return measured | "Fit" >> beam.Map(fit_privbayes, shape, names, shrink=shrink,
                                                sampling=sampling)
        # PrivBayesModel, or RefinedModel when refining


@element_types(input=EncodedBatch, output=pa.Table)
class PrivBayesSynthesizer(beam.PTransform):
    """End to end from Python: ``batches | PrivBayesSynthesizer(...)`` → ``PCollection[pa.Table]``.

    Fits :class:`DPPrivBayes` on the batches and samples ``rows`` synthetic rows (or a DP row
    count, discrete Laplace with ``count_fraction`` of ε, when ``rows`` is None) in shards.
    Privacy: ``budget.epsilon``-DP in total (add/remove one unit of ≤ ``max_contributions``
    records); the count's share is taken off before the PrivBayes split.
    """

    def __init__(self, *, schema: Schema, budget: ApproxDP, rows: int | None = None,
                 count_fraction: float = 0.05, seed: int | None = None,
                 shard_rows: int = 50_000, accountant: PrivacyAccountant | None = None,
                 label: str | None = None, **privbayes: Any) -> None:
        super().__init__(label)
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
            raise ValueError(f"rows ({rows!r}) must be None or an int >= 0")
        if not 0 < count_fraction < 1:
            raise ValueError(f"count_fraction ({count_fraction!r}) must be in (0, 1)")
        self._count_budget = None
        model_budget = budget
        if rows is None:
            self._count_budget = PureDP(epsilon=budget.epsilon * count_fraction)
            model_budget = PureDP(epsilon=budget.epsilon - self._count_budget.epsilon)
            if accountant is not None:
                accountant.spend("privbayes.row_count", self._count_budget,
                                 mechanism="discrete Laplace on the record count",
                                 details={"sensitivity": privbayes.get("max_contributions", 1)})
        self._model = DPPrivBayes(schema=schema, budget=model_budget, seed=seed,
                                  accountant=accountant, **privbayes)
        self._schema, self._rows, self._seed, self._shard_rows = schema, rows, seed, shard_rows
        self._k = privbayes.get("max_contributions", 1)

    def display_data(self) -> dict[str, Any]:
        """The model's display data plus the row count's (never data values)."""
        items = self._model.display_data()
        count_eps = 0.0 if self._count_budget is None else self._count_budget.epsilon
        items.update(display_items(
            mechanism=f"{items['mechanism'].value} + sampling",
            epsilon=items["epsilon"].value + count_eps, count_epsilon=count_eps,
            rows="DP count (discrete Laplace)" if self._rows is None else self._rows,
            shard_rows=self._shard_rows))
        return items

    def expand(self, batches):
        models = batches | "PrivBayes" >> self._model
        # PrivBayesModel per window
        if self._rows is None:
            rows = (batches | "DPCount" >> DPCount(budget=self._count_budget, max_contributions=self._k,
                                                     seed=self._seed)
                    | "Rows" >> beam.Map(lambda c: c.rows))
            # int per window
            pair = models | "Pair" >> beam.Map(lambda m, r: (m, r), beam.pvalue.AsSingleton(rows))
        else:
            fixed = self._rows
            pair = models | "Pair" >> beam.Map(lambda m: (m, fixed))
        # (PrivBayesModel, rows)
        return pair | "Sample" >> SampleSynthetic(schema=self._schema, seed=self._seed,
                                                  shard_rows=self._shard_rows)
        # pyarrow.Table
