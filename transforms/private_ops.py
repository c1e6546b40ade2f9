"""Measurement mechanisms of the public API, applied to a :class:`PrivateCollection`.

Each class spends its own ε share on the job's accountant when it is applied (build time) and
returns schema'd ``beam.Row``s (:mod:`beamsynth.transforms.outputs`), or with ``typed=True`` the
typed releases (``NoisyCount``, ``tuple[NoisyMarginal, ...]``, ``ReleasedHistogram``,
``LevelRelease``) for advanced use. Neighbours: add/remove one privacy unit of at most ``k =
max_contributions`` records (bounded once by ``MakePrivate``). Every release is over the global
window, one per pipeline run, or once per declared window when the private collection has
declared windows (``job.private(schema, windows=bs.DeclaredWindows(...))``): then every output row
starts with ``window_start`` (ISO 8601 UTC) and stays in its Beam window, and the ε holds per
window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import apache_beam as beam

from beamsynth.schemas.keys import KeyCodec
from beamsynth.schemas.schema import EncodedBatch, Schema
from beamsynth.transforms.cathist import ColumnCells, DPCategoricalHistogram
from beamsynth.transforms.conventions import NotAPCollectionError
from beamsynth.transforms.measure import DPMarginals, NoisyMarginal
from beamsynth.transforms.outputs import (
    COUNT_TYPE,
    TREE_TYPE,
    count_row,
    histogram_rows,
    histogram_type,
    key_rows,
    key_type,
    level_order,
    marginal_rows,
    marginal_type,
    table_order,
    tree_rows,
)
from beamsynth.transforms.prefix_decode import DecodeLeaves
from beamsynth.transforms.prefix_levels import (
    DPBasicPrefixHistogram,
    DPDirectPrefixSynthesis,
    DPImprovedPrefixHistogram,
)
from beamsynth.transforms.prefix_tree import DISCOUNTS
from beamsynth.transforms.private import (
    WINDOW_FIELD,
    PrivateCollection,
    PrivateTransform,
    names_of,
    pure,
    release_rows,
    window_row_type,
)
from beamsynth.transforms.synthesis import DPCount, NoisyCount
from beamsynth.transforms.windows import iso_seconds

__all__ = ["MAX_MARGINAL_CELLS", "Count", "Histogram", "Marginals", "PrefixTree"]

MAX_MARGINAL_CELLS = 50_000_000  # cells of one dense noisy table


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} ({value!r}) must be True or False")
    return value


def _check_label(label: Any) -> str | None:
    if label is not None and (not isinstance(label, str) or not label):
        raise ValueError(f"label ({label!r}) must be None or a non-empty string")
    return label


class Count(PrivateTransform):
    """ε-DP number of records: exact count + discrete Laplace of scale ``k/ε``.

    Sensitivity ``k`` (records per privacy unit); ε-DP, δ = 0 (Laplace mechanism on integers,
    Dwork et al. 2006). Output: one ``beam.Row(noisy_count: int)`` (``typed=True``: one
    :class:`~beamsynth.transforms.synthesis.NoisyCount`).
    """

    mechanism = "discrete Laplace on the record count"

    def __init__(self, *, epsilon: float, typed: bool = False, label: str | None = None) -> None:
        super().__init__(_check_label(label))
        self._budget = pure(epsilon)
        self._typed = _check_bool("typed", typed)
        self.with_input_types(EncodedBatch)
        self.with_output_types(NoisyCount if typed else COUNT_TYPE)

    def default_label(self) -> str:
        return "Count"

    def display_data(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "epsilon": self._budget.epsilon, "delta": 0.0,
                "scale": getattr(self, "_scale", "unbound")}

    def bind(self, private: PrivateCollection) -> None:
        k = private.max_contributions
        self._scale = k / self._budget.epsilon
        details = {"sensitivity": k, "scale": self._scale, "noise": "discrete Laplace",
                   "paper": "Laplace mechanism (Dwork et al. 2006), discrete form"}
        private.job.spend(self.label, self._budget, mechanism=self.mechanism, details=details)
        self.record(details)
        if not self._typed and private.windows is not None:
            self.with_output_types(window_row_type(COUNT_TYPE))

    def expand(self, batches):
        p = self.private
        counts = batches | "DPCount" >> DPCount(
            budget=self._budget, max_contributions=p.max_contributions,
            seed=p.job.step_seed(self.label))
        # NoisyCount (one per window: global or declared)
        if self._typed:
            return counts
        return counts | "ToRow" >> release_rows(p, _count_rows, row_type=COUNT_TYPE)
        # beam.Row([window_start,] noisy_count)


def _count_rows(noisy_count: NoisyCount) -> list[beam.Row]:
    return [count_row(noisy_count)]


def _marginal_key(names: Sequence[str]) -> str:
    return ",".join(names)


class Marginals(PrivateTransform):
    """ε-DP k-way marginal tables, all measured in one pass over the data.

    Args:
      marginals: column-name tuples, e.g. ``[("age", "sex"), ("workclass",)]``.
      epsilon: total ε of the tables, split equally (sequential composition).
      typed: return ``tuple[NoisyMarginal, ...]`` instead of rows.

    Each table has L1 sensitivity ``k`` and discrete Laplace noise of scale ``k/ε_i`` on every
    declared cell (empty cells included): ``Σ ε_i = ε``-DP, δ = 0. Output: a dict from
    ``"age,sex"`` (names joined by commas) to a ``PCollection[beam.Row]`` with one row per cell,
    ``(age, sex, noisy_count)``; the number of rows is the declared domain size (public).
    """

    mechanism = "discrete Laplace on k-way marginals"

    def __init__(self, *, marginals: Sequence[Sequence[str]], epsilon: float, typed: bool = False,
                 label: str | None = None) -> None:
        super().__init__(_check_label(label))
        if isinstance(marginals, (str, bytes)) or not isinstance(marginals, Sequence) or not marginals:
            raise ValueError(f"marginals ({marginals!r}) must be a non-empty list of column-name "
                             "tuples, e.g. [('age', 'sex')]")
        specs = []
        for m in marginals:
            if isinstance(m, str):
                m = (m,)
            if not isinstance(m, Sequence) or not m or len(set(m)) != len(m):
                raise ValueError(f"marginal {m!r} must be a non-empty tuple of distinct column names")
            specs.append(tuple(m))
        if len({_marginal_key(s) for s in specs}) != len(specs):
            raise ValueError(f"marginals ({marginals!r}) repeat a table")
        self._names = specs
        self._budget = pure(epsilon)
        self._typed = _check_bool("typed", typed)
        self.with_input_types(EncodedBatch)

    def default_label(self) -> str:
        return "Marginals"

    def display_data(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "epsilon": self._budget.epsilon, "delta": 0.0,
                "tables": len(self._names), "scale": getattr(self, "_scale", "unbound")}

    def bind(self, private: PrivateCollection) -> None:
        schema = private.schema
        self._specs = [tuple(names_of(schema, s, f"{self.label} marginal {s!r}")) for s in self._names]
        for names, spec in zip(self._names, self._specs):
            cells = math.prod(schema.shape[c] for c in spec)
            if cells > MAX_MARGINAL_CELLS:
                raise ValueError(f"{self.label}: marginal {names!r} has {cells} cells, more than a "
                                 f"dense noisy table holds ({MAX_MARGINAL_CELLS}); use fewer or "
                                 "coarser columns, or bs.Histogram for one huge column")
        k, each = private.max_contributions, self._budget.epsilon / len(self._specs)
        self._scale = k / each
        details = {"tables": [list(n) for n in self._names], "epsilon_per_table": each,
                   "sensitivity_per_table": k, "scale": self._scale, "noise": "discrete Laplace",
                   "cells": [math.prod(schema.shape[c] for c in s) for s in self._specs],
                   "paper": "Laplace mechanism on marginals (Dwork et al. 2006); PrivBayes §3 (seed 004)"}
        private.job.spend(self.label, self._budget, mechanism=self.mechanism, details=details)
        self.record(details)

    def expand(self, batches):
        p = self.private
        schema = p.schema
        each = self._budget.split({str(i): 1.0 for i in range(len(self._specs))})
        tables = batches | "DPMarginals" >> DPMarginals(
            specs=self._specs, shape=schema.shape, names=schema.names,
            budgets=[each[str(i)] for i in range(len(self._specs))],
            max_contributions=p.max_contributions, seed=p.job.step_seed(self.label),
            stream=self.label)
        # tuple[NoisyMarginal, ...] (one per window: global or declared)
        if self._typed:
            return tables
        keys = [_marginal_key(names) for names in self._names]
        windowed = p.windows is not None
        rows = tables | "Rows" >> beam.ParDo(_MarginalRowsFn(schema, keys, windowed)).with_outputs(
            *keys)
        # one output per table: beam.Row([window_start,] labels..., noisy_count) per declared cell
        out = _Tables()
        for key, names in zip(keys, self._names):
            row_type = marginal_type(schema, names)
            out[key] = rows[key]
            out[key].element_type = window_row_type(row_type) if windowed else row_type
        return out


class _Tables(dict):
    """``Marginals``' output: a missing key names the tables there are and how to ask for one."""

    _whose, _var = "bs.Marginals' output is a dict of tables", "tables"

    def __missing__(self, key: Any) -> Any:
        if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
            joined = ",".join(key)  # tables[("sex", "income")]: the tuple given to marginals=
            if joined in self:
                return self[joined]
        raise KeyError(f"no marginal table {key!r}; the tables are {sorted(self)} (a key is the "
                       "column names joined by commas, or their tuple; marginals=('a', 'b') asks "
                       "for two one-way tables, [('a', 'b')] for one two-way table)")

    def __or__(self, step: Any) -> Any:
        """A Beam step on the whole dict: refused naming the tables (Beam said ``'_Tables'
        object has no attribute 'is_bounded'``)."""
        if not isinstance(getattr(step, "transform", step), beam.PTransform):
            return super().__or__(step)
        raise TypeError(f"{step.label}: {self._pick()}")

    def _pick(self) -> str:
        return (f"{self._whose} (one PCollection each): apply Beam's steps to one of them, "
                + " or ".join(f"{self._var}[{k!r}]" for k in sorted(self)))

    @property
    def element_type(self) -> Any:
        """Refused naming the outputs: Beam asks for it in ``to_dataframe(tables)`` and side
        inputs (it said ``'_Tables' object has no attribute 'element_type'``)."""
        raise NotAPCollectionError(f"to_dataframe, side inputs: {self._pick()}")

    @property
    def windowing(self) -> Any:
        """Refused like :attr:`element_type` (``beam.pvalue.AsList(tables)``)."""
        return self.element_type


class _TreeOutputs(_Tables):
    """``PrefixTree``'s output: ``keys`` and ``tree``, refused whole by a Beam step (as above)."""

    _whose, _var = "bs.PrefixTree's output is a dict of two outputs", "tree"

    def __missing__(self, key: Any) -> Any:
        raise KeyError(f"no bs.PrefixTree output {key!r}; its outputs are ['keys', 'tree'] "
                       "(synthetic keys as rows, and the released nodes)")


class _MarginalRowsFn(beam.DoFn):
    """Released tables → rows, table ``i`` to the output tagged ``keys[i]``: one step for all the
    tables of a release (a step per table cost ~35 ms of pipeline construction and startup each),
    with ``window_start`` first under declared windows (as :func:`release_rows`)."""

    def __init__(self, schema: Schema, keys: Sequence[str], windowed: bool) -> None:
        self._schema, self._keys, self._windowed = schema, list(keys), windowed

    def process(self, tables: tuple[NoisyMarginal, ...], window=beam.DoFn.WindowParam):
        start = {WINDOW_FIELD: iso_seconds(window.start)} if self._windowed else None
        for key, table in zip(self._keys, tables):
            for row in marginal_rows(table, self._schema):
                if start is not None:
                    row = beam.Row(**start, **row._asdict())
                yield beam.pvalue.TaggedOutput(key, row)


class Histogram(PrivateTransform):
    """ε-DP histogram of one column over its declared (possibly huge) domain: CatHist (seed 000).

    Args:
      column: the column (declared in the schema; nullable columns count null as a value).
      epsilon: ε of the release.
      tolerance: ρ in (0, 1), the probability that nothing outside the data is released on empty
        data (default: the column's declared ``open.tolerance``).
      typed: return :class:`~beamsynth.transforms.cathist.ReleasedHistogram` instead of rows.

    Discrete Laplace of scale ``k/ε`` on every declared bin (empty bins simulated exactly), bins
    kept iff their noisy count ≥ τ(ε, k, ρ, n): ε-DP, δ = 0 (seed 000, §3, Algorithm 1). Output:
    ``beam.Row(<column>, noisy_count)`` per released value, largest counts first.
    """

    mechanism = "CatHist: discrete Laplace on every declared bin, keep ≥ τ"

    def __init__(self, *, column: str, epsilon: float, tolerance: float | None = None,
                 typed: bool = False, label: str | None = None) -> None:
        super().__init__(_check_label(label))
        if not isinstance(column, str) or not column:
            raise ValueError(f"column ({column!r}) must be a column name")
        if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(
                tolerance, (int, float)) or not 0 < tolerance < 1):
            raise ValueError(f"tolerance ({tolerance!r}) must be None or in (0, 1)")
        self._column, self._tolerance = column, tolerance
        self._budget = pure(epsilon)
        self._typed = _check_bool("typed", typed)
        self.with_input_types(EncodedBatch)

    def default_label(self) -> str:
        return f"Histogram[{self._column}]"

    def display_data(self) -> dict[str, Any]:
        plan = getattr(self, "_hist", None)
        out = {"mechanism": self.mechanism, "epsilon": self._budget.epsilon, "delta": 0.0,
               "column": self._column}
        if plan is not None:
            out.update({"tau": plan.plan.tau, "scale": plan.plan.scale,
                        "domain_size": str(plan.plan.domain_size)})
        return out

    def bind(self, private: PrivateCollection) -> None:
        schema = private.schema
        j = names_of(schema, [self._column], self.label)[0]
        col = schema.columns[j]
        tolerance = self._tolerance if self._tolerance is not None else col.tolerance
        if tolerance is None:
            raise ValueError(f"{self.label}: pass tolerance=ρ in (0, 1); column {col.name!r} "
                             "declares no open.tolerance")
        self._col = col
        self._hist = DPCategoricalHistogram(
            domain=ColumnCells(col), budget=self._budget, tolerance=tolerance,
            max_contributions=private.max_contributions, column=j,
            seed=private.job.step_seed(self.label), label="CatHist")
        details = {"column": col.name, **self._hist.plan.details()}
        if not self._typed:
            row_type = histogram_type(col)
            self.with_output_types(row_type if private.windows is None else window_row_type(row_type))
        private.job.spend(self.label, self._budget, mechanism=self.mechanism, details=details)
        self.record(details)

    def expand(self, batches):
        released = batches | "CatHist" >> self._hist
        # ReleasedHistogram (one per window: global or declared)
        if self._typed:
            return released
        col = self._col
        return released | "Rows" >> release_rows(self.private, histogram_rows, col,
                                                 row_type=histogram_type(col))
        # beam.Row([window_start,] value, noisy_count) per released cell


_PREFIX = {"basic": DPBasicPrefixHistogram, "improved": DPImprovedPrefixHistogram,
           "direct": DPDirectPrefixSynthesis}
_PREFIX_OPTIONS = {  # which methods read an option (PrefixTree refuses it for the others)
    "max_depth": "it applies to method='basic' and 'direct' (improved is depth-free)",
    "discount": "it applies to method='improved' only",
    "threshold": "it applies to method='basic' and 'improved' (direct has no split threshold)",
    "restore_discount": "it applies to method='improved' only"}


_DIRECT_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")


def _refuse_streaming_direct_runner(label: str, batches: beam.PCollection) -> None:
    """Refuse a prefix tree on a stream run by Beam's Python DirectRunner, when built and before
    anything is spent: each level reads the level before as a per-window side input, and that
    runner (Beam 2.77, streaming) fails the side-input lookup of a bundle without elements
    (``'NoneType' object has no attribute 'max_timestamp'`` in its executor thread, which is
    not reported) and the pipeline then never finishes (H101: a TestStream job over declared
    days hung, twice; Count, Marginals, Histogram and the synthesizers ran)."""
    if batches.is_bounded:
        return
    names = {c.__name__ for c in type(batches.pipeline.runner).__mro__}
    if names & set(_DIRECT_RUNNERS):
        raise ValueError(
            f"{label}: a prefix tree on an unbounded input (a stream) does not run on Beam's "
            "DirectRunner: each level reads the one before as a side input, whose lookup that "
            "runner fails on an empty bundle, and the pipeline never ends (nothing was spent); "
            "run it on Flink, Spark or Dataflow, or release the tree from a bounded read of the "
            "same records (docs/streaming.md)")


class PrefixTree(PrivateTransform):
    """ε-DP prefix tree and synthetic keys of a declared text, spatial or hierarchy key (seed 003).

    Args:
      key: the name of a key declared in ``job.private(schema, keys={name: codec})``.
      epsilon: ε of the release.
      method: ``improved`` (default; §3, Theorem 3, depth-free), ``basic`` (§2.3, Corollary 2) or
        ``direct`` (§4, direct synthesis with Center).
      max_depth: basic/direct only: levels measured (default: the key's depth).
      discount: improved only: ``proportional`` (default), ``skip`` or ``uniform``.
      threshold: basic/improved only: split threshold b (default from public parameters).
      restore_discount: improved only: give the discounted records back to the leaves
        (post-processing).

    An option the chosen method does not use is refused (``ValueError``), never ignored.
      typed: return ``LevelRelease`` elements instead of rows.

    Discrete Laplace noise; ε-DP, δ = 0 for add/remove of one unit (see
    :mod:`beamsynth.transforms.prefix` for each method's sensitivity and scale). Output: a dict
    ``{"keys": synthetic keys as rows (the codec's output columns), "tree": released nodes
    (depth, prefix, noisy_count, leaf)}``.
    """

    mechanism = "hierarchical prefix counts, discrete Laplace"

    def __init__(self, *, key: str, epsilon: float, method: str = "improved",
                 max_depth: int | None = None, discount: str | None = None,
                 threshold: float | None = None, restore_discount: bool = False,
                 typed: bool = False, label: str | None = None) -> None:
        super().__init__(_check_label(label))
        if not isinstance(key, str) or not key:
            raise ValueError(f"key ({key!r}) must be the name of a declared key")
        if method not in _PREFIX:
            raise ValueError(f"method ({method!r}) must be one of {sorted(_PREFIX)}")
        if discount is not None and discount not in DISCOUNTS:
            raise ValueError(f"discount ({discount!r}) must be one of {DISCOUNTS}")
        self._restore = _check_bool("restore_discount", restore_discount)
        unused = {"max_depth": (max_depth, max_depth is not None and method == "improved"),
                  "discount": (discount, discount is not None and method != "improved"),
                  "threshold": (threshold, threshold is not None and method == "direct"),
                  "restore_discount": (restore_discount, restore_discount and method != "improved")}
        for name, (value, refused) in unused.items():
            if refused:
                raise ValueError(f"{name} ({value!r}) is not used by method {method!r}; "
                                 f"{_PREFIX_OPTIONS[name]}")
        self._key, self._method, self._max_depth = key, method, max_depth
        self._discount, self._threshold = discount or "proportional", threshold
        self._budget = pure(epsilon)
        self._typed = _check_bool("typed", typed)
        self.with_input_types(EncodedBatch)

    def default_label(self) -> str:
        return f"PrefixTree[{self._key}]"

    def display_data(self) -> dict[str, Any]:
        out = {"mechanism": self.mechanism, "method": self._method,
               "epsilon": self._budget.epsilon, "delta": 0.0, "key": self._key}
        tree = getattr(self, "_tree", None)
        if tree is not None:
            out.update({"scale": tree.accounting.scale, "levels": tree.accounting.levels})
        return out

    def bind(self, private: PrivateCollection) -> None:
        keys = private.layout.keys
        if self._key not in keys:
            raise ValueError(f"{self.label}: key {self._key!r} is not declared; declare it with "
                             f"job.private(schema, keys={{{self._key!r}: bs.TextKey(...)}}) "
                             f"(declared: {sorted(keys)})")
        codec: KeyCodec = keys[self._key]
        _refuse_streaming_direct_runner(self.label, private.exact_batches())
        kw: dict[str, Any] = {"codec": codec, "budget": self._budget,
                              "max_contributions": private.max_contributions,
                              "seed": private.job.step_seed(self.label), "label": "Levels"}
        if self._method == "improved":
            kw.update(discount=self._discount, threshold=self._threshold)
        elif self._method == "basic":
            kw.update(max_depth=self._max_depth, threshold=self._threshold)
        else:
            kw.update(max_depth=self._max_depth)
        self._codec = codec
        self._tree = _PREFIX[self._method](**kw)
        acct = self._tree.accounting
        details = {"key": self._key, "codec": codec.to_spec(), **acct.to_dict()}
        private.job.spend(self.label, self._budget, mechanism=self.mechanism, details=details)
        self.record(details)

    def expand(self, batches):
        p, codec = self.private, self._codec
        keys = batches | "KeySymbols" >> beam.Map(p.layout.key_codes, self._key)
        # EncodedBatch of the key's symbols (n, depth)
        released = keys | "Tree" >> self._tree
        # LevelRelease per level
        if self._typed:
            return released
        restore = self._tree.accounting.discount if (self._restore and self._method == "improved") else None
        synthetic = released | "Decode" >> DecodeLeaves(  # direct: unresolved mass onto released keys
            codec=codec, seed=p.job.step_seed(f"{self.label}/decode"), restore_discount=restore,
            reduce=self._method == "direct")
        # pyarrow.Table of synthetic keys
        return _TreeOutputs({
            "keys": synthetic | "KeyRows" >> release_rows(p, key_rows, codec,
                                                          row_type=key_type(codec),
                                                          order=table_order),
            "tree": released | "TreeRows" >> release_rows(p, tree_rows, codec, row_type=TREE_TYPE,
                                                          order=level_order),
            # several elements per window: rows in a fixed order on every runner (H81)
        })
