"""PrivBayes PTransforms: :class:`DPPrivBayes` (one fitted model per window) and
:class:`PrivBayesSynthesizer` (end to end, synthetic rows).

Shapes: ``PCollection[EncodedBatch]`` (contribution-bounded) → ``CountCandidates``
(``tuple[np.ndarray, ...]``, exact family counts, one per window) → ``ChooseAndMeasure``
(:class:`~beamsynth.transforms.privbayes_measure.PrivBayesMeasurement`, the DP boundary) →
``Fit`` (``PrivBayesModel`` or ``RefinedModel``); the synthesizer pairs the model with ``rows``
(public or a DP count) → ``SampleSynthetic`` → ``PCollection[pa.Table]``.

Privacy: ``budget.epsilon``-DP (pure; ``(ε, δ)`` with ``noise="gaussian"``) for adding or
removing one privacy unit of at most ``max_contributions`` records. The plan
(:func:`~beamsynth.transforms.privbayes_plan.plan_privbayes`) is made and spent on the accountant
in ``__init__``, before any data is read; the synthesizer's DP row count (discrete Laplace,
Δ = m) takes its share of ε first. Mechanisms and paper sections:
:mod:`~beamsynth.transforms.privbayes`.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pyarrow as pa

from beamsynth.schemas.schema import EncodedBatch, Schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import MarginalCountsCombineFn, combine_globally
from beamsynth.transforms.noise import run_seed
from beamsynth.transforms.privbayes_measure import PrivBayesMeasureFn
from beamsynth.transforms.privbayes_model import (
    DEFAULT_SAMPLING,
    DEFAULT_SHRINK,
    SAMPLING_MODES,
    fit_privbayes,
)
from beamsynth.transforms.privbayes_plan import (
    DEFAULT_STRUCTURE_FRACTION,
    MAX_CANDIDATE_CELLS,
    gaussian_plan,
    plan_privbayes,
    resolve_noise,
    spend_privbayes,
)
from beamsynth.transforms.privbayes_star import resolve_target
from beamsynth.transforms.refine import (
    DEFAULT_REFINE_FRACTION,
    DEFAULT_REFINE_GROUPS,
    DEFAULT_REFINE_PAIRS,
    DEFAULT_REFINE_ROUNDS,
    DEFAULT_REFINE_TARGET_PICKS,
)
from beamsynth.transforms.synthesis import DPCount, SampleSynthetic, SynthesisModel

__all__ = [
    "DPPrivBayes",
    "PrivBayesSynthesizer",
    "ordered_columns",
]


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
    :func:`plan_privbayes`), noise (``"laplace"``, the default here: pure ε-DP; ``"gaussian"``:
    zCDP discrete Gaussian tables converted to ``budget``'s (ε, δ), :func:`gaussian_plan`;
    ``"auto"``: gaussian when ``budget.delta > 0``, :func:`resolve_noise`), target (a declared
    column name, the prediction target: with ``sizing="auto"`` the small-input model is the star
    around it, :mod:`~beamsynth.transforms.privbayes_star`; ``None``: no target), target_parent
    (how that target enters a k ≥ 1 network: ``"auto"``, the default, ``"off"``, ``"optional"``
    or ``"required"``, :func:`plan_privbayes`; decided here and carried in the plan),
    refine_target_picks (with a target: the refinement's first ``N`` picks drawn among its pairs
    only, or ``"auto"``: at least ``min(TARGET_FLOOR, pairs)`` of them, the last picks only where
    needed; :mod:`beamsynth.transforms.refine`; carried in the plan), accountant.
    """

    def __init__(self, *, schema: Schema, budget: ApproxDP, degree: int | None = None,
                 structure_fraction: float = DEFAULT_STRUCTURE_FRACTION, max_contributions: int = 1,
                 seed: int | None = None, shrink: float = DEFAULT_SHRINK,
                 sampling: str = DEFAULT_SAMPLING, max_candidate_cells: int = MAX_CANDIDATE_CELLS,
                 parents: str = "auto", refine_pairs: int = DEFAULT_REFINE_PAIRS,
                 refine_rounds: int = DEFAULT_REFINE_ROUNDS, refine_groups: int = DEFAULT_REFINE_GROUPS,
                 refine_fraction: float = DEFAULT_REFINE_FRACTION, sizing: str = "off",
                 rows: int | None = None, noise: str = "laplace", target: str | None = None,
                 target_parent: str = "auto",
                 refine_target_picks: int | str = DEFAULT_REFINE_TARGET_PICKS,
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
        target_index = resolve_target(target, schema.names)
        if target_index is not None and sizing != "auto":
            raise ValueError(f"target ({target!r}) is used by the small-input model of "
                             f"sizing='auto' only; got sizing={sizing!r}")
        self.plan = plan_privbayes(schema.shape, budget, degree=degree,
                                   structure_fraction=structure_fraction,
                                   max_contributions=max_contributions,
                                   max_candidate_cells=max_candidate_cells,
                                   parents=parents, names=schema.names,
                                   refine_pairs=refine_pairs, refine_rounds=refine_rounds,
                                   refine_groups=refine_groups, refine_fraction=refine_fraction,
                                   sizing=sizing, rows=rows, target=target_index,
                                   target_parent=target_parent,
                                   refine_target_picks=refine_target_picks)
        self.noise, self.noise_reason = resolve_noise(  # "auto": by δ and the declared width
            noise, budget.delta, n_columns=len(schema.shape), epsilon=budget.epsilon)
        if self.noise == "gaussian":  # zCDP (issue 18): needs δ > 0, refinement sized for it
            self.plan = gaussian_plan(self.plan, budget, pairs=refine_pairs,
                                      rounds=refine_rounds, groups=refine_groups)
        self._delta = budget.delta if self.plan.zcdp is not None else 0.0
        if accountant is not None:
            spend_privbayes(accountant, self.plan)
        # the target's (X, T, Π) counted where the plan's one gate keeps it (public rows that
        # close "useful"'s gate: the label-free families; H78, PrivBayesPlan.target_parent_at)
        self._families = self.plan.counted_families(schema.shape)
        self._seed, self._shrink = run_seed(seed), float(shrink)

    def display_data(self) -> dict[str, Any]:
        """Mechanism, ε split, δ, degree and declared sizes (never data values)."""
        plan = self.plan
        return display_items(
            mechanism="PrivBayes (permute-and-flip structure, discrete "
                      + ("Gaussian" if plan.zcdp is not None else "Laplace") + " tables"
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
        self.measured = measured  # its run-time choices (sizing_choices) feed API/YAML manifests
        # every choice of the fit from the plan, never a worker's module (H69, H78)
        return measured | "Fit" >> beam.Map(fit_privbayes, shape, names, shrink=shrink,
                                                sampling=sampling, **self.plan.fit_choices())
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
