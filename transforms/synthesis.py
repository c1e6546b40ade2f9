"""Synthesis from noisy measurements: models, the DP row count, and sharded parallel sampling.

Everything in this module after :class:`DPCount` and :class:`DPIndependentMarginals` is
post-processing: a :class:`SynthesisModel` is fitted from :class:`NoisyMarginal` values only and
sampling reads nothing but the model, so it costs no budget.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from beamsynth.schemas.schema import EncodedBatch, Schema
from beamsynth.schemas.tables import arrow_schema_for, label_part
from beamsynth.transforms.budget import ApproxDP, PureDP
from beamsynth.transforms.cathist import ColumnCells, DPCategoricalHistogram
from beamsynth.transforms.coders import register_columnar
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.measure import DPMarginals, NoisyMarginal, combine_globally, window_labels
from beamsynth.transforms.noise import (
    RandomSource,
    discrete_laplace,
    discrete_laplace_scale,
    run_seed,
    sample_categorical,
)

__all__ = [
    "DPCount",
    "DPIndependentMarginals",
    "IndependentModel",
    "NoisyCount",
    "SampleSynthetic",
    "SynthesisModel",
    "clip_and_normalize",
    "codes_to_table",
    "shard_label",
    "shard_plan",
]

DEFAULT_SHARD_ROWS = 50_000


# -- the DP row count ----------------------------------------------------------------------------
@dataclass(frozen=True)
class NoisyCount:
    """A released (DP) count of records: value + discrete Laplace(k/ε)."""

    value: int
    scale: float
    budget: ApproxDP

    @property
    def rows(self) -> int:
        """Post-processing: the count as a number of rows to synthesize (never negative)."""
        return max(0, int(self.value))


class _CountRowsFn(beam.CombineFn):
    def create_accumulator(self) -> int:
        return 0

    def add_input(self, acc: int, batch: EncodedBatch) -> int:
        return acc + len(batch)

    def merge_accumulators(self, accs: Iterable[int]) -> int:
        return sum(accs)

    def extract_output(self, acc: int) -> int:
        return acc


class _NoiseCountFn(beam.DoFn):
    def __init__(self, budget: ApproxDP, sensitivity: int, seed: int | None, step: str) -> None:
        self._budget, self._k, self._seed, self._step = budget, sensitivity, seed, step

    def process(self, count: int, window=beam.DoFn.WindowParam):
        rs = RandomSource(seed=self._seed).child(self._step, *window_labels(window))
        scale = discrete_laplace_scale(sensitivity=self._k, epsilon=self._budget.epsilon)
        yield NoisyCount(int(count) + int(discrete_laplace(rs, scale, 1)[0]), scale, self._budget)


@element_types(input=EncodedBatch, output=NoisyCount)
class DPCount(beam.PTransform):
    """ε-DP number of records: exact count + discrete Laplace of scale ``k/ε``.

    Sensitivity: one privacy unit adds or removes at most ``max_contributions`` (k) records.
    Input ``PCollection[EncodedBatch]``; output one :class:`NoisyCount` per window.
    """

    def __init__(self, *, budget: ApproxDP, max_contributions: int = 1, seed: int | None = None,
                 label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(budget, ApproxDP) or budget.delta != 0:
            raise ValueError(f"DPCount needs a pure ε budget, got {budget!r}")
        if isinstance(max_contributions, bool) or not isinstance(max_contributions, int) or max_contributions < 1:
            raise ValueError(f"max_contributions ({max_contributions!r}) must be an int >= 1")
        self._budget, self._k, self._seed = budget, max_contributions, run_seed(seed)

    def display_data(self) -> dict[str, Any]:
        """Mechanism, ε, δ, sensitivity and noise scale (never data values)."""
        return display_items(
            mechanism="DP count (discrete Laplace)", epsilon=self._budget.epsilon, delta=0.0,
            sensitivity=self._k,
            noise_scale=discrete_laplace_scale(sensitivity=self._k, epsilon=self._budget.epsilon))

    def expand(self, batches):
        counts = combine_globally(batches, _CountRowsFn(), "CountRows")
        # int per window
        return counts | "NoiseCount" >> beam.ParDo(_NoiseCountFn(self._budget, self._k, self._seed, "count"))
        # NoisyCount per window


# -- models ---------------------------------------------------------------------------------------
class SynthesisModel(ABC):
    """A fitted generative model over a schema's cells (post-processing of DP measurements)."""

    @property
    @abstractmethod
    def shape(self) -> tuple[int, ...]:
        """Cells per column."""

    @abstractmethod
    def sample_codes(self, n: int, rs: RandomSource) -> np.ndarray:
        """``n`` synthetic rows as an ``(n, columns)`` int64 array of cell indices."""

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary for manifests and reports."""
        return {"model": type(self).__name__}


def clip_and_normalize(values: np.ndarray) -> np.ndarray:
    """Post-processing of a noisy table into a distribution: negatives to 0, then normalize.

    An all-non-positive table becomes uniform (nothing can be learned from it).
    """
    v = np.clip(np.asarray(values, dtype=np.float64), 0.0, None)
    total = v.sum()
    if total <= 0:
        return np.full(v.shape, 1.0 / v.size)
    return v / total


class IndependentModel(SynthesisModel):
    """Each column sampled independently from its clipped, normalized noisy 1-way marginal.

    ``sparse`` maps the position of an open column to its released CatHist histogram as
    ``(cells, counts)``; such a column is sampled from those cells in proportion to the counts
    (uniformly over its ``shape[j]`` cells when nothing was released), never densified.
    """

    def __init__(self, marginals: Sequence[NoisyMarginal], shape: Sequence[int],
                 sparse: Mapping[int, tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self._shape = tuple(int(s) for s in shape)
        self._sparse = {int(j): (np.asarray(c, np.int64), np.asarray(w, np.float64))
                        for j, (c, w) in (sparse or {}).items()}
        probs: list[np.ndarray | None] = [None] * len(self._shape)
        for m in marginals:
            if len(m.columns) != 1:
                raise ValueError(f"IndependentModel takes 1-way marginals, got {m.names}")
            probs[m.columns[0]] = clip_and_normalize(m.values)
        missing = [i for i, p in enumerate(probs) if p is None and i not in self._sparse]
        if missing:
            raise ValueError(f"no marginal for column positions {missing}")
        self._probs = probs

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def probabilities(self) -> list[np.ndarray]:
        """Per-column cell probabilities (dense columns only; open columns are sparse)."""
        return [p.copy() for p in self._probs if p is not None]

    def sample_codes(self, n: int, rs: RandomSource) -> np.ndarray:
        out = np.empty((n, len(self._shape)), dtype=np.int64)
        for j, p in enumerate(self._probs):
            crs = rs.child("column", j)
            if p is not None:
                out[:, j] = sample_categorical(crs, p, n)
                continue
            cells, weights = self._sparse[j]
            if cells.size == 0 or weights.sum() <= 0:
                out[:, j] = crs.integers(self._shape[j], n)
            else:
                out[:, j] = cells[sample_categorical(crs, weights, n)]
        return out

    def describe(self) -> dict[str, Any]:
        return {"model": "independent marginals", "columns": len(self._shape)}


@element_types(input=EncodedBatch, output=SynthesisModel)
class DPIndependentMarginals(beam.PTransform):
    """The ``independent`` mechanism's measurement: ε-DP 1-way marginals of every column.

    The budget is split equally over the columns (sequential composition); each table gets
    discrete Laplace noise of scale ``k/ε_col`` on every declared cell (Adult: 14 tables).
    Open columns (``Column.is_open``: huge declared domain + tolerance ρ) are released with
    CatHist (:class:`~beamsynth.transforms.cathist.DPCategoricalHistogram`, ε_col-DP, seed 000)
    instead, never as a dense table.
    Output: one :class:`IndependentModel` per window (fitting is post-processing).
    """

    def __init__(self, *, schema: Schema, budget: ApproxDP, max_contributions: int = 1,
                 seed: int | None = None, label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(schema, Schema):
            raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
        per_column = budget.split({c.name: 1.0 for c in schema.columns})
        self._schema = schema
        self._epsilon, self._k = budget.epsilon, max_contributions
        closed = [j for j, c in enumerate(schema.columns) if not c.is_open]
        self._measure = None if not closed else DPMarginals(
            specs=[(j,) for j in closed],
            shape=schema.shape,
            names=schema.names,
            budgets=[per_column[schema.columns[j].name] for j in closed],
            max_contributions=max_contributions,
            seed=seed,
        )
        self._open = {
            j: DPCategoricalHistogram(
                domain=ColumnCells(c), budget=PureDP(epsilon=per_column[c.name].epsilon),
                tolerance=c.tolerance, max_contributions=max_contributions, column=j, seed=seed,
                label=f"CatHist[{c.name}]")
            for j, c in enumerate(schema.columns) if c.is_open
        }

    def display_data(self) -> dict[str, Any]:
        """Mechanism, ε, δ, per-column noise scale and declared cells (never data values)."""
        m = len(self._schema.columns)
        return display_items(
            mechanism="independent 1-way marginals (discrete Laplace; CatHist for open columns)",
            epsilon=self._epsilon, delta=0.0, columns=m, open_columns=len(self._open),
            epsilon_per_column=self._epsilon / m, sensitivity=self._k,
            noise_scale=discrete_laplace_scale(sensitivity=self._k, epsilon=self._epsilon / m),
            declared_cells=sum(self._schema.shape))

    def expand(self, batches):
        shape = self._schema.shape
        if not self._open:
            return (
                batches
                | "Measure1Way" >> self._measure
                # tuple[NoisyMarginal, ...]
                | "Fit" >> beam.Map(lambda ms: IndependentModel(ms, shape))
                # IndependentModel
            )
        parts = []
        if self._measure is not None:
            parts.append(batches | "Measure1Way" >> self._measure
                         | "KeyMarginals" >> beam.Map(lambda ms: (0, ("marginals", ms))))
            # (0, ("marginals", tuple[NoisyMarginal, ...]))
        for j, hist in self._open.items():
            parts.append(batches | f"Measure{hist.label}" >> hist
                         | f"Key{hist.label}" >> beam.Map(lambda h, j=j: (0, (j, h))))
            # (0, (column position, ReleasedHistogram))
        return (
            tuple(parts)
            | "JoinMeasurements" >> beam.Flatten()
            | "GroupMeasurements" >> beam.GroupByKey()
            # (0, Iterable[(tag, measurement)]) per window
            | "Fit" >> beam.Map(_fit_independent, shape)
            # IndependentModel
        )


def _fit_independent(keyed: tuple[int, Iterable[tuple[Any, Any]]], shape: Sequence[int]) -> IndependentModel:
    """Post-processing: dense marginals and CatHist releases of one window → IndependentModel."""
    marginals: tuple[NoisyMarginal, ...] = ()
    sparse = {}
    for tag, value in keyed[1]:
        if tag == "marginals":
            marginals = value
        else:
            sparse[tag] = (value.cells, value.counts)
    return IndependentModel(marginals, shape, sparse=sparse)


# -- sampling -------------------------------------------------------------------------------------
def shard_plan(rows: int, shard_rows: int = DEFAULT_SHARD_ROWS) -> list[tuple[int, int]]:
    """(shard id, rows) pairs covering ``rows`` in shards of at most ``shard_rows``."""
    if rows <= 0:
        return []
    shards = math.ceil(rows / shard_rows)
    base, extra = divmod(rows, shards)
    return [(i, base + (1 if i < extra else 0)) for i in range(shards)]


def codes_to_table(schema: Schema, codes: np.ndarray, rs: RandomSource | None) -> pa.Table:
    """Decode cell codes into a pyarrow Table (numeric bins draw values inside the bin)."""
    cols = {}
    for j, c in enumerate(schema.columns):
        cols[c.name] = c.decode(codes[:, j], None if rs is None else rs.child("decode", j))
    return pa.Table.from_pydict(cols, schema=arrow_schema_for(schema))


register_columnar(pa.Table)  # synthetic shards: size estimates without pickling


@beam.typehints.with_output_types(pa.Table)
class _SampleShardFn(beam.DoFn):
    def __init__(self, schema: Schema, seed: int | None) -> None:
        self._schema, self._seed = schema, seed

    def process(self, shard, model, window=beam.DoFn.WindowParam):
        shard_id, n = shard
        yield _sample_shard(self._schema, self._seed, shard_id, n, model, window)


@beam.typehints.with_output_types(pa.Table)
class _SampleShardWithModelFn(_SampleShardFn):
    """Side-input-free form: elements are ``(shard_id, rows, model)``."""

    def process(self, shard, window=beam.DoFn.WindowParam):
        shard_id, n, model = shard
        yield _sample_shard(self._schema, self._seed, shard_id, n, model, window)


def _sample_shard(schema: Schema, seed: int | None, shard_id: int, n: int, model: SynthesisModel,
                  window: Any) -> pa.Table:
    labels = window_labels(window)
    rs = RandomSource(seed=seed).child("sample", shard_id, *labels)
    codes = model.sample_codes(n, rs.child("codes"))
    table = codes_to_table(schema, codes, rs.child("values"))
    # the shard's identity orders it in a single-file output (pipelines/io/single_file.py)
    return label_part(table, shard_label(shard_id, labels))


def shard_label(shard_id: int, labels: Sequence[Any]) -> str:
    """Sortable identity of a sampling shard: window labels, then the zero-padded shard id."""
    parts = [f"{v:020d}" if isinstance(v, int) else str(v) for v in labels]
    return "/".join([*parts, f"{shard_id:012d}"])


@element_types(input=tuple[SynthesisModel, int], output=pa.Table)
class SampleSynthetic(beam.PTransform):
    """Sample synthetic rows from a model in parallel shards (post-processing, no budget).

    Input: ``PCollection[(SynthesisModel, rows)]`` with one element per window. Output:
    ``PCollection[pyarrow.Table]``, about ``shard_rows`` rows per element. Shard ``i`` draws from the
    stream ``(seed, "sample", i, window)``, so seeded output does not depend on the runner; each
    table carries the label :func:`shard_label` (window, shard), by which a single-file
    ``WriteTables`` orders its rows, so the file is byte-identical on every runner.

    ``side_input=False`` sends the model inside every shard element instead of as a singleton
    side input: Beam's DaskRunner (2.77) feeds wrong side-input contents when the side input and
    the main input share an upstream ``GroupByKey`` (see docs/runners.md). Same output.
    """

    def __init__(self, *, schema: Schema, seed: int | None = None,
                 shard_rows: int = DEFAULT_SHARD_ROWS, side_input: bool = True,
                 label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(shard_rows, int) or shard_rows < 1:
            raise ValueError(f"shard_rows ({shard_rows!r}) must be an int >= 1")
        if not isinstance(side_input, bool):
            raise TypeError(f"side_input ({side_input!r}) must be a bool")
        self._schema, self._seed, self._shard_rows = schema, run_seed(seed), shard_rows
        self._side_input = side_input

    def display_data(self) -> dict[str, Any]:
        """What is sampled and how it is sharded (post-processing: no budget)."""
        return display_items(
            mechanism="sampling from a released model (post-processing, no budget)",
            columns=len(self._schema.columns), shard_rows=self._shard_rows,
            model_as_side_input=self._side_input)

    def expand(self, model_and_rows):
        shard_rows = self._shard_rows
        if not self._side_input:
            return (
                model_and_rows
                | "PlanShards" >> beam.FlatMap(
                    lambda mr: [(i, n, mr[0]) for i, n in shard_plan(int(mr[1]), shard_rows)])
                # (shard_id, rows, SynthesisModel)
                | "SpreadShards" >> beam.Reshuffle()
                | "SampleShard" >> beam.ParDo(_SampleShardWithModelFn(self._schema, self._seed))
                # pyarrow.Table
            )
        models = model_and_rows | "Model" >> beam.Map(lambda mr: mr[0])
        shards = (
            model_and_rows
            | "PlanShards" >> beam.FlatMap(lambda mr: shard_plan(int(mr[1]), shard_rows))
            # (shard_id, rows)
            | "SpreadShards" >> beam.Reshuffle()
        )
        return shards | "SampleShard" >> beam.ParDo(
            _SampleShardFn(self._schema, self._seed), beam.pvalue.AsSingleton(models)
        )
        # pyarrow.Table
