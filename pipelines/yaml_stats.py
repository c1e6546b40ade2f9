"""beamsynth's DP statistics as Beam YAML steps (see ``beamsynth_provider.yaml`` next to this module).

``BeamsynthHistogram``, ``BeamsynthMarginals`` and ``BeamsynthCount`` are the public API's
mechanisms (:class:`~beamsynth.transforms.private_ops.Marginals` and
:class:`~beamsynth.transforms.private_ops.Count` applied to ``job.private(schema)``), wrapped in the
conventions of ``BeamsynthSynthesize`` (:mod:`beamsynth.pipelines.yaml_transforms`):

* **Config** is checked when the step is built (unknown key with the nearest one, missing key,
  undeclared column with the nearest declared one), before any data is read.
* **One job budget.** Every beamsynth step of a pipeline, synthesis or statistics, registers in the
  pipeline's job ledger (:func:`~beamsynth.pipelines.yaml_transforms.job_accountant`): the step's
  whole ε must fit in the declared ``job_budget`` minus what the earlier steps spent, else the
  pipeline is refused when built. The statistics steps of one pipeline share one
  :class:`~beamsynth.transforms.private.PrivacyJob` (so one seed mode and one windowing); its
  spends are copied into the ledger, whose accountant every manifest of the pipeline states.
* **Data-independent shape.** Histograms and marginals release every declared cell (empty cells
  included) in the declared cell order, one release per run or per declared window, data or not.
* **Bad rows** go to the ``error_handling`` output as ``{source, row, reason, raw}`` (the same rows
  as ``BeamsynthSynthesize``'s; ``row`` is the row's ``position_field``, else null), or are
  dropped and counted; the manifest's ``operational`` part counts them.
* ``seed`` (tests and demos only) logs a warning when built, counts the released rows in
  ``beamsynth/seeded_rows_not_for_release`` and makes the manifest say "seeded: not for release".
* ``manifest: PATH`` writes one manifest when the run ends (bounded input only): the job ledger's
  budget, the step's own spends, exact operational counts (private) and ``rows_out``.

Privacy (add/remove one privacy unit of at most ``max_contributions`` records, bounded before any
measurement; per declared window with ``windows``): each table has L1 sensitivity ``k`` and
discrete Laplace noise of scale ``k/ε_i`` on every declared cell, the step's ε split equally over
its tables (ε-DP, δ = 0; Laplace mechanism, Dwork et al. 2006, discrete form); a count has
sensitivity ``k``, scale ``k/ε``.

No ``from __future__ import annotations``: Beam YAML reads the constructors' annotations.
"""

import dataclasses
import logging
import math
import re
import weakref
from collections.abc import Sequence
from typing import Any, Optional, Union

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints.row_type import RowTypeConstraint

from beamsynth.pipelines.io.manifest import SECURE_NOTE, SEEDED_NOTE
from beamsynth.pipelines.io.records import METRICS_NAMESPACE
from beamsynth.pipelines.yaml_transforms import (
    _LEDGERS,
    ERROR_ROW_TYPE,
    _budget_from_config,
    _JobLedger,
    _SumCountsFn,
    _windows_from_config,
    _WriteManifestFn,
    check_step_config,
    check_step_fields,
    check_step_windows,
    config_checked,
    load_step_schema,
    reads_rounded_ids,
    warn_at_build,
)
from beamsynth.schemas.keys import KeyCodec, KeySpecError, key_codec_from_spec
from beamsynth.schemas.schema import Schema, avro_field_name
from beamsynth.transforms.budget import PrivacyAccountant
from beamsynth.transforms.conventions import display_items
from beamsynth.transforms.measure import NoisyMarginal, combine_globally
from beamsynth.transforms.outputs import COUNT_FIELD
from beamsynth.transforms.private import (
    WINDOW_FIELD,
    PrivacyJob,
    PrivacyUnit,
    claim_pipeline_budget,
    names_of,
    pure,
    window_row_type,
)
from beamsynth.transforms.private_ops import MAX_MARGINAL_CELLS
from beamsynth.transforms.private_ops import Count as ApiCount
from beamsynth.transforms.private_ops import Marginals as ApiMarginals
from beamsynth.transforms.private_ops import PrefixTree as ApiPrefixTree
from beamsynth.transforms.windows import iso_seconds

__all__ = ["HISTOGRAM_TYPE", "Count", "Histogram", "Marginals", "Prefixes", "histogram_long_rows"]

HISTOGRAM_TYPE = RowTypeConstraint.from_fields(
    [("column", str), ("value", Optional[str]), (COUNT_FIELD, int)])  # noqa: UP045
_JOB_NAME = "beam-yaml statistics"


class _StepSaidIt(logging.Filter):
    """Drops the statistics job's own seed warning (``PrivacyJob 'beam-yaml statistics': seed=4:
    ...``): the step has already warned in its YAML words (:func:`warn_at_build`), and a YAML
    user never made a ``PrivacyJob`` (H70: two seed warnings per seeded step)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(f"PrivacyJob {_JOB_NAME!r}: seed=")


logging.getLogger("beamsynth.transforms.private").addFilter(_StepSaidIt())
# the statistics steps' PrivacyJob of each pipeline and the step that made it (not in the ledger,
# which DoFns carry: a job holds weak references and cannot be pickled). A weak reference to the
# job: it holds PCollections of its pipeline, so a strong one kept the pipeline alive (H79)
_JOBS: "weakref.WeakKeyDictionary[beam.Pipeline, tuple[weakref.ref[PrivacyJob], str]]" = (
    weakref.WeakKeyDictionary())


class _StatsStep(beam.PTransform):
    """The shared part of the statistics steps: config, job, ledger, dead letters, manifest."""

    kind = "BeamsynthStats"
    #: short name of the mechanism (the spend's name in the ledger: ``<step>/<short>``)
    short = "stats"
    #: the step's release outputs (the error output must not take one of their names)
    outputs: tuple[str, ...] = ("output",)
    #: whether a seeded step is marked (build-time warning, row counter); only audits turn it off
    mark_seeded = True

    def _setup(self, *, schema: str, epsilon: float, privacy_id: Optional[str],  # noqa: UP045
               max_contributions: int, seed: Optional[int], batch_rows: int,  # noqa: UP045
               error_handling: Optional[dict], job_budget: Optional[dict],  # noqa: UP045
               windows: Optional[dict], manifest: Optional[str],  # noqa: UP045
               position_field: Optional[str]) -> None:  # noqa: UP045
        self._errors = check_step_config(batch_rows=batch_rows, error_handling=error_handling,
                                         manifest=manifest, position_field=position_field,
                                         seed=seed, outputs=self.outputs)
        self._schema: Schema = load_step_schema(self.kind, schema)
        if privacy_id is not None and privacy_id != self._schema.privacy_id:
            # the step's privacy_id names the rows' id column, as BeamsynthSynthesize's and the
            # CLI's --privacy-id (the API refused it: "differs from the job's id_column"; H84)
            if privacy_id in self._schema.names:
                raise ValueError(f"{self.kind}: privacy_id: {privacy_id} is a declared column "
                                 f"of schema {self._schema.name!r}; the privacy id is never "
                                 "released: name the rows' id field")
            self._schema = dataclasses.replace(self._schema, privacy_id=privacy_id)
        self._budget = pure(epsilon)
        pid = privacy_id if privacy_id is not None else self._schema.privacy_id
        if pid is None and max_contributions != 1:  # the API's words name its id_column (H70)
            raise ValueError(f"{self.kind}: max_contributions ({max_contributions!r}) needs "
                             "privacy_id: COLUMN (or a schema declaring privacy_id); without one "
                             "every record is its own privacy unit")
        self._unit = PrivacyUnit(id_column=pid, max_contributions=max_contributions)
        self._job_budget = _budget_from_config(job_budget, "job_budget")
        if self._job_budget is not None and not PrivacyAccountant(
                total=self._job_budget).can_spend(self._budget):
            raise ValueError(f"{self.kind}: epsilon ({self._budget}) exceeds the declared "
                             f"job_budget ({self._job_budget})")
        self._windows = _windows_from_config(windows)
        self._seed, self._batch_rows = seed, batch_rows
        self._manifest, self._position = manifest, position_field
        warn_at_build(self.kind, seed if self.mark_seeded else None, self._errors,
                      "its released rows", counter="elements_rejected",  # the API's encoder
                      manifest=manifest, epsilon=self._budget.epsilon)

    def _columns(self, columns: Sequence[str], what: str) -> list[str]:
        """Declared column names (a field name such as ``education_num`` is refused with the
        declared name it stands for)."""
        names_of(self._schema, columns, f"{self.kind}: {what}")
        return list(columns)

    # -- hooks -------------------------------------------------------------------------------
    def _mechanism(self, label: str) -> beam.PTransform:
        raise NotImplementedError

    def _outputs(self, released: Any) -> dict[str, beam.PCollection]:
        raise NotImplementedError

    def _details(self) -> dict[str, Any]:
        return {}

    def _keys(self) -> Optional[dict[str, KeyCodec]]:  # noqa: UP045
        """Declared prefix keys of the private collection (``job.private(keys=)``)."""
        return None

    def _released_rows(self, outputs: dict[str, beam.PCollection]) -> list[str]:
        """The output tags whose rows the manifest's ``rows_out`` counts."""
        return list(outputs)

    # -- Beam --------------------------------------------------------------------------------
    @property
    def accountant(self) -> PrivacyAccountant:
        """The step's own spends (filled when the step is applied; see ``job_accountant``)."""
        return getattr(self, "_step_acct", PrivacyAccountant(total=self._budget))

    @property
    def randomness(self) -> str:
        """``"seeded: not for release"`` with a seed, else secure."""
        return SEEDED_NOTE if self._seed is not None else SECURE_NOTE

    def display_data(self) -> dict[str, Any]:
        """Mechanism, the step's budget and declared sizes (never data values)."""
        return display_items(mechanism=f"{self.short} (Beam YAML step)",
                             epsilon=self._budget.epsilon, delta=0.0,
                             columns=len(self._schema.columns),
                             declared_windows=self._windows is not None)

    def _job(self, pipeline: beam.Pipeline, ledger: _JobLedger, name: str) -> PrivacyJob:
        """The pipeline's statistics job (made by its first statistics step)."""
        ref, first = _JOBS.get(pipeline, (None, ""))
        job = None if ref is None else ref()  # alive while the graph is (job.private holds it)
        if job is None:
            total = ledger.total if ledger.total is not None else self._budget
            job = PrivacyJob(epsilon=total.epsilon, delta=total.delta, privacy_unit=self._unit,
                             seed=self._seed, name=_JOB_NAME)
            _JOBS[pipeline] = (weakref.ref(job), self.label)
            claim_pipeline_budget(pipeline, f"{self.kind} {self.label!r}", job=job)
            return job
        if job.seed != self._seed:
            raise ValueError(f"{name}: seed {self._seed!r} differs from step {first!r}'s "
                             f"({job.seed!r}); the statistics steps of one pipeline share one "
                             "privacy job and its randomness: give them the same seed (or none)")
        if ledger.total is not None and job.accountant.total != ledger.total:
            raise ValueError(f"{name}: job_budget {ledger.total} was declared after statistics "
                             f"step {first!r} started the job with its own ε; declare job_budget "
                             "on every beamsynth step of the pipeline")
        return job

    def expand(self, pcoll):
        name = f"{self.kind} {self.label!r}"
        check_step_windows(pcoll, self._windows, name)
        pcoll = check_step_fields(pcoll, self._schema, name, {"privacy_id": self._unit.id_column})
        if self._manifest is not None and (not pcoll.is_bounded or (
                self._windows is not None and self._windows.declared_end is None)):
            raise ValueError(f"{name}: manifest needs a bounded input and declared windows with "
                             "an end (its exact counts are final only when the run ends); drop "
                             "manifest: (the spends are known when built: job_accountant) or "
                             "read a bounded source")
        ledger = _LEDGERS.setdefault(pcoll.pipeline, _JobLedger())
        self._step_acct = PrivacyAccountant(total=self._budget)
        # the step's full label names its spends and seeds its seeded noise: two steps "H" in
        # two composites shared one noise stream (step_seed of "histogram[H]") and one spend
        # name (rule 4; H55); top-level steps keep their label
        step = pcoll.pipeline._current_transform().full_label or self.label
        # raises when this step's whole ε does not fit the job budget (before any spend)
        ledger.add(step, self._step_acct, self._job_budget,
                   (self._unit.id_column, self._unit.max_contributions), kind=self.kind,
                   windows=self._windows, manifest=self._manifest)
        job = self._job(pcoll.pipeline, ledger, name)
        spent_before, counts_before = len(job.accountant.spends), len(job.count_outputs)
        private = pcoll | "Private" >> job.private(
            self._schema, keys=self._keys(), position_field=self._position, source=step,
            batch_rows=self._batch_rows, windows=self._windows)
        # PrivateCollection: EncodedBatch (bounded per unit) + dead-letter Rows
        released = private | self._mechanism(f"{self.short}[{step}]")
        # the mechanism's release: rows, tagged rows or typed values (see _outputs)
        for s in job.accountant.spends[spent_before:]:
            self._step_acct.spend(self.short, s.budget, mechanism=s.mechanism, details=s.details)
        ledger.rebuild()
        job.accountant.to_dict()  # taken: the ledger holds these spends (job_accountant, manifests)
        outputs = self._outputs(released)
        if self._seed is not None and self.mark_seeded:
            outputs = {tag: rows | f"CountSeeded[{tag}]" >> beam.Map(_count_seeded)
                       .with_output_types(rows.element_type) for tag, rows in outputs.items()}
        if self._manifest is not None:
            self._write_manifest(job.count_outputs[counts_before:], outputs, ledger, step)
        if self._errors is None:  # dead letters: counted (metrics, manifest) and dropped
            # one output is the step's only PCollection (Beam YAML: input: STEP), as Synthesize's
            return outputs["output"] if list(outputs) == ["output"] else outputs
        errors = private.dead_letters | "ErrorRows" >> beam.Map(
            lambda d: beam.Row(source=d.source, row=d.position, reason=d.reason, raw=d.element)
        ).with_output_types(ERROR_ROW_TYPE)
        # beam.Row(source, row, reason, raw) per rejected row (private)
        return {**outputs, self._errors: errors}

    def _write_manifest(self, api_counts: list, outputs: dict, ledger: _JobLedger,
                        step: str) -> None:
        parts = [c | f"ManifestCounts{i}" >> beam.FlatMap(_operational)
                 for i, c in enumerate(api_counts)]
        for tag in self._released_rows(outputs):
            out = outputs[tag] | f"OutCounts[{tag}]" >> beam.Map(lambda _r: ("rows_out", 1))
            if self._windows is not None:
                out = out | f"GlobalOut[{tag}]" >> beam.WindowInto(GlobalWindows())
            parts.append(out)
        counts = tuple(parts) | "AllCounts" >> beam.Flatten()
        # (name, n) pairs, global window
        schema = self._schema
        info = {
            "command": f"beam-yaml {self.kind}", "method": self.short, "inputs": [step],
            "schema_name": schema.name, "schema_fingerprint": schema.fingerprint(),
            "seed": self._seed, "privacy_ids": schema.privacy_ids,  # as the encoder read ids (H86)
            "privacy_unit": {"privacy_id": self._unit.id_column,
                             "max_contributions": self._unit.max_contributions,
                             "per": "window" if self._windows is not None else "run",
                             "neighbouring": "add/remove one privacy unit"},
            "details": {"step": step, "step_budget": self._step_acct.to_dict(),
                        **self._details(),
                        "declared_windows": None if self._windows is None else self._windows.describe(),
                        "dead_letters": "error_handling output" if self._errors else
                                        "dropped and counted (no error_handling output)"},
        }
        _ = (combine_globally(counts, _SumCountsFn(rounded=reads_rounded_ids(schema)), "SumCounts")
             # dict of exact counts of the run (operational, not DP)
             | "WriteManifest" >> beam.ParDo(_WriteManifestFn(
                 path=self._manifest, info=info, ledger=ledger, step=self._step_acct)))


_COMMON_KEYS = ("schema", "epsilon", "privacy_id", "max_contributions", "seed", "batch_rows",
                "error_handling", "job_budget", "windows", "manifest", "position_field")


def _yaml_words(message: str) -> str:
    """An API refusal's keyword spellings in YAML's: ``max_depth (3)`` → ``max_depth: 3``,
    ``method 'improved'`` / ``method='basic' and 'direct'`` → ``method: improved`` / ``method:
    basic and direct``."""
    message = re.sub(r"^(\w+) \((.*?)\)", r"\1: \2", message)
    message = re.sub(r"method[= ]'(\w+)'((?: and '\w+')*)",
                     lambda m: f"method: {m[1]}" + m[2].replace("'", ""), message)
    return message


def _common(config: dict[str, Any]) -> dict[str, Any]:
    """The config keys every statistics step takes (each step's signature spells them out: Beam
    YAML builds the step's config schema from it)."""
    return {k: config[k] for k in _COMMON_KEYS}


_OPERATIONAL = {"read": [("rows_read", 1)], "rejected": [("rows_rejected", 1)],
                "used": [("rows_used", 1), ("rows_dropped_by_bound", -1)],
                "encoded": [("rows_dropped_by_bound", 1)],
                "privacy_ids_rounded": [("privacy_ids_rounded", 1)]}


def _operational(item: tuple[str, str, int]) -> list[tuple[str, int]]:
    """The API's ``(source, field, n)`` exact counts as the YAML manifest's ``(name, n)``."""
    _source, field, n = item
    return [(name, sign * int(n)) for name, sign in _OPERATIONAL.get(field, [])]


def _count_seeded(row: Any) -> Any:
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "seeded_rows_not_for_release").inc()
    return row


def _label_text(value: Any) -> Optional[str]:  # noqa: UP045
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def histogram_long_rows(tables: tuple[NoisyMarginal, ...], schema: Schema) -> list[beam.Row]:
    """One-way noisy tables → ``(column, value, noisy_count)`` rows: the tables in the order
    given, each declared cell in cell order (a null cell's value is null). Post-processing."""
    rows = []
    for table in tables:
        (name,) = table.names
        col = schema.column(name)
        labels = col.decode(np.arange(col.cells, dtype=np.int64))
        for label, count in zip(labels, table.values.reshape(-1).tolist()):
            rows.append(beam.Row(column=name, value=_label_text(label), **{COUNT_FIELD: int(count)}))
    return rows


class _LongRowsFn(beam.DoFn):
    """Released one-way tables → long rows, ``window_start`` first under declared windows."""

    def __init__(self, schema: Schema, windowed: bool) -> None:
        self._schema, self._windowed = schema, windowed

    def process(self, tables: tuple[NoisyMarginal, ...], window=beam.DoFn.WindowParam):
        start = {WINDOW_FIELD: iso_seconds(window.start)} if self._windowed else None
        for row in histogram_long_rows(tables, self._schema):
            yield row if start is None else beam.Row(**start, **row._asdict())


class Histogram(_StatsStep):
    """Beam YAML step ``BeamsynthHistogram``: DP counts of every declared value of one or more
    columns, as rows ``(column, value, noisy_count)`` (``window_start`` first with ``windows``).

    Config: ``column`` (one declared column) or ``columns`` (a list), ``epsilon`` (the step's ε,
    split equally over the columns), and the keys every beamsynth step takes (``schema``,
    ``privacy_id``, ``max_contributions``, ``seed``, ``batch_rows``, ``error_handling``,
    ``job_budget``, ``windows``, ``manifest``, ``position_field``).

    Mechanism: ``bs.Marginals`` with one one-way table per column: discrete Laplace of scale
    ``k·m/ε`` (``m`` columns, ``k`` = max_contributions, the L1 sensitivity of each table) on every
    declared cell, empty ones included; ε-DP, δ = 0, for add/remove of one privacy unit (Laplace
    mechanism, Dwork et al. 2006, discrete form; sequential composition over the columns). Rows:
    ``sum`` of the columns' declared cells (a nullable column has one more, value null), columns
    in the order given, cells in declared order: public.
    """

    kind = "BeamsynthHistogram"
    short = "histogram"

    @config_checked(kind, {"column": "a declared column, or columns: [a, b]"})
    def __init__(self, *, schema: str, epsilon: float, column: Optional[str] = None,  # noqa: UP045
                 columns: Optional[list] = None, privacy_id: Optional[str] = None,  # noqa: UP045
                 max_contributions: int = 1, seed: Optional[int] = None,  # noqa: UP045
                 batch_rows: int = 20_000, error_handling: Optional[dict] = None,  # noqa: UP045
                 job_budget: Optional[dict] = None, windows: Optional[dict] = None,  # noqa: UP045
                 manifest: Optional[str] = None,  # noqa: UP045
                 position_field: Optional[str] = None) -> None:  # noqa: UP045
        super().__init__()
        if (column is None) == (columns is None):
            raise ValueError(f"{self.kind}: give column: NAME or columns: [NAME, ...] (one of the "
                             f"two), got column={column!r}, columns={columns!r}")
        if columns is not None and (isinstance(columns, (str, bytes))
                                    or not isinstance(columns, Sequence) or not columns
                                    or len(set(map(str, columns))) != len(columns)):
            raise ValueError(f"{self.kind}: columns ({columns!r}) must be a non-empty list of "
                             "distinct declared column names")
        self._setup(**_common(locals()))
        self._names = self._columns([column] if columns is None else list(columns), "column")
        for n in self._names:
            cells = self._schema.column(n).cells
            if cells > MAX_MARGINAL_CELLS:
                raise ValueError(f"{self.kind}: column {n!r} declares {cells} cells, more than a "
                                 f"dense noisy table holds ({MAX_MARGINAL_CELLS}); release it with "
                                 "bs.Histogram (CatHist) in Python or beamsynth histogram")

    def _mechanism(self, label: str) -> beam.PTransform:
        return ApiMarginals(marginals=[(n,) for n in self._names], epsilon=self._budget.epsilon,
                         typed=True, label=label)

    def _outputs(self, released: Any) -> dict[str, beam.PCollection]:
        windowed = self._windows is not None
        rows = released | "Rows" >> beam.ParDo(_LongRowsFn(self._schema, windowed)).with_output_types(
            window_row_type(HISTOGRAM_TYPE) if windowed else HISTOGRAM_TYPE)
        # beam.Row([window_start,] column, value, noisy_count) per declared cell, in order
        return {"output": rows}

    def _details(self) -> dict[str, Any]:
        return {"columns": list(self._names),
                "cells": [self._schema.column(n).cells for n in self._names]}


class Marginals(_StatsStep):
    """Beam YAML step ``BeamsynthMarginals``: DP k-way tables of declared column sets, one output
    per table with one row per declared cell ``(<columns>..., noisy_count)`` (``window_start``
    first with ``windows``).

    Config: ``marginals``: a list of column lists (``[[age, sex], [race]]``; output tags
    ``age_by_sex``, ``race``: field names joined by ``_by_``) or a mapping from output tag to
    column list (``{by_age_sex: [age, sex]}``), ``epsilon`` (split equally over the tables), and
    the keys every beamsynth step takes.

    Mechanism: ``bs.Marginals``: each table has L1 sensitivity ``k`` (max_contributions) and
    discrete Laplace noise of scale ``k·T/ε`` (``T`` tables) on every declared cell; ε-DP, δ = 0,
    for add/remove of one privacy unit (Laplace mechanism, Dwork et al. 2006, discrete form;
    PrivBayes §3, seed 004, for marginals). Rows per table: the product of its columns' declared
    cells, in declared cell order (public).
    """

    kind = "BeamsynthMarginals"
    short = "marginals"
    outputs = ()  # one per table: a table's tag is checked against the error output below

    @config_checked(kind, {"marginals": "a list of column lists, e.g. [[age, sex], [race]]"})
    def __init__(self, *, schema: str, epsilon: float,
                 marginals: Union[list, dict],  # noqa: UP007
                 privacy_id: Optional[str] = None,  # noqa: UP045
                 max_contributions: int = 1, seed: Optional[int] = None,  # noqa: UP045
                 batch_rows: int = 20_000, error_handling: Optional[dict] = None,  # noqa: UP045
                 job_budget: Optional[dict] = None, windows: Optional[dict] = None,  # noqa: UP045
                 manifest: Optional[str] = None,  # noqa: UP045
                 position_field: Optional[str] = None) -> None:  # noqa: UP045
        super().__init__()
        self._setup(**_common(locals()))
        self._tables = self._parse(marginals)
        if self._errors in self._tables:
            raise ValueError(f"{self.kind}: output tag {self._errors!r} is both a table and the "
                             "error_handling output; rename one")
        self._api = ApiMarginals(marginals=list(self._tables.values()), epsilon=self._budget.epsilon,
                              label="check")  # validates the tables now (repeats, empty ones)

    def _parse(self, marginals: Any) -> dict[str, tuple[str, ...]]:
        if isinstance(marginals, dict):
            items = list(marginals.items())
        elif isinstance(marginals, (list, tuple)) and marginals:
            items = [(None, m) for m in marginals]
        else:
            raise ValueError(f"{self.kind}: marginals ({marginals!r}) must be a list of column "
                             "lists ([[age, sex], [race]]) or a mapping {tag: [age, sex]}")
        tables: dict[str, tuple[str, ...]] = {}
        for tag, m in items:
            cols = [m] if isinstance(m, str) else m
            if not isinstance(cols, (list, tuple)) or not cols:
                raise ValueError(f"{self.kind}: marginal {m!r} must be a non-empty list of "
                                 "declared column names")
            cols = tuple(self._columns(cols, f"marginal {list(cols)!r}"))
            tag = tag if tag is not None else "_by_".join(avro_field_name(c) for c in cols)
            if not isinstance(tag, str) or not tag or "." in tag:
                raise ValueError(f"{self.kind}: output tag {tag!r} must be a non-empty name "
                                 "without '.'")
            if tag in tables:
                raise ValueError(f"{self.kind}: two tables have the output tag {tag!r}; use the "
                                 "mapping form {tag: [columns]} to name them")
            tables[tag] = cols
        return tables

    def _mechanism(self, label: str) -> beam.PTransform:
        return ApiMarginals(marginals=list(self._tables.values()), epsilon=self._budget.epsilon,
                            label=label)

    def _outputs(self, released: Any) -> dict[str, beam.PCollection]:
        # the API's rows: one PCollection per table keyed "a,b"
        return {tag: released[",".join(cols)] for tag, cols in self._tables.items()}

    def _details(self) -> dict[str, Any]:
        return {"tables": {tag: list(cols) for tag, cols in self._tables.items()},
                "cells": {tag: math.prod(self._schema.column(c).cells for c in cols)
                          for tag, cols in self._tables.items()}}


class Count(_StatsStep):
    """Beam YAML step ``BeamsynthCount``: the DP number of records, one row ``(noisy_count)``
    (``window_start`` first with ``windows``: one row per declared window).

    Config: ``epsilon`` and the keys every beamsynth step takes. Mechanism: ``bs.Count``:
    sensitivity ``k`` (max_contributions), discrete Laplace of scale ``k/ε``; ε-DP, δ = 0, for
    add/remove of one privacy unit (Laplace mechanism, Dwork et al. 2006, discrete form). Rows
    counted are those that fit the declared schema (bad rows are dead letters, not counted).
    """

    kind = "BeamsynthCount"
    short = "count"

    @config_checked(kind)
    def __init__(self, *, schema: str, epsilon: float,
                 privacy_id: Optional[str] = None,  # noqa: UP045
                 max_contributions: int = 1, seed: Optional[int] = None,  # noqa: UP045
                 batch_rows: int = 20_000, error_handling: Optional[dict] = None,  # noqa: UP045
                 job_budget: Optional[dict] = None, windows: Optional[dict] = None,  # noqa: UP045
                 manifest: Optional[str] = None,  # noqa: UP045
                 position_field: Optional[str] = None) -> None:  # noqa: UP045
        super().__init__()
        self._setup(**_common(locals()))

    def _mechanism(self, label: str) -> beam.PTransform:
        return ApiCount(epsilon=self._budget.epsilon, label=label)

    def _outputs(self, released: Any) -> dict[str, beam.PCollection]:
        return {"output": released}


class Prefixes(_StatsStep):
    """Beam YAML step ``BeamsynthPrefixes``: a DP prefix tree of a declared text, spatial or
    hierarchy key and the synthetic keys it decodes to (seed 003), outputs ``keys`` (the key's
    columns) and ``tree`` (``depth, prefix, noisy_count, leaf``), ``window_start`` first with
    ``windows``.

    Config: ``key`` (the key's declaration, as in docs/prefixes.md: ``{kind: text, column: query,
    alphabet: "abc...", max_length: 8}``, ``{kind: spatial, columns: [lat, lon], box: [[57, 72],
    [4, 32]], depth: 6}`` or ``{kind: hierarchy, columns: [country, city], tree: {...}}``),
    ``method`` (``improved`` default, ``basic``, ``direct``), ``max_depth``, ``discount``,
    ``threshold``, ``restore_discount`` (refused where the method does not use them), ``epsilon``
    and the keys every beamsynth step takes. The schema still needs one column (the key's own, or
    a nullable one); a row whose key cannot be encoded is a dead letter.

    Mechanism: ``bs.PrefixTree``: discrete Laplace on the tree's level counts, ε-DP, δ = 0, for
    add/remove of one privacy unit (sensitivity and scale per method in
    :mod:`beamsynth.transforms.prefix`: basic §2.3 Corollary 2, improved §3 Theorem 3, direct §4).
    How many keys and nodes are released is itself DP (post-processing of noisy counts).
    """

    kind = "BeamsynthPrefixes"
    short = "prefixes"
    outputs = ("keys", "tree")

    @config_checked(kind, {"key": "the key's declaration, e.g. {kind: text, column: query, "
                                  "max_length: 8}"})
    def __init__(self, *, schema: str, epsilon: float, key: dict,
                 method: str = "improved", max_depth: Optional[int] = None,  # noqa: UP045
                 discount: Optional[str] = None, threshold: Optional[float] = None,  # noqa: UP045
                 restore_discount: bool = False,
                 privacy_id: Optional[str] = None,  # noqa: UP045
                 max_contributions: int = 1, seed: Optional[int] = None,  # noqa: UP045
                 batch_rows: int = 20_000, error_handling: Optional[dict] = None,  # noqa: UP045
                 job_budget: Optional[dict] = None, windows: Optional[dict] = None,  # noqa: UP045
                 manifest: Optional[str] = None,  # noqa: UP045
                 position_field: Optional[str] = None) -> None:  # noqa: UP045
        super().__init__()
        self._setup(**_common(locals()))
        try:
            self._codec = key_codec_from_spec(key)
        except KeySpecError as exc:
            raise ValueError(f"{self.kind}: key: {exc} (docs/prefixes.md)") from None
        self._key = ",".join(self._codec.input_columns)  # names the key in dead-letter reasons
        self._options = {"method": method, "max_depth": max_depth, "discount": discount,
                         "threshold": threshold, "restore_discount": restore_discount}
        try:  # refuses an option the method does not use, now
            ApiPrefixTree(key=self._key, epsilon=self._budget.epsilon, label="check",
                          **self._options)
        except ValueError as exc:  # the API's words (method='basic') in YAML's (H84)
            raise ValueError(f"{self.kind}: {_yaml_words(str(exc))}") from None

    def _keys(self) -> dict[str, KeyCodec]:
        return {self._key: self._codec}

    def _mechanism(self, label: str) -> beam.PTransform:
        return ApiPrefixTree(key=self._key, epsilon=self._budget.epsilon, label=label,
                             **self._options)

    def _outputs(self, released: Any) -> dict[str, beam.PCollection]:
        return {"keys": released["keys"], "tree": released["tree"]}

    def _released_rows(self, outputs: dict[str, beam.PCollection]) -> list[str]:
        return ["keys"]  # synthetic keys (the tree's nodes are its description)

    def _details(self) -> dict[str, Any]:
        return {"key": self._codec.to_spec(), "method": self._options["method"]}
