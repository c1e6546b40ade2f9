"""Plausible deniability (seed 001), the DP models as PTransforms (Sections 3.3-3.5).

* :class:`DPPlausibleBayesNet` — the paper's network: exact single/pair tables and count of
  ``D_T`` → :func:`~beamsynth.transforms.plausible_structure.learn_structure`; exact conditional
  tables of ``D_P`` (:func:`param_tables`) → a
  :class:`~beamsynth.transforms.plausible_model.PlausibleBayesNet` (lazily noised);
* :class:`DPPrivBayesGenerator` — a PrivBayes model of ``D_T ∪ D_P`` turned into a
  :class:`~beamsynth.transforms.plausible_model.NetworkGenerator` by :func:`privbayes_generator`
  (Beam-free post-processing, with :func:`copy_first_order` and :func:`model_sample`).

Shapes: both take ``{"structure": PCollection[EncodedBatch], "params": PCollection[EncodedBatch]}``
(disjoint parts of :class:`~beamsynth.transforms.plausible_split.SplitForPlausible`) and return
one model per window; each ``expand`` comments its steps' element shapes.

Privacy (add/remove one unit of at most ``c = max_contributions`` records):
:class:`DPPlausibleBayesNet` is ε-DP (δ = 0): structure on ``D_T`` (10% of ε on the count, the rest
on the ``n·H`` values, sensitivities times ``c``), parameters on ``D_P`` (discrete Laplace of scale
``m·c/ε`` per cell), parallel composition over the disjoint splits (Sections 3.3.1, 3.4.1, 3.5;
no subsampling amplification claimed). :class:`DPPrivBayesGenerator` is PrivBayes's own
``budget.epsilon``-DP on ``D_T ∪ D_P`` (``transforms/privbayes.py``, ``docs/privbayes.md``); the
generator fitted to it is post-processing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np

from beamsynth.schemas.schema import EncodedBatch, Schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import (
    MarginalCountsCombineFn,
    combine_globally,
    count_marginals,
    window_labels,
)
from beamsynth.transforms.noise import RandomSource, discrete_laplace_scale, run_seed
from beamsynth.transforms.plausible_model import (
    GENERATOR_MAX_CONFIGS,
    GENERATOR_MAX_PARENTS,
    GENERATOR_POOL_ROWS,
    NetworkGenerator,
    PlausibleBayesNet,
    fit_network_generator,
)
from beamsynth.transforms.plausible_structure import (
    PlausibleStructure,
    entropy_sum_sensitivity,
    learn_structure,
    structure_specs,
)
from beamsynth.transforms.privbayes import DPPrivBayes, PrivBayesModel, spend_privbayes
from beamsynth.transforms.refine import RefinedModel, rake_weights
from beamsynth.transforms.synthesis import SynthesisModel, _CountRowsFn

__all__ = [
    "DEFAULT_MAX_RECORDS",
    "DPPlausibleBayesNet",
    "DPPrivBayesGenerator",
    "copy_first_order",
    "model_sample",
    "privbayes_generator",
    "param_tables",
]

DEFAULT_MAX_RECORDS = 10**9


# =============================================================================================
# Beam: the DP model
# =============================================================================================
class _StructureFn(beam.DoFn):
    """Exact single/pair tables + count → noisy entropies → CFS structure (pure function of noise)."""

    def __init__(self, *, shape, epsilon, max_records, max_parents, max_cost, seed, step, cells_per_record=None):
        self._shape, self._eps, self._max_records = tuple(shape), epsilon, max_records
        self._max_parents, self._max_cost, self._seed, self._step = max_parents, max_cost, seed, step
        self._cells_per_record = cells_per_record

    def process(self, tables, n_records, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child(self._step, *window_labels(window))
        yield learn_structure(list(tables), n_records, shape=self._shape, epsilon=self._eps,
                              max_records=self._max_records, max_parents=self._max_parents,
                              max_cost=self._max_cost, rs=rs, cells_per_record=self._cells_per_record)


class _ParamCountsFn(beam.DoFn):
    """EncodedBatch → exact (parents..., child) count tables for one structure (list of arrays)."""

    def __init__(self, shape) -> None:
        self._shape = tuple(shape)

    def process(self, batch: EncodedBatch, structure: PlausibleStructure):
        yield param_tables(batch.codes, structure, self._shape)


def param_tables(codes: np.ndarray, structure: PlausibleStructure, shape: Sequence[int]) -> list[np.ndarray]:
    """Exact ``(parents..., child)`` count tables of ``codes`` for each attribute (``D_P`` only)."""
    specs = [tuple(structure.parents[i]) + (i,) for i in range(len(shape))]
    return count_marginals(codes, specs, shape)


class _SumTablesFn(beam.CombineFn):
    def create_accumulator(self):
        return None

    def add_input(self, acc, tables):
        if acc is None:
            return [t.copy() for t in tables]
        for a, t in zip(acc, tables):
            a += t
        return acc

    def merge_accumulators(self, accs):
        out = None
        for a in accs:
            if a is not None:
                out = self.add_input(out, a)
        return out

    def extract_output(self, acc):
        return acc


class _BuildModelFn(beam.DoFn):
    def __init__(self, *, shape, scale, alpha, omega, seed, step) -> None:
        self._shape, self._scale, self._alpha, self._omega = tuple(shape), scale, alpha, omega
        self._seed, self._step = seed, step

    def process(self, tables, structure: PlausibleStructure, window=beam.DoFn.WindowParam):
        if tables is None:  # empty parameter split: all-zero counts, still noised
            tables = param_tables(np.zeros((0, len(self._shape)), np.int64), structure, self._shape)
        key = RandomSource(seed=self._seed).child(self._step, "hmac-key", *window_labels(window)).secret_key()
        yield PlausibleBayesNet(structure=structure, shape=self._shape, counts=tables,
                                noise_scale=self._scale, alpha=self._alpha, omega=self._omega, key=key)


@element_types(inputs={"structure": EncodedBatch, "params": EncodedBatch},
               output=PlausibleBayesNet)
class DPPlausibleBayesNet(beam.PTransform):
    """ε-DP Bayesian network of Section 3 from disjoint structure and parameter splits.

    Input: ``{"structure": PCollection[EncodedBatch], "params": PCollection[EncodedBatch]}``
    (disjoint). Output: one :class:`PlausibleBayesNet` per window.

    Privacy (add/remove one record; multiply sensitivities by ``max_contributions``):

    * structure on ``D_T``: ``10%`` of ε on the count (discrete Laplace, sensitivity 1), the rest
      split over ``m + m(m-1)/2`` values ``f = n·H`` with Laplace of scale ``Δf·Q/ε``,
      ``Δf = log2 N + (N-1)·log2(N/(N-1))`` for the declared bound ``N = max_records``
      (:func:`entropy_sum_sensitivity`; the paper's Lemma 1 is for replace-one neighbours and a
      known ``n``). ε-DP by sequential composition (Section 3.3.1, 3.5).
    * parameters on ``D_P``: ``m`` tables (parents + child), each record in one cell per table,
      discrete Laplace of scale ``m·c/ε`` per cell (Section 3.4.1), noise derived lazily per parent
      configuration from ``HMAC(secret key, (i, configuration))``; ε-DP.
    * parallel composition over the disjoint splits: the model is ε-DP (δ = 0). We do not claim
      the subsampling amplification of Section 3.5.

    ``theta`` (default 4) additionally limits each conditional table to
    ``ñ_T·(|D_P|/|D_T|)·(ε/m)/(c·θ)`` cells using the noisy ``D_T`` count (post-processing; PrivBayes'
    θ-usefulness), since with small data the paper's ``maxcost`` alone lets noise swamp the tables.
    ``params_ratio`` is the split's public ratio ``|D_P|/|D_T|`` (fractions).
    """

    def __init__(self, *, shape: Sequence[int], budget: ApproxDP, omega: int, max_parents: int = 3,
                 max_cost: int = 1000, alpha: float = 1.0, max_records: int = DEFAULT_MAX_RECORDS,
                 theta: float | None = 4.0, params_ratio: float = 1.5,
                 max_contributions: int = 1, seed: int | None = None, label: str | None = None) -> None:
        super().__init__(label)
        if theta is not None and not (theta > 0 and math.isfinite(theta)):
            raise ValueError(f"theta ({theta!r}) must be a finite number > 0 or None")
        if not (params_ratio > 0 and math.isfinite(params_ratio)):
            raise ValueError(f"params_ratio ({params_ratio!r}) must be a finite number > 0")
        if not isinstance(budget, ApproxDP):
            raise TypeError(f"budget must be a PureDP/ApproxDP, got {type(budget).__name__}")
        m = len(shape)
        if not (isinstance(omega, int) and 1 <= omega <= m):
            raise ValueError(f"omega ({omega!r}) must be an int in [1, {m}]")
        if isinstance(max_parents, bool) or not (isinstance(max_parents, int) and max_parents >= 0):
            raise ValueError(f"max_parents ({max_parents!r}) must be an int >= 0")
        if not (isinstance(max_cost, int) and max_cost >= 1):
            raise ValueError(f"max_cost ({max_cost!r}) must be an int >= 1")
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha ({alpha!r}) must be a finite number > 0")
        if not (isinstance(max_records, int) and max_records >= 2):
            raise ValueError(f"max_records ({max_records!r}) must be an int >= 2")
        self._shape, self._eps, self._omega = tuple(int(s) for s in shape), budget.epsilon, omega
        self._max_parents, self._max_cost, self._alpha = min(max_parents, m - 1), max_cost, float(alpha)
        self._max_records, self._c, self._seed = max_records, int(max_contributions), run_seed(seed)
        self._theta, self._params_ratio = theta, float(params_ratio)

    @property
    def cells_per_record(self) -> float | None:
        """Table cells allowed per noisy record of ``D_T``: ``(|D_P|/|D_T|)·(ε/m)/(c·θ)`` (θ-usefulness)."""
        if self._theta is None:
            return None
        return self._params_ratio * (self._eps / len(self._shape)) / (self._c * self._theta)

    def display_data(self) -> dict[str, Any]:
        """ε, noise laws and sizes (never data values)."""
        return display_items(
            mechanism="plausible-deniability Bayesian network (Laplace entropies, discrete Laplace "
                      "tables)",
            epsilon=self._eps, delta=0.0, omega=self._omega, columns=len(self._shape),
            structure_noise="Laplace on n·H", entropy_scale=self.entropy_scale,
            parameter_noise="discrete Laplace", parameter_scale=self.param_scale,
            max_cost=self._max_cost, declared_cells=sum(self._shape))

    @property
    def param_scale(self) -> float:
        """Discrete Laplace scale per parameter cell: ``m·c/ε``."""
        return discrete_laplace_scale(sensitivity=len(self._shape) * self._c, epsilon=self._eps)

    @property
    def entropy_scale(self) -> float:
        """Laplace scale on each ``n·H`` value."""
        m = len(self._shape)
        q = m + m * (m - 1) // 2
        return self._c * entropy_sum_sensitivity(self._max_records) * q / (0.9 * self._eps)

    def expand(self, parts):
        m = len(self._shape)
        tables = combine_globally(parts["structure"], MarginalCountsCombineFn(structure_specs(m), self._shape),
                                  "PairCounts")
        # tuple[np.ndarray] exact single + pair tables of D_T (one pass)
        n_t = combine_globally(parts["structure"], _CountRowsFn(), "CountStructure")
        # int |D_T|
        structure = tables | "Structure" >> beam.ParDo(
            _StructureFn(shape=self._shape, epsilon=self._eps / self._c, max_records=self._max_records,
                         max_parents=self._max_parents, max_cost=self._max_cost, seed=self._seed,
                         step="plausible.structure", cells_per_record=self.cells_per_record),
            beam.pvalue.AsSingleton(n_t))
        # PlausibleStructure (post-processing of noisy entropies)
        counts = (parts["params"]
                  | "ParamCounts" >> beam.ParDo(_ParamCountsFn(self._shape), beam.pvalue.AsSingleton(structure)))
        # list[np.ndarray] exact conditional tables per batch of D_P
        summed = combine_globally(counts, _SumTablesFn(), "SumParamCounts")
        # list[np.ndarray] | None
        return summed | "BuildModel" >> beam.ParDo(
            _BuildModelFn(shape=self._shape, scale=self.param_scale, alpha=self._alpha, omega=self._omega,
                          seed=self._seed, step="plausible.params"), beam.pvalue.AsSingleton(structure))
        # PlausibleBayesNet (lazy noisy conditionals)


# =============================================================================================
# A PrivBayes network as the seed-based generator
# =============================================================================================


def copy_first_order(shape: Sequence[int]) -> tuple[int, ...]:
    """Columns by number of declared cells, then schema position (data-independent).

    The first ``m − ω`` are the ones a candidate copies from its seed: the privacy test counts
    the seeds that share all of them, so small domains keep more seeds plausible for the same ω.
    """
    return tuple(sorted(range(len(shape)), key=lambda c: (int(shape[c]), c)))


def model_sample(model: SynthesisModel, rows: int, rs: RandomSource) -> tuple[np.ndarray, np.ndarray | None, list[int]]:
    """``(records, weights, network order)`` describing a released model (post-processing).

    A refined PrivBayes model is its network's records raked to the released targets (the
    weighted pool its own sampler uses, with its sweeps); a plain network is sampled ancestrally. The order is the
    network's sampling (topological) order, or the schema order for other models.
    """
    shape = tuple(int(s) for s in model.shape)
    base = model.base if isinstance(model, RefinedModel) else model
    order = [x for x, _ in base.structure] if isinstance(base, PrivBayesModel) else list(range(len(shape)))
    if isinstance(model, RefinedModel) and model.targets:
        pool = base.sample_codes(rows, rs.child("pool"))
        return pool, rake_weights(pool, shape, model.targets, model.iterations,
                                  end_on_margins=model.end_on_margins), order
    return model.sample_codes(rows, rs.child("pool")), None, order


def privbayes_generator(model: SynthesisModel, *, omega: int, rs: RandomSource,
                        copy_order: Sequence[int] | None = None, pool_rows: int = GENERATOR_POOL_ROWS,
                        max_parents: int = GENERATOR_MAX_PARENTS,
                        max_configs: int = GENERATOR_MAX_CONFIGS) -> NetworkGenerator:
    """The seed-based generator of a released PrivBayes model (post-processing only).

    The copied columns are the first ``m − ω`` of ``copy_order`` (default
    :func:`copy_first_order`, declared sizes); the ``ω`` others are resampled in the network's
    own topological order, so every column is resampled after its network parents. The
    conditionals are fitted by :func:`fit_network_generator` to ``pool_rows`` records of the
    model (:func:`model_sample`: with the refinement, the raked pool), parents chosen among the
    columns before (up to ``max_parents``, ``max_configs`` configurations), so a resampled
    column may depend on any copied one (income on the copied relationship, say) and on the
    refinement's pairs. ``Pr{y = M(d)}`` is then exact for the fitted tables
    (:class:`SeedResamplingNetwork`).
    """
    shape = tuple(int(s) for s in model.shape)
    m = len(shape)
    if isinstance(omega, bool) or not isinstance(omega, int) or not 1 <= omega <= m:
        raise ValueError(f"omega ({omega!r}) must be an int in [1, {m}]")
    first = tuple(copy_first_order(shape) if copy_order is None else copy_order)
    if sorted(first) != list(range(m)):
        raise ValueError(f"copy_order ({copy_order!r}) must list each of the {m} columns once")
    pool, weights, net_order = model_sample(model, int(pool_rows), rs)
    if weights is not None and not (np.all(np.isfinite(weights)) and weights.sum() > 0):
        weights = None  # a degenerate raking (released tables only) falls back on the network's pool
    copied = list(first[: m - omega])
    order = copied + [c for c in net_order if c not in copied]
    return fit_network_generator(pool, weights, shape=shape, omega=omega, order=order, max_parents=max_parents,
                                 max_configs=max_configs,
                                 source=f"PrivBayes model ({type(model).__name__}), {int(pool_rows)} sampled records")


class _NetworkGeneratorFn(beam.DoFn):
    """Released model → :class:`NetworkGenerator` (post-processing; stream per window)."""

    def __init__(self, *, omega: int, pool_rows: int, max_parents: int, max_configs: int,
                 seed: int | None) -> None:
        self._omega, self._pool_rows, self._seed = omega, pool_rows, seed
        self._max_parents, self._max_configs = max_parents, max_configs

    def process(self, model: SynthesisModel, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child("plausible.generator", *window_labels(window))
        yield privbayes_generator(model, omega=self._omega, rs=rs, pool_rows=self._pool_rows,
                                  max_parents=self._max_parents, max_configs=self._max_configs)


@element_types(inputs={"structure": EncodedBatch, "params": EncodedBatch}, output=NetworkGenerator)
class DPPrivBayesGenerator(beam.PTransform):
    """ε-DP PrivBayes model of the model splits, turned into the seed-based generator.

    Input: ``{"structure": PCollection[EncodedBatch], "params": PCollection[EncodedBatch]}`` (the
    two model parts of :class:`SplitForPlausible`, disjoint from the seeds); both go to one
    :class:`~beamsynth.transforms.privbayes.DPPrivBayes` (its own accounting: structure by
    permute-and-flip, discrete Laplace family tables, refinement; ``budget.epsilon``-DP, pure,
    add/remove one unit of ≤ ``max_contributions`` records; ``sizing="auto"`` on the public
    ``rows`` or a DP count). Output: one :class:`NetworkGenerator` per window, fitted to the
    released model by :func:`privbayes_generator` (post-processing). The spends are in
    :attr:`plan` (``spend_privbayes``); pass ``accountant`` to record them here.
    """

    def __init__(self, *, schema: Schema, budget: ApproxDP, omega: int, rows: int | None = None,
                 max_contributions: int = 1, pool_rows: int = GENERATOR_POOL_ROWS,
                 max_parents: int = GENERATOR_MAX_PARENTS, max_configs: int = GENERATOR_MAX_CONFIGS,
                 seed: int | None = None, accountant: PrivacyAccountant | None = None, spend_prefix: str = "plausible.model",
                 label: str | None = None) -> None:
        super().__init__(label)
        m = len(schema.shape)
        if isinstance(omega, bool) or not isinstance(omega, int) or not 1 <= omega <= m:
            raise ValueError(f"omega ({omega!r}) must be an int in [1, {m}]")
        for name, value, low in (("pool_rows", pool_rows, 1_000), ("max_parents", max_parents, 0),
                                 ("max_configs", max_configs, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} ({value!r}) must be an int >= {low}")
        self._seed = run_seed(seed)
        self._privbayes = DPPrivBayes(schema=schema, budget=budget, sizing="auto", rows=rows,
                                      max_contributions=max_contributions, seed=self._seed)
        self.plan = self._privbayes.plan
        if accountant is not None:
            spend_privbayes(accountant, self.plan, spend_prefix)
        self._epsilon, self._omega, self._pool_rows = budget.epsilon, omega, pool_rows
        self._max_parents, self._max_configs = max_parents, max_configs

    def display_data(self) -> dict[str, Any]:
        """ε, degree and the generator's sizes (never data values)."""
        return display_items(mechanism="PrivBayes model as the seed-based generator", epsilon=self._epsilon,
                             delta=0.0, degree=self.plan.degree, omega=self._omega,
                             pool_rows=self._pool_rows, max_parents=self._max_parents,
                             max_configs=self._max_configs)

    def expand(self, parts):
        records = (parts["structure"], parts["params"]) | "ModelRecords" >> beam.Flatten()
        # EncodedBatch: D_T ∪ D_P (disjoint from the seeds)
        model = records | "PrivBayes" >> self._privbayes
        # PrivBayesModel | RefinedModel (the DP release)
        self.measured = self._privbayes.measured  # its run-time choices, for the manifest (H72)
        return model | "ToGenerator" >> beam.ParDo(_NetworkGeneratorFn(
            omega=self._omega, pool_rows=self._pool_rows, max_parents=self._max_parents,
            max_configs=self._max_configs, seed=self._seed))
        # NetworkGenerator (post-processing)
