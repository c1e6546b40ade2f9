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
from beamsynth.transforms.consistency import norm_sub
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
    "FIT_MODES",
    "SAMPLING_MODES",
    "clip_and_normalize",
    "codes_to_table",
    "norm_sub_probabilities",
    "systematic_codes",
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

    def sample_shard(self, n: int, rs: RandomSource, *, shard: int, shards: int, total: int,
                     common: RandomSource) -> np.ndarray:
        """Shard ``shard`` of ``shards`` (``n`` of the ``total`` rows, :func:`shard_plan`'s sizes)
        as :meth:`sample_codes` codes. ``rs`` is the shard's own stream, ``common`` one every
        shard of the release shares. By default shards are drawn independently
        (``sample_codes(n, rs)``); a model that balances its rows over the whole release
        (:class:`IndependentModel`) overrides it."""
        del shard, shards, total, common
        return self.sample_codes(n, rs)

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


FIT_MODES = ("norm_sub", "clip")
SAMPLING_MODES = ("balanced", "iid")


def norm_sub_probabilities(marginals: Sequence[NoisyMarginal]) -> list[np.ndarray]:
    """Noisy 1-way tables → distributions with one common total (post-processing).

    The total is the inverse-variance weighted mean of the tables' sums (a table of ``C`` cells
    sums ``C`` noises: variance ``C·v``; public scales and declared sizes only), as PrivBayes'
    consistency step weighs totals (PriView, Qardaji et al. 2014 §4.2); each table is then
    Norm-Sub'd to it (:func:`~beamsynth.transforms.consistency.norm_sub`, PrivSyn, Zhang et al.
    2021 §4.2: ``max(v − δ, 0)``, removing the positive noise mass clipping keeps) and divided by
    it. A table Norm-Sub leaves empty (non-positive total or no positive cell) becomes uniform.
    """
    if not marginals:
        return []
    weights = np.array([1.0 / (max(m.variance, 1e-12) * m.values.size) for m in marginals])
    sums = np.array([float(np.asarray(m.values, dtype=np.float64).sum()) for m in marginals])
    total = max(float((weights * sums).sum() / weights.sum()), 0.0)
    out = []
    for m in marginals:
        t = norm_sub(m.values, total)
        s = t.sum()
        out.append(t / s if s > 0 else np.full(t.shape, 1.0 / t.size))
    return out


def systematic_codes(cdf: np.ndarray | None, cells: int, n: int, *, shard: int, shards: int,
                     total: int, offset: float) -> np.ndarray:
    """Shard ``shard``'s share of one systematic sample of ``total`` points (post-processing).

    The release's points are ``(k + offset)/total`` for ``k < total``, inverted through ``cdf``
    (``None``: uniform over ``cells`` cells, never densified); shard ``i`` of ``shards`` takes
    the points ``k ≡ i (mod shards)``, which are :func:`shard_plan`'s ``n`` rows. So over all
    shards every cell ``c`` gets ``⌊total·p_c⌋`` or ``⌈total·p_c⌉`` rows, and each shard about
    ``n·p_c`` (its own points are a systematic sample too). Returned sorted by cell.
    """
    if n != len(range(shard, total, shards)):
        raise ValueError(f"shard {shard} of {shards} over {total} rows has "
                         f"{len(range(shard, total, shards))} rows, not {n}")
    u = (shard + shards * np.arange(n, dtype=np.float64) + offset) / max(total, 1)
    if cdf is None:
        return np.minimum((u * cells).astype(np.int64), cells - 1)
    return np.minimum(np.searchsorted(cdf, u, side="right"), cdf.size - 1).astype(np.int64)


class IndependentModel(SynthesisModel):
    """Columns sampled independently from their released 1-way marginals (post-processing).

    ``fit``: ``"norm_sub"`` (default; :func:`norm_sub_probabilities`) or ``"clip"`` (negatives to
    0, then normalized: :func:`clip_and_normalize`, the release before the seventeenth
    session). ``sampling``: ``"balanced"`` (default; each column a systematic sample of its
    distribution over the whole release, :func:`systematic_codes`, in a uniformly random row
    order per column and shard: the synthetic rows' 1-way margins are the model's to within one
    row per cell, as PrivBayes' balanced sampling of a network without parents) or ``"iid"``
    (independent draws per row).

    ``sparse`` maps the position of an open column to its released CatHist histogram as
    ``(cells, counts)``; such a column is sampled from those cells in proportion to the counts
    (uniformly over its ``shape[j]`` cells when nothing was released), never densified.
    """

    def __init__(self, marginals: Sequence[NoisyMarginal], shape: Sequence[int],
                 sparse: Mapping[int, tuple[np.ndarray, np.ndarray]] | None = None, *,
                 fit: str = "norm_sub", sampling: str = "balanced") -> None:
        if fit not in FIT_MODES:
            raise ValueError(f"fit ({fit!r}) must be one of {FIT_MODES}")
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling ({sampling!r}) must be one of {SAMPLING_MODES}")
        self._fit, self._sampling = fit, sampling
        self._shape = tuple(int(s) for s in shape)
        self._sparse = {int(j): (np.asarray(c, np.int64), np.asarray(w, np.float64))
                        for j, (c, w) in (sparse or {}).items()}
        probs: list[np.ndarray | None] = [None] * len(self._shape)
        for m in marginals:
            if len(m.columns) != 1:
                raise ValueError(f"IndependentModel takes 1-way marginals, got {m.names}")
        fitted = (norm_sub_probabilities(marginals) if fit == "norm_sub"
                  else [clip_and_normalize(m.values) for m in marginals])
        for m, p in zip(marginals, fitted):
            probs[m.columns[0]] = p
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
        return self.sample_shard(n, rs, shard=0, shards=1, total=n, common=rs.child("common"))

    def sample_shard(self, n: int, rs: RandomSource, *, shard: int, shards: int, total: int,
                     common: RandomSource) -> np.ndarray:
        """Balanced: shard ``shard``'s points of every column's systematic sample over the
        ``total`` rows (offset from ``common``, shared by the shards), rows shuffled per column
        from ``rs``; i.i.d.: independent draws from ``rs`` (the shard's size only)."""
        out = np.empty((n, len(self._shape)), dtype=np.int64)
        for j, p in enumerate(self._probs):
            crs = rs.child("column", j)
            cells, weights = self._sparse.get(j, (None, None))
            uniform = p is None and (cells.size == 0 or weights.sum() <= 0)
            if self._sampling == "iid":
                if uniform:
                    out[:, j] = crs.integers(self._shape[j], n)
                else:
                    drawn = sample_categorical(crs, p if p is not None else weights, n)
                    out[:, j] = drawn if p is not None else cells[drawn]
                continue
            cdf = None
            if not uniform:
                cdf = np.cumsum(p if p is not None else weights / weights.sum())
                cdf[-1] = 1.0
            offset = float(common.child("offset", j).uniform(1)[0])
            codes = systematic_codes(cdf, self._shape[j], n, shard=shard, shards=shards,
                                     total=total, offset=offset)
            # a uniformly random row order (post-processing draws: numpy_generator's O(n) shuffle)
            crs.child("order").numpy_generator().shuffle(codes)
            out[:, j] = codes if p is not None or uniform else cells[codes]
        return out

    def describe(self) -> dict[str, Any]:
        return {"model": "independent marginals", "columns": len(self._shape),
                "fit": self._fit, "sampling": self._sampling}


@element_types(input=EncodedBatch, output=SynthesisModel)
class DPIndependentMarginals(beam.PTransform):
    """The ``independent`` mechanism's measurement: ε-DP 1-way marginals of every column.

    The budget is split equally over the columns (sequential composition); each table gets
    discrete Laplace noise of scale ``k/ε_col`` on every declared cell (Adult: 14 tables).
    Open columns (``Column.is_open``: huge declared domain + tolerance ρ) are released with
    CatHist (:class:`~beamsynth.transforms.cathist.DPCategoricalHistogram`, ε_col-DP, seed 000)
    instead, never as a dense table.
    Output: one :class:`IndependentModel` per window (fitting is post-processing; ``fit`` and
    ``sampling``: :class:`IndependentModel`'s, Norm-Sub and balanced by default).
    """

    def __init__(self, *, schema: Schema, budget: ApproxDP, max_contributions: int = 1,
                 seed: int | None = None, fit: str = "norm_sub", sampling: str = "balanced",
                 label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(schema, Schema):
            raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
        if fit not in FIT_MODES:
            raise ValueError(f"fit ({fit!r}) must be one of {FIT_MODES}")
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling ({sampling!r}) must be one of {SAMPLING_MODES}")
        self._modes = {"fit": fit, "sampling": sampling}
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

    @property
    def modes(self) -> dict[str, str]:
        """``{"fit": ..., "sampling": ...}``: how the released tables are fitted and sampled
        (post-processing), for the manifests of the methods that use this measurement."""
        return dict(self._modes)

    def display_data(self) -> dict[str, Any]:
        """Mechanism, ε, δ, per-column noise scale and declared cells (never data values)."""
        m = len(self._schema.columns)
        return display_items(
            mechanism="independent 1-way marginals (discrete Laplace; CatHist for open columns)",
            epsilon=self._epsilon, delta=0.0, columns=m, open_columns=len(self._open),
            epsilon_per_column=self._epsilon / m, sensitivity=self._k, **self._modes,
            noise_scale=discrete_laplace_scale(sensitivity=self._k, epsilon=self._epsilon / m),
            declared_cells=sum(self._schema.shape))

    def expand(self, batches):
        shape = self._schema.shape
        if not self._open:
            return (
                batches
                | "Measure1Way" >> self._measure
                # tuple[NoisyMarginal, ...]
                | "Fit" >> beam.Map(lambda ms, modes: IndependentModel(ms, shape, **modes), self._modes)
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
            | "Fit" >> beam.Map(_fit_independent, shape, self._modes)
            # IndependentModel
        )


def _fit_independent(keyed: tuple[int, Iterable[tuple[Any, Any]]], shape: Sequence[int],
                     modes: Mapping[str, str]) -> IndependentModel:
    """Post-processing: dense marginals and CatHist releases of one window → IndependentModel."""
    marginals: tuple[NoisyMarginal, ...] = ()
    sparse = {}
    for tag, value in keyed[1]:
        if tag == "marginals":
            marginals = value
        else:
            sparse[tag] = (value.cells, value.counts)
    return IndependentModel(marginals, shape, sparse=sparse, **modes)


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
        shard_id, n, shards, total = shard
        yield _sample_shard(self._schema, self._seed, shard_id, n, model, window,
                            shards=shards, total=total)


@beam.typehints.with_output_types(pa.Table)
class _SampleShardWithModelFn(_SampleShardFn):
    """Side-input-free form: elements are ``(shard_id, rows, shards, total, model)``."""

    def process(self, shard, window=beam.DoFn.WindowParam):
        shard_id, n, shards, total, model = shard
        yield _sample_shard(self._schema, self._seed, shard_id, n, model, window,
                            shards=shards, total=total)


def _plan_shards(rows: int, shard_rows: int) -> list[tuple[int, int, int, int]]:
    """``(shard id, rows, shards, total rows)`` of :func:`shard_plan` (public: the DP count)."""
    plan = shard_plan(rows, shard_rows)
    return [(i, n, len(plan), rows) for i, n in plan]


def _sample_shard(schema: Schema, seed: int | None, shard_id: int, n: int, model: SynthesisModel,
                  window: Any, *, shards: int = 1, total: int | None = None) -> pa.Table:
    labels = window_labels(window)
    rs = RandomSource(seed=seed).child("sample", shard_id, *labels)
    # the shards' common stream (a balanced model's offsets): the step and window, no shard
    common = RandomSource(seed=seed).child("sample-common", *labels)
    codes = model.sample_shard(n, rs.child("codes"), shard=shard_id, shards=shards,
                               total=n if total is None else total, common=common)
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
    stream ``(seed, "sample", i, window)`` and every shard of a window shares the stream
    ``(seed, "sample-common", window)`` (a balanced model's offsets, :meth:`SynthesisModel.sample_shard`;
    the shard sizes and count come from the row count alone), so seeded output does not depend on
    the runner or on recomputation; each
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
                    lambda mr: [(*p, mr[0]) for p in _plan_shards(int(mr[1]), shard_rows)])
                # (shard_id, rows, shards, total rows, SynthesisModel)
                | "SpreadShards" >> beam.Reshuffle()
                | "SampleShard" >> beam.ParDo(_SampleShardWithModelFn(self._schema, self._seed))
                # pyarrow.Table
            )
        models = model_and_rows | "Model" >> beam.Map(lambda mr: mr[0])
        shards = (
            model_and_rows
            | "PlanShards" >> beam.FlatMap(lambda mr: _plan_shards(int(mr[1]), shard_rows))
            # (shard_id, rows, shards, total rows)
            | "SpreadShards" >> beam.Reshuffle()
        )
        return shards | "SampleShard" >> beam.ParDo(
            _SampleShardFn(self._schema, self._seed), beam.pvalue.AsSingleton(models)
        )
        # pyarrow.Table
