"""beamsynth transforms as Beam YAML steps (see ``beamsynth_provider.yaml`` next to this module).

Beam YAML hands a step's ``config`` to the transform's constructor as keyword arguments and feeds
it a schema'd ``PCollection`` of ``beam.Row``. Beam field names must be identifiers, so columns
such as ``education-num`` travel as their Avro-safe names (``education_num``) both ways.
:class:`Synthesize` turns such rows into a DP synthetic ``PCollection[beam.Row]`` with one
nullable string/int/float field per declared column, so ``WriteToAvro``/``WriteToParquet``/
``WriteToCsv`` can follow it. The budget is spent when the step is constructed and checked
against the pipeline's job budget when it is applied (both before any data is read).

Privacy rules of the step (docs/releases.md, "Beam YAML"):

* **Each row is judged against the declared schema alone** (:func:`rows_to_block`): a missing
  nullable field is a null, a missing required field rejects that row, an undeclared field is
  ignored or rejects that row (the schema's ``extra_columns``). No row decides how another parses.
* **Bad rows never fail the run.** They go to the dead-letter output named by Beam YAML's
  ``error_handling: {output: NAME}`` (rows ``{source, row, reason, raw}``: private, keep them with
  the data owner); without ``error_handling`` they are dropped and counted (Beam counters
  ``beamsynth/rows_rejected_*`` and the manifest's ``operational`` part). Nothing the step raises
  or logs while reading rows carries a value of a row.
* **Windows**: the global window (one release), or the step's ``windows: {start, end, size}``
  (:class:`~beamsynth.transforms.windows.DeclaredWindows`: one release per declared window, data
  or not). Any other windowing of the input is refused when the pipeline is built. On an
  unbounded input, a row arriving after its window's release fired is an error row, exactly
  once (``arrived after window [start, end) was released``; ``SplitLate`` decides once per row,
  before any release step), counted in ``beamsynth/rows_late``, never in a release or in the
  window's manifest (written at the release).
* **Steps compose.** All ``BeamsynthSynthesize`` steps of one pipeline spend from one job ledger
  (:func:`job_accountant`); with more than one step the pipeline must declare its total with
  ``job_budget: {epsilon: E, delta: D}`` (on one step at least, the same value wherever given),
  and steps that overspend it fail when the pipeline is built. The steps of one job must share
  one privacy unit (privacy id and max contributions), else they are refused.
* **Seeded output is marked**: ``seed`` logs a warning when the step is built, counts every
  synthetic row in the ``beamsynth/seeded_rows_not_for_release`` counter and sets the manifest's
  ``randomness`` to "seeded: not for release".
* ``manifest: PATH`` writes a manifest (budget, spends, seed note, exact counts) when the run
  ends; with declared windows one per window (window start inserted before the extension).

This module deliberately has no ``from __future__ import annotations``: Beam YAML reads the
constructor's annotations to build the step's config schema.
"""

import dataclasses
import difflib
import functools
import inspect
import json
import logging
import math
import os
import weakref
from typing import Any, Optional

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows, IntervalWindow
from apache_beam.typehints.row_type import RowTypeConstraint

from beamsynth.pipelines.io.encode import encode_block
from beamsynth.pipelines.io.manifest import (
    SECURE_NOTE,
    SEEDED_NOTE,
    build_manifest,
    write_json_atomic,
)
from beamsynth.pipelines.io.records import METRICS_NAMESPACE, RawBlock, Rejected
from beamsynth.pipelines.methods.options import check_options as check_method_options
from beamsynth.pipelines.methods.registry import METHODS, get_method, method_option_names
from beamsynth.pipelines.methods.synthesize import (
    SynthesisConfig,
    plan_synthesis,
    synthesize_batches,
)
from beamsynth.pipelines.methods.wording import Vocabulary
from beamsynth.pipelines.stream import EMPTY_WINDOW_METHODS, empty_batch, window_output_path
from beamsynth.schemas.schema import (
    EncodedBatch,
    Schema,
    SchemaError,
    _is_timestamp,
    avro_field_name,
    count_rounded_ids,
    load_schema,
)
from beamsynth.schemas.tables import arrow_schema_for
from beamsynth.transforms.budget import (
    ApproxDP,
    BudgetExceededError,
    PrivacyAccountant,
    as_budget,
)
from beamsynth.transforms.conventions import display_items
from beamsynth.transforms.frame_fields import with_declared_fields
from beamsynth.transforms.inputs import RowFields, record_position, undeclared_fields
from beamsynth.transforms.measure import combine_globally
from beamsynth.transforms.private import (
    WindowRowsFn,
    claim_pipeline_budget,
    stamp_now,
    warn_ambiguous_values,
    window_row_type,
)
from beamsynth.transforms.units import BoundContributions
from beamsynth.transforms.windows import (
    DeclaredWindows,
    SplitLate,
    check_release_windowing,
    window_text,
)

__all__ = ["STEP", "Synthesize", "job_accountant", "rows_to_block", "row_type_for"]

STEP = "BeamsynthSynthesize"
_LOG = logging.getLogger(__name__)
_SOURCE = "beam-yaml"
_RAW_LIMIT = 500


def row_type_for(schema: Schema) -> RowTypeConstraint:
    """The Beam row type of synthetic output: nullable int/float/str per declared column."""
    fields = []
    for f in arrow_schema_for(schema):
        py = int if pa.types.is_integer(f.type) else float if pa.types.is_floating(f.type) else str
        fields.append((avro_field_name(f.name), Optional[py]))  # noqa: UP045 (Beam needs typing)
    return RowTypeConstraint.from_fields(fields)


# -- rows → raw block, each row judged alone ------------------------------------------------------
def _raw_value(v: Any) -> Optional[str]:  # noqa: UP045
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return str(v)


def _is_number(v: Any) -> bool:
    """A finite int or float (not bool, not NaN: a NaN is a null)."""
    if isinstance(v, (bool, np.bool_, np.timedelta64)):  # np.timedelta64 is an np.integer
        return False
    return isinstance(v, (int, np.integer)) or (isinstance(v, (float, np.floating))
                                                and math.isfinite(v))


def _raw_text(d: Any) -> str:
    """The row as JSON text for the (private) dead-letter output; never raises."""
    try:
        text = json.dumps({str(k): _raw_value(v) for k, v in d.items()}, ensure_ascii=False)
    except Exception:  # a value whose str() fails: keep the field names only
        text = json.dumps({str(k): "<unprintable>" for k in d}, ensure_ascii=False)
    return text[:_RAW_LIMIT]


def _as_dict(row: Any) -> Optional[dict]:  # noqa: UP045
    if isinstance(row, dict):
        return row
    as_dict = getattr(row, "_asdict", None)
    return RowFields(as_dict()) if callable(as_dict) else None  # H103


_RowPlan = tuple[tuple[str, bool, tuple[str, ...], bool, bool], ...]
"""Per looked-up column: (name, nullable, the keys it may have in a row (its name, its Avro-safe
name), coded: a number stays a number, stamped: a pandas timestamp is kept as is)."""


def _row_plan(schema: Schema) -> _RowPlan:
    """What :func:`_judge_row` looks up in every row, derived from the schema once per block
    (not per row: ``avro_field_name`` per column per row was half the step's time; H79)."""
    columns = [(c.name, c.nullable, c.type in ("categorical", "string", "text"),
                c.type != "datetime") for c in schema.columns]
    if schema.privacy_id is not None:  # 7.0 is the person 7 (privacy_id_text), not a second one
        columns.append((schema.privacy_id, False, True, False))
    return tuple((name, nullable, tuple(dict.fromkeys((name, avro_field_name(name)))), coded,
                  stamped) for name, nullable, coded, stamped in columns)


def _judge_row(schema: Schema, d: dict, position_field: Optional[str] = None,  # noqa: UP045
               plan: Optional[_RowPlan] = None) -> tuple[Optional[dict], Optional[str]]:  # noqa: UP045
    """(declared column → raw value, None) or (None, reason). Names only in reasons, never values.
    ``plan``: :func:`_row_plan` of ``schema`` (made here when not given)."""
    out: dict[str, Any] = {}
    used: set[Any] = set()
    for name, nullable, names, coded, stamped in (_row_plan(schema) if plan is None else plan):
        keys = [k for k in names if k in d]
        if len(keys) > 1:
            return None, f"field {name!r} given twice (as {keys[0]!r} and {keys[1]!r})"
        if not keys:
            if not nullable:
                return None, f"required field {name!r} is missing"
            out[name] = None
            continue
        used.add(keys[0])
        v = d[keys[0]]  # a number in a code column or id stays a number (pandas: 1 -> 1.0 in a
        # column with a null, "01" -> 1), judged as job.private does (rules 5 and 6, H45)
        out[name] = v if coded and _is_number(v) else _raw_value(v)
        if stamped and _is_timestamp(v):  # pandas' JSON reader's date columns: judged as
            out[name] = v  # job.private does (Column.encode: the declared value; rule 6, H55)
    if schema.extra_columns == "reject":
        extra = [str(k) for k in undeclared_fields(d, {*used, position_field})]  # the API's rule
        if extra:
            return None, f"undeclared field(s) {extra} and the schema says extra_columns: reject"
    return out, None


def _position(d: dict, position_field: Optional[str], default: int) -> int:  # noqa: UP045
    """The row's own position from ``position_field`` as ``job.private`` reads it
    (:func:`~beamsynth.transforms.inputs.record_position`: an integer, never ``int(12.7)`` nor a
    value past 64 bits), else ``default``."""
    position = record_position(d, position_field)
    return default if position is None else position


def rows_to_block(rows: list[Any], *, schema: Schema, source: str, first_row: int,
                  position_field: Optional[str] = None) -> tuple[RawBlock, list[Rejected]]:  # noqa: UP045
    """``beam.Row``s (or dicts) → a :class:`RawBlock` of the declared columns + dead letters.

    Each row is judged against ``schema`` alone (stability: adding or removing one row never
    changes how another parses): declared columns are looked up by name or Avro-safe name; a
    missing nullable column is null, a missing required column (or privacy id) rejects the row,
    undeclared fields are ignored or reject the row per ``schema.extra_columns``. A row's
    number is its integer ``position_field`` (a field the caller added, e.g. the source line; never
    an undeclared field), else its place in ``rows`` counted from ``first_row``; with
    ``position_field`` set, a row whose field holds no integer has none (:data:`_NO_POSITION` in
    the block, ``None`` in its dead letter), never its place in a batch sized by timing (H77).
    """
    by_place = not position_field  # with position_field, a place in a batch is no position
    names = list(schema.names) + ([schema.privacy_id] if schema.privacy_id else [])
    plan = _row_plan(schema)  # once per block, not per row
    kept: list[dict] = []
    positions: list[int] = []
    raw_rows: list[str] = []
    rejected: list[Rejected] = []
    for i, row in enumerate(rows):
        d = _as_dict(row)
        if d is None:
            rejected.append(Rejected(source, first_row + i if by_place else None,
                                     f"element is a {type(row).__name__}, not a row", raw=""))
            continue
        try:
            values, reason = _judge_row(schema, d, position_field, plan)
        except Exception as exc:  # noqa: BLE001 (a value whose str() fails: that row only)
            values, reason = None, f"a field could not be read ({type(exc).__name__})"
        if values is None:
            rejected.append(Rejected(source, _position(
                d, position_field, first_row + i if by_place else None), reason, raw=_raw_text(d)))
            continue
        kept.append(values)
        positions.append(_position(d, position_field,
                                   first_row + i if by_place else _NO_POSITION))
        raw_rows.append(_raw_text(d))
    cols = {n: pd.Series([v[n] for v in kept], dtype=object) for n in names}
    block = RawBlock(source=source, columns=cols, rows=np.asarray(positions, dtype=np.int64),
                     lines=None, raw_rows=raw_rows)
    return block, rejected


def encode_rows(schema: Schema, rows: list[Any], *, source: str = _SOURCE, first_row: int = 1,
                position_field: Optional[str] = None) -> tuple[Any, list[Rejected]]:  # noqa: UP045
    """Rows → (``EncodedBatch`` of good rows, dead letters); never raises on a row's content.

    Should the encoder raise on a block (a bug), each row is encoded alone and a row that still
    raises is dead-lettered with the exception's type only (its text might carry the value).
    """
    block, rejected = rows_to_block(rows, schema=schema, source=source, first_row=first_row,
                                    position_field=position_field)
    try:
        batch, bad = encode_block(schema, block)
        return batch, rejected + _placed(bad)
    except Exception:  # noqa: BLE001 (never let one row fail the run)
        pass
    batches = []
    for i in range(len(block)):
        one = RawBlock(source=source, columns={n: s.iloc[i:i + 1].reset_index(drop=True)
                                               for n, s in block.columns.items()},
                       rows=block.rows[i:i + 1], lines=None, raw_rows=block.raw_rows[i:i + 1])
        try:
            b, bad = encode_block(schema, one)
        except Exception as exc:  # noqa: BLE001
            rejected.append(Rejected(source, int(block.rows[i]),
                                     f"row could not be encoded ({type(exc).__name__})",
                                     raw=block.raw_rows[i]))
            continue
        rejected.extend(bad)
        if len(b):
            batches.append(b)
    return _concat(schema, batches), _placed(rejected)


_NO_POSITION = int(np.iinfo(np.int64).min)
"""A kept row's number in its block when ``position_field`` holds no integer (``None`` in its
dead letter: :func:`_placed`)."""


def _placed(rejected: list[Rejected]) -> list[Rejected]:
    """Dead letters with :data:`_NO_POSITION` given no position (``None``)."""
    return [dataclasses.replace(r, row=None) if r.row == _NO_POSITION else r for r in rejected]


def _concat(schema: Schema, batches: list[Any]) -> Any:
    if not batches:
        return empty_batch(schema)
    pids = None if batches[0].pids is None else np.concatenate([b.pids for b in batches])
    return EncodedBatch(np.concatenate([b.codes for b in batches]), pids)


class _EncodeRowsFn(beam.DoFn):
    """list of rows → ``EncodedBatch`` (main) and ``Rejected`` (tag ``rejected``), counted."""

    def __init__(self, schema: Schema, position_field: Optional[str] = None) -> None:  # noqa: UP045
        self._schema, self._position = schema, position_field

    def setup(self) -> None:
        counter = beam.metrics.Metrics.counter
        self._read = counter(METRICS_NAMESPACE, "rows_read")
        self._used = counter(METRICS_NAMESPACE, "rows_encoded")
        self._rejected = counter(METRICS_NAMESPACE, "rows_rejected_schema")

    def process(self, rows: list[Any]):
        batch, rejected = encode_rows(self._schema, list(rows), position_field=self._position)
        self._read.inc(len(rows))
        self._used.inc(len(batch))
        self._rejected.inc(len(rejected))
        for r in rejected:
            yield beam.pvalue.TaggedOutput("rejected", r)
        if len(batch):
            yield batch


class _OutsideRowsFn(beam.DoFn):
    """Rows stamped in a declared window pass; the others are ``Rejected`` (tag ``outside``, each
    judged on its own timestamp), counted in ``beamsynth/rows_outside_windows``."""

    def __init__(self, windows: DeclaredWindows, position_field: Optional[str]) -> None:  # noqa: UP045
        self._windows, self._position = windows, position_field

    def process(self, row: Any, ts=beam.DoFn.TimestampParam):
        if self._windows.contains(ts):
            yield row
            return
        beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows_outside_windows").inc()
        yield beam.pvalue.TaggedOutput("outside", _reject_row(
            row, self._position, self._windows.outside_reason(ts)))


def _reject_row(row: Any, position_field: Optional[str], reason: str) -> Rejected:  # noqa: UP045
    """A whole row as a dead letter with ``reason`` (its own ``position_field``, else no row)."""
    d = _as_dict(row)
    position = _position(d, position_field, None) if d is not None else None
    return Rejected(source=_SOURCE, row=position, raw=_raw_text(d) if d is not None else "",
                    reason=reason)


class _LateRowsFn(beam.DoFn):
    """Rows of ``SplitLate``'s late panes (they missed their window's release) → ``Rejected``,
    counted in ``beamsynth/rows_late``."""

    def __init__(self, position_field: Optional[str]) -> None:  # noqa: UP045
        self._position = position_field

    def process(self, row: Any, window=beam.DoFn.WindowParam):
        beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows_late").inc()
        yield _reject_row(row, self._position, f"arrived after window {window_text(window)} was released")


def _table_rows(table, names: list[str]):
    fields = [avro_field_name(n) for n in names]  # Beam field names must be identifiers
    for rec in table.to_pylist():
        yield beam.Row(**{f: rec[n] for f, n in zip(fields, names)})


class _CountSeededFn(beam.DoFn):
    """Pass-through of synthetic tables counting rows in ``seeded_rows_not_for_release``."""

    def process(self, table):
        beam.metrics.Metrics.counter(METRICS_NAMESPACE, "seeded_rows_not_for_release").inc(table.num_rows)
        yield table


# -- the job ledger: every step of one pipeline composes ----------------------------------------
class _JobLedger:
    """The steps of one pipeline and their declared total (see :func:`job_accountant`)."""

    def __init__(self) -> None:
        self.total: Optional[ApproxDP] = None  # noqa: UP045
        self.declared_by = ""
        self.unit: Optional[tuple[Any, int]] = None  # noqa: UP045 ((privacy id, max contributions))
        self.windows: Optional[DeclaredWindows] = None  # noqa: UP045 (the steps' declared windows)
        self.steps: list[tuple[str, PrivacyAccountant]] = []
        self.kinds: set[str] = set()  # BeamsynthSynthesize, BeamsynthHistogram, ...
        self.manifests: dict[str, str] = {}  # manifest path -> the step writing it
        self.seeds: dict[int, str] = {}  # a synthesis step's seed -> the step (H77)
        self.accountant: Optional[PrivacyAccountant] = None  # noqa: UP045

    def add(self, step: str, spent: PrivacyAccountant, declared: Optional[ApproxDP],  # noqa: UP045
            unit: tuple[Any, int] = (None, 1), kind: str = STEP,
            windows: Optional[DeclaredWindows] = None,  # noqa: UP045
            manifest: Optional[str] = None, seed: Optional[int] = None) -> None:  # noqa: UP045
        """Register step ``step`` (a ``kind`` step) spending ``spent``; raises when its privacy unit
        or windowing differs, its job budget differs, its ε does not fit what the earlier steps
        left, its ``manifest`` path is another step's, or its ``seed`` (a synthesis step's, used
        as given) is another step's."""
        if seed is not None and seed in self.seeds:  # one stream: their releases differ exactly
            raise ValueError(
                f"{kind} {step!r}: seed {seed} is also step {self.seeds[seed]!r}'s; two steps of "
                "one pipeline with one seed draw the same noise, so their releases would differ "
                "by the exact difference of their inputs: give each step its own seed (tests and "
                "demos only) or none")
        if manifest is not None:  # a copied step kept its manifest: one file overwrote the other
            key = manifest if "://" in manifest else os.path.abspath(manifest)
            if key in self.manifests:
                raise ValueError(
                    f"{kind} {step!r}: manifest {manifest!r} is also step "
                    f"{self.manifests[key]!r}'s; give each step its own manifest path (the "
                    "second file would replace the first, and with it that step's exact counts)")
            self.manifests[key] = step
        if seed is not None:
            self.seeds[seed] = step
        if self.steps and windows != self.windows:  # the job's ε holds per window (rule 3, H52)
            raise ValueError(
                f"{kind} {step!r}: windows {_windows_text(windows)} differ from the other steps' "
                f"({_windows_text(self.windows)}); the job budget holds per declared window, so "
                "every beamsynth step of one pipeline declares the same windows (a person's "
                "records in one long window would reach every short window's release)")
        self.windows = windows
        if self.unit is not None and unit != self.unit:
            raise ValueError(
                f"{kind} {step!r}: privacy unit (privacy_id={unit[0]!r}, max_contributions="
                f"{unit[1]}) differs from the other steps' (privacy_id={self.unit[0]!r}, "
                f"max_contributions={self.unit[1]}); budgets of one job add up only for one "
                "privacy unit")
        self.unit = unit
        if declared is not None:
            if self.total is not None and declared != self.total:
                raise ValueError(
                    f"{kind} {step!r}: job_budget {declared} differs from the job budget "
                    f"{self.total} declared by step {self.declared_by!r}; declare the same total "
                    "on every step of the pipeline")
            if self.total is None:
                self.total, self.declared_by = declared, step
        self.steps.append((step, spent))
        self.kinds.add(kind)
        if self.total is None:
            if len(self.steps) > 1:
                raise ValueError(
                    f"{kind if len(self.kinds) == 1 else 'beamsynth'} steps "
                    f"{[s for s, _ in self.steps]} run in one pipeline, so their "
                    "releases compose: declare the pipeline's total budget on each of them with "
                    "job_budget: {epsilon: E, delta: D}")
            return
        acct = PrivacyAccountant(total=self.total)
        for name, steps in self.steps:
            if steps is spent and not acct.can_spend(spent.total):  # name the step's whole ε
                try:
                    acct.spend(name, spent.total, mechanism="probe")
                except BudgetExceededError as exc:  # each earlier step's sum, not its parts (H84)
                    by_step = ", ".join(
                        f"{n} {ApproxDP(epsilon=a.spent_epsilon, delta=a.spent_delta)}"
                        for n, a in self.steps[:-1])
                    raise BudgetExceededError(
                        f"{exc}; spent by step: {by_step} of job_budget {self.total} (lower a "
                        "step's epsilon, or raise job_budget on every step)") from None
            for s in steps.spends:
                acct.spend(f"{name}/{s.step}", s.budget, mechanism=s.mechanism, details=s.details)
        self.accountant = acct

    def rebuild(self) -> None:
        """Recompute the job's accountant after a registered step's spends were recorded (the
        statistics steps spend when their mechanisms are applied, after :meth:`add` checked that
        their whole ε fits)."""
        if self.total is None:
            return
        acct = PrivacyAccountant(total=self.total)
        for name, steps in self.steps:
            for s in steps.spends:
                acct.spend(f"{name}/{s.step}", s.budget, mechanism=s.mechanism, details=s.details)
        self.accountant = acct


_LEDGERS: "weakref.WeakKeyDictionary[beam.Pipeline, _JobLedger]" = weakref.WeakKeyDictionary()


def _windows_text(windows: Optional[DeclaredWindows]) -> str:  # noqa: UP045
    return "none (the global window)" if windows is None else str(windows.describe())


def job_accountant(pipeline: beam.Pipeline) -> Optional[PrivacyAccountant]:  # noqa: UP045
    """The accountant of every ``BeamsynthSynthesize`` step applied to ``pipeline`` so far, when
    a job budget was declared (``None`` otherwise). Spends are named ``<step label>/<spend>``."""
    ledger = _LEDGERS.get(pipeline)
    return None if ledger is None else ledger.accountant


def _budget_from_config(value: Any, name: str) -> Optional[ApproxDP]:  # noqa: UP045
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"epsilon", "delta"} or "epsilon" not in value:
        raise ValueError(f"{name} ({value!r}) must be {{epsilon: E}} or {{epsilon: E, delta: D}}")
    for key, v in value.items():
        check_number(f"{name}: {{{key}: ...}}", v)
    return as_budget(value["epsilon"], value.get("delta", 0.0))


def _text_number(value: str) -> str:
    """Why YAML gave a number as text, and how to write it."""
    mantissa, e, exponent = value.strip().lower().partition("e")
    if e and mantissa and "." not in mantissa:
        # YAML 1.1 (Beam YAML's loader): a float needs a dot, so 1e-6 is the text '1e-6'
        return (f"YAML reads {value} as text (an exponent needs a dot in YAML: write "
                f"{mantissa}.0e{exponent})")
    return ("quoted, it is text: write the number without quotes (a Jinja variable too: "
            "epsilon: {{ epsilon }})")


def load_step_schema(step: str, schema: Any) -> Schema:
    """The step's ``schema:`` (a file, a bundled name or a mapping), refused in YAML words: a
    relative path is read from the working directory, while Beam YAML reads a provider's
    ``include:`` from the pipeline file's folder, so the message says which folder was searched."""
    if not isinstance(schema, (str, dict)) or not schema:
        raise ValueError(f"{step}: schema ({schema!r}) must be a schema file, a bundled name such "
                         "as adult, or a mapping")
    try:
        return load_schema(schema)
    except SchemaError as exc:
        if isinstance(schema, str) and "no such file" in str(exc) and not os.path.isabs(schema):
            raise SchemaError(f"{step}: {exc}; a relative path is read from the working "
                              f"directory ({os.getcwd()}), not from the pipeline file's folder: "
                              "give an absolute path (or a Jinja variable)") from None
        raise SchemaError(f"{step}: {exc}") from None


def check_number(key: str, value: Any) -> None:
    """Refuse text for a YAML key that takes a number, in YAML words (the budget's own check
    spoke Python: ``pass epsilon=0.5 (a number, not text: float(...) ...)``)."""
    if isinstance(value, str):
        raise ValueError(f"{key} ({value!r}) must be a number; {_text_number(value)}")


def _windows_from_config(value: Any) -> Optional[DeclaredWindows]:  # noqa: UP045
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"start", "end", "size"}:
        raise ValueError(f"windows ({value!r}) must be {{start: S, end: E, size: SECONDS}} "
                         "(epoch seconds; end may be null for an unbounded stream)")
    return DeclaredWindows(start=value["start"], end=value["end"], size=value["size"])


# -- manifest -------------------------------------------------------------------------------------
class _SumCountsFn(beam.CombineFn):
    """Sums ``(name, n)`` pairs into a dict (operational counts of one window). ``rounded``: the
    step's schema reads privacy ids ``rounded``, so its count of records whose id is 2**53 or
    beyond (``privacy_ids_rounded``, 0 when none) is kept, as in the API's manifests."""

    def __init__(self, *, rounded: bool = False) -> None:
        self._keys = _COUNT_KEYS + (("privacy_ids_rounded",) if rounded else ())

    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, acc: dict, item: tuple[str, int]) -> dict:
        acc[item[0]] = acc.get(item[0], 0) + int(item[1])
        return acc

    def merge_accumulators(self, accs) -> dict:
        out: dict = {}
        for a in accs:
            for k, v in a.items():
                out[k] = out.get(k, 0) + v
        return out

    def extract_output(self, acc: dict) -> dict:
        out = {k: int(acc.get(k, 0)) for k in self._keys}
        run = {k[len(_RUN):]: int(v) for k, v in sorted(acc.items()) if k.startswith(_RUN)}
        return {**out, _RUN: run} if run else out  # the method's run-time records (H72)


def reads_rounded_ids(schema: Schema) -> bool:
    """Whether a step's encoder reads privacy ids ``rounded`` (an id column and the schema's
    ``privacy_ids: rounded``): its manifest then counts ``privacy_ids_rounded``."""
    return schema.privacy_id is not None and schema.privacy_ids == "rounded"


_COUNT_KEYS = ("rows_read", "rows_used", "rows_rejected", "rows_dropped_by_bound", "rows_out")
_RUN = "run:"
"""Prefix of a method's run-time records (``run_counts``: privbayes' choices, plausible's released)."""


class _WriteManifestFn(beam.DoFn):
    """Writes the step's manifest (one per declared window). The budget is the job ledger's as
    submitted with the pipeline (every step of it), else the step's own accountant."""

    def __init__(self, *, path: str, info: dict, ledger: "_JobLedger",
                 step: PrivacyAccountant, run_time: Any = None) -> None:
        self._path, self._info, self._ledger, self._step = path, info, ledger, step
        self._run_time = run_time  # the method's run_time_details (the API's hook), or None

    def process(self, counts: dict, window=beam.DoFn.WindowParam,
                outside: Optional[int] = None):  # noqa: UP045 (side input, keyword)
        info = dict(self._info, accountant=(self._ledger.accountant or self._step).to_dict())
        path = self._path
        details = dict(info.pop("details"))
        counts = dict(counts)
        run = counts.pop(_RUN, {})
        if self._run_time is not None:  # this window's run-time figures, as the API's manifest
            details["method"], private = self._run_time(details["method"], run)
            if private:  # exact figures (plausible's tested): operational only
                counts["method"] = private
        if outside is not None:  # the run's rows outside every declared window (rule 8)
            counts = dict(counts, rows_outside_windows=int(outside))
        if isinstance(window, IntervalWindow):  # a declared window
            path = window_output_path(path, window)
            details["window"] = {"start": int(window.start.micros) // 1_000_000,
                                 "end": int(window.end.micros) // 1_000_000}
        manifest = build_manifest(outputs={"manifest": path}, counts=counts, details=details, **info)
        write_json_atomic(path, manifest)
        yield path


_REQUIRED = {"schema": "a schema file or a bundled name such as adult",
             "epsilon": "the step's total ε, > 0"}


def config_checked(step: str, required: Optional[dict[str, str]] = None) -> Any:  # noqa: UP045
    """Decorator: ``__init__`` with its config keys checked in the step's own words. Beam YAML
    reports a TypeError with 'keyword' cut out (``Synthesize.__init__() missing 1 required -only
    argument: 'schema'``), so unknown and missing keys raise a ValueError naming the step (and the
    nearest key) instead. ``required`` describes required keys for the message."""
    what = dict(_REQUIRED, **(required or {}))

    def decorate(init: Any) -> Any:
        params = [p for name, p in inspect.signature(init).parameters.items() if name != "self"]
        names = [p.name for p in params]
        needed = [p.name for p in params if p.default is p.empty]

        @functools.wraps(init)
        def checked(self: Any, **config: Any) -> None:
            unknown = [k for k in config if k not in names]
            if unknown:
                close = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.6)
                raise ValueError(f"{step}: unknown config key {unknown[0]!r}"
                                 + (f" (did you mean {close[0]!r}?)" if close else "")
                                 + f"; its config takes: {', '.join(names)} (docs/releases.md, "
                                 "Beam YAML)")
            missing = [k for k in needed if k not in config]
            if missing:
                raise ValueError(f"{step}: config needs " + ", ".join(
                    f"{k}: ({what.get(k, 'required')})" for k in missing)
                    + " (docs/releases.md, Beam YAML)")
            for key in ("epsilon", "delta", "count_fraction", "threshold"):
                if key in config:
                    check_number(f"{step}: {key}", config[key])
            init(self, **config)

        return checked

    return decorate


def check_step_config(*, batch_rows: Any, error_handling: Any, manifest: Any,
                      position_field: Any, seed: Any = None,
                      outputs: tuple[str, ...] = ("output",)) -> Optional[str]:  # noqa: UP045
    """Validate the config keys every beamsynth YAML step shares; the error output's name.
    ``outputs``: the step's release outputs, which the error output must not shadow."""
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows ({batch_rows!r}) must be an int >= 1")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed ({seed!r}) must be an int (tests and demos only) or absent "
                         "(secure noise)")
    if error_handling is not None and not (isinstance(error_handling, dict)
                                           and isinstance(error_handling.get("output"), str)):
        raise ValueError(f"error_handling ({error_handling!r}) must be {{output: NAME}}")
    if error_handling is not None and error_handling["output"] in outputs:
        # {output: output} replaced the released rows by the error rows under one tag (H70)
        raise ValueError(f"error_handling output {error_handling['output']!r} is also a release "
                         f"output of the step ({', '.join(outputs)}); name it e.g. "
                         "{output: rejected}")
    if manifest is not None and not (isinstance(manifest, str) and manifest):
        raise ValueError(f"manifest ({manifest!r}) must be a path")
    if position_field is not None and not (isinstance(position_field, str) and position_field):
        raise ValueError(f"position_field ({position_field!r}) must be a field name")
    return None if error_handling is None else error_handling["output"]


def check_method_name(method: Any) -> None:
    """Refuse (when built) a ``method:`` that names no registered synthesis method, in YAML words
    with the nearest name (the registry's own ``unknown method 'privbays'; available: [...]``
    named neither the step nor the key, H84)."""
    try:
        if isinstance(method, str):
            get_method(method)
            return
    except ValueError:
        pass
    names = sorted(METHODS)
    close = difflib.get_close_matches(str(method), names, n=1, cutoff=0.6)
    raise ValueError(f"{STEP}: method: {method!r} is not a synthesis method"
                     + (f" (did you mean {close[0]!r}?)" if close else "")
                     + f"; methods: {', '.join(names)} (docs/methods.md)")


def check_options(method: str, options: Any) -> dict:
    """Refuse (when built) a step's ``options`` the method would misread: not a mapping, an
    unknown key (with the nearest), a value of the wrong kind or out of range (``degree: 1.5``
    ran as degree 1, ``pb_noise: 0`` as the default, ``allow_non_dp: 'no'`` as true); every
    message spells the YAML key. The check is the methods layer's, shared with the API (H73:
    ``pipelines/methods/options.py``); this adds the step's name, YAML's text numbers and, for an
    option another method reads (``degree`` under ``method: independent``), that method (H84)."""
    if isinstance(options, dict):
        own = method_option_names(method)
        for name in options:
            others = [] if name in own else [
                m for m in sorted(METHODS) if m != method and name in method_option_names(m)]
            if others:
                raise ValueError(
                    f"{STEP}: options: {{{name}: ...}}: {name} is an option of method "
                    f"{' and '.join(others)}, not of method: {method} (its options: "
                    f"{', '.join(sorted(own)) or 'none'}); change method: or drop the option "
                    "(docs/options.md)")
    return check_method_options(get_method(method), options, Vocabulary("yaml"),
                                where=f"{STEP}: ", text_note=_text_number)


def warn_at_build(step: str, seed: Optional[int], errors: Optional[str], what: str,  # noqa: UP045
                  counter: str = "rows_rejected_schema", *, manifest: Optional[str] = "",  # noqa: UP045
                  epsilon: float = 0.0) -> None:
    """The build-time warnings of a step: a seed (``what`` are the rows it counts as not for
    release), no error output (bad rows dropped and counted in ``beamsynth/<counter>``) and no
    ``manifest`` (``None``: the step's spends of ``epsilon`` are recorded in no file; brief rule
    3, as the API warns for a job without ``bs.WriteManifest``)."""
    if manifest is None:
        _LOG.warning("%s: no manifest: this step spends ε=%g and its spends are recorded in no "
                     "file; give it manifest: PATH (a bounded input) and keep that file with the "
                     "release", step, epsilon)
    if seed is not None:
        _LOG.warning("%s: seed=%d: %s (fixed randomness is for tests and demos; the output is "
                     "marked in the manifest and %s counted in beamsynth/"
                     "seeded_rows_not_for_release)", step, seed, SEEDED_NOTE, what)
    if errors is None:
        _LOG.warning("%s: no error_handling output: rows that do not fit the schema are "
                     "dropped and counted (beamsynth/%s), never raised or logged", step, counter)


def check_step_windows(pcoll: Any, windows: Optional[DeclaredWindows], name: str) -> None:  # noqa: UP045
    """Refuse (when built) an unbounded input without declared windows and any windowing of the
    input other than the global window (``name``: ``"<STEP> 'label'"``)."""
    if windows is not None:
        return
    if not pcoll.is_bounded and isinstance(pcoll.windowing.windowfn, GlobalWindows):
        raise ValueError(
            f"{name}: the input is unbounded (a stream) and the step has no "
            "windows, so it would never release; give the step windows: {start: S, end: E, "
            "size: SECONDS} (declared in advance, docs/releases.md)")
    try:
        check_release_windowing(pcoll, name, qualify=False)
    except ValueError as exc:
        raise ValueError(f"{exc}; in Beam YAML give the step windows: {{start: S, end: E, "
                         "size: SECONDS}} instead of windowing its input") from None


def check_step_fields(pcoll: Any, schema: Schema, name: str,
                      named: Optional[dict[str, Optional[str]]] = None) -> Any:  # noqa: UP045
    """The rows the step reads (``pcoll``, or a DataFrame read's rows with every declared field:
    :func:`~beamsynth.transforms.frame_fields.with_declared_fields`; call it inside ``expand``).
    Warn (when built) about typed rows that carry none of the declared columns (the parse
    step forgotten: ``ReadFromText`` gives ``Row(line)``): every row would be an error row and
    the release learned from no record. A warning, not a refusal: ``ReadFromJson`` infers the
    rows' type from the records, so a refusal would make whether a release happens depend on
    one record (rule 7). Field names only (the element type, known when built). ``named``: config
    keys naming a field (``privacy_id``, ``position_field``), each warned about with the nearest
    field when no input row carries it (H84: ``privacy_id: custmer`` sent every row to the error
    output without a word)."""
    # rows of a Beam DataFrame read (ReadFromJson, ReadFromCsv) are read with every declared
    # field, whatever Beam sampled when built (one sampled record decided every row's fields; H103)
    pcoll = with_declared_fields(pcoll, [c.name for c in schema.columns] + [schema.privacy_id or ""]
                                 + [f for f in (named or {}).values() if f])
    fields = getattr(pcoll.element_type, "_fields", None)
    if not isinstance(pcoll.element_type, RowTypeConstraint) or not fields:
        return pcoll
    declared = [c.name for c in schema.columns]
    known = {n for c in declared for n in (c, avro_field_name(c))}
    names = [f[0] for f in fields]
    for key, field in (named or {}).items():
        if field is None or field in names or avro_field_name(field) in names:
            continue
        close = difflib.get_close_matches(field, names, n=1, cutoff=0.6)
        effect = ("every row would lack it and go to the error output (required field missing), "
                  "and the release would learn from no record" if key == "privacy_id" else
                  "so every error row's row would be null")
        _LOG.warning("%s", f"{name}: {key} {field!r} is not a field of its input rows"
                     + (f" (did you mean {close[0]!r}?; fields: {names})" if close
                        else f" (fields: {names})") + f": {effect}")
    if not known.intersection(names):
        _LOG.warning(
            "%s", f"{name}: its input rows have fields {names}, none of schema "
            f"{schema.name!r}'s columns ({', '.join(declared[:6])}"
            f"{', ...' if len(declared) > 6 else ''}), so no row carries a declared value; parse "
            "the records first (ReadFromCsv, ReadFromJson, ReadFromParquet, or MapToFields "
            "after ReadFromText) so each column is a field")
    return pcoll


#: the rows of a step's ``error_handling`` output (private: raw rows with reasons)
ERROR_ROW_TYPE = RowTypeConstraint.from_fields(
    [("source", str), ("row", Optional[int]), ("reason", str), ("raw", str)])  # noqa: UP045


class Synthesize(beam.PTransform):
    """Beam YAML step ``BeamsynthSynthesize``: schema'd rows in, DP synthetic rows out.

    Config (keyword arguments): ``schema`` (a schema file or bundled name), ``epsilon`` (total ε
    of this step, > 0), ``delta`` (default 0), ``method`` (a registered method, default
    ``independent``), ``rows`` (rows to synthesize; default a DP count spending
    ``count_fraction`` of ε), ``privacy_id`` / ``max_contributions`` (privacy unit), ``seed``
    (tests only: output marked "seeded: not for release"), ``options`` (method options),
    ``batch_rows``, ``error_handling: {output: NAME}`` (dead-letter output), ``job_budget:
    {epsilon, delta}`` (the pipeline's total, shared by its steps), ``windows: {start, end,
    size}`` (declared windows), ``manifest`` (path of a manifest written at the end),
    ``position_field`` (an integer field giving each row's source position for dead letters;
    without it a dead letter's ``row`` is null).
    The privacy guarantee is the method's (see its docstring), for add/remove of one privacy unit,
    per declared window with ``windows``; the steps of one pipeline compose (basic composition).
    """

    #: whether a seeded step is marked (build-time warning, row counter); the manifest's
    #: ``randomness`` says "seeded: not for release" regardless. Only audits turn it off.
    mark_seeded = True

    @config_checked(STEP)
    def __init__(self, *, schema: str, epsilon: float, delta: float = 0.0,
                 method: str = "independent", rows: Optional[int] = None,  # noqa: UP045
                 count_fraction: float = 0.05, privacy_id: Optional[str] = None,  # noqa: UP045
                 max_contributions: int = 1, seed: Optional[int] = None,  # noqa: UP045
                 options: Optional[dict] = None, batch_rows: int = 20_000,  # noqa: UP045
                 error_handling: Optional[dict] = None,  # noqa: UP045
                 job_budget: Optional[dict] = None,  # noqa: UP045
                 windows: Optional[dict] = None,  # noqa: UP045
                 manifest: Optional[str] = None,  # noqa: UP045
                 position_field: Optional[str] = None) -> None:  # noqa: UP045
        super().__init__()
        errors = check_step_config(batch_rows=batch_rows, error_handling=error_handling,
                                   manifest=manifest, position_field=position_field, seed=seed)
        self._position = position_field
        self._job_budget = _budget_from_config(job_budget, "job_budget")
        self._windows = _windows_from_config(windows)
        check_method_name(method)
        if self._windows is not None and method not in EMPTY_WINDOW_METHODS:
            raise ValueError(f"method {method!r} cannot release an empty window; with windows the "
                             f"step supports {list(EMPTY_WINDOW_METHODS)}")
        options = check_options(method, options)
        cfg = SynthesisConfig(input=_SOURCE, schema=load_step_schema(STEP, schema), output=_SOURCE,
                              epsilon=epsilon, delta=delta, method=method, rows=rows,
                              privacy_id=privacy_id, max_contributions=max_contributions,
                              seed=seed, count_fraction=count_fraction,
                              options=options)
        # spends the step's budget now, before any data is read; messages spell YAML keys
        self._plan = plan_synthesis(cfg, vocabulary=Vocabulary("yaml"))
        warn_ambiguous_values(self._plan.schema, STEP)
        if self._job_budget is not None and not PrivacyAccountant(total=self._job_budget).can_spend(
                self._plan.accountant.total):
            raise ValueError(f"{STEP}: epsilon/delta ({self._plan.accountant.total}) exceed the "
                             f"declared job_budget ({self._job_budget})")
        self._batch_rows = batch_rows
        self._errors = errors
        self._manifest = manifest
        warn_at_build(STEP, seed if self.mark_seeded else None, errors, "its rows",
                      manifest=manifest, epsilon=self._plan.accountant.total.epsilon)

    @property
    def accountant(self) -> PrivacyAccountant:
        """The step's own privacy accountant (its spends; see :func:`job_accountant`)."""
        return self._plan.accountant

    @property
    def randomness(self) -> str:
        """``"seeded: not for release"`` with a seed, else secure."""
        return SEEDED_NOTE if self._plan.config.seed is not None else SECURE_NOTE

    def _register(self, pipeline: beam.Pipeline) -> "_JobLedger":
        claim_pipeline_budget(pipeline, f"{STEP} {self.label!r}")  # no API PrivacyJob beside it
        ledger = _LEDGERS.setdefault(pipeline, _JobLedger())
        unit = (self._plan.schema.privacy_id, self._plan.config.max_contributions)
        # the full label names the spends: two steps "S" in two composites were both "S/..." (H55)
        self._step = pipeline._current_transform().full_label or self.label
        ledger.add(self._step, self._plan.accountant, self._job_budget, unit, windows=self._windows,
                   manifest=self._manifest, seed=self._plan.config.seed)
        return ledger

    def display_data(self) -> dict[str, Any]:
        """Method, the step's budget and declared sizes (never data values)."""
        plan = self._plan
        total = plan.accountant.total
        return display_items(
            mechanism=f"{plan.method.name} synthesis (Beam YAML step)", epsilon=total.epsilon,
            delta=total.delta, columns=len(plan.schema.columns),
            declared_cells=sum(plan.schema.shape),
            rows="DP count" if plan.config.rows is None else plan.config.rows,
            declared_windows=self._windows is not None)

    def expand(self, pcoll):
        check_step_windows(pcoll, self._windows, f"{STEP} {self.label!r}")
        pcoll = check_step_fields(pcoll, self._plan.schema, f"{STEP} {self.label!r}",
                                  {"privacy_id": self._plan.schema.privacy_id,
                                   "position_field": self._position})
        ledger = self._register(pcoll.pipeline)  # raises when the pipeline's steps overspend
        plan, cfg, schema = self._plan, self._plan.config, self._plan.schema
        outside = None
        late_rows = self._windows is not None and not pcoll.is_bounded  # SplitLate below
        if self._windows is not None:
            split = pcoll | "Outside" >> beam.ParDo(
                _OutsideRowsFn(self._windows, self._position)).with_outputs("outside", main="inside")
            outside = split.outside  # Rejected (global window): stamped outside the declared range
            pcoll = split.inside | "DeclaredWindows" >> beam.WindowInto(self._windows)
            # beam.Row in its declared window
            if late_rows:  # a stream: rows arriving after their window's release
                gate = pcoll | "SplitLate" >> SplitLate()
                pcoll = gate["on_time"]  # in time for every release of the window
                late = (gate["late"] | "LateRows" >> beam.ParDo(_LateRowsFn(self._position))
                        | "GlobalLate" >> beam.WindowInto(GlobalWindows()))
                outside = (outside, late) | "JoinLate" >> beam.Flatten()
                # Rejected (global window): outside the declared range, or late
        enc = (
            pcoll
            | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=self._batch_rows
                                            ).with_output_types(list)
            # list[beam.Row]: untyped, or Beam sizes a batch with the input's RowCoder, which
            # fails the run on a row breaking its declared (e.g. ReadFromJson-inferred) schema
            | "Encode" >> beam.ParDo(_EncodeRowsFn(schema, self._position)).with_outputs("rejected", main="batches")
        )
        batches = enc["batches"]
        # EncodedBatch of rows that fit the schema; rejected: Rejected (private)
        if schema.privacy_id is not None:
            batches = batches | "BoundContributions" >> BoundContributions(
                max_contributions=cfg.max_contributions, seed=cfg.seed)
            # EncodedBatch, <= k rows per privacy id
        tables, _models, _rows = synthesize_batches(batches, plan, side_input=self._windows is None)
        # pyarrow.Table
        if cfg.seed is not None and self.mark_seeded:
            tables = tables | "CountSeeded" >> beam.ParDo(_CountSeededFn())
            # pyarrow.Table (rows counted as not for release)
        if self._windows is None:
            out = tables | "ToRows" >> beam.FlatMap(_table_rows, schema.names).with_output_types(
                row_type_for(schema))
        else:  # window_start first, as the API's rows: one Parquet file of all windows says which
            out = tables | "ToRows" >> beam.ParDo(WindowRowsFn(_table_rows, (schema.names,))
                                                  ).with_output_types(window_row_type(row_type_for(schema)))
        # beam.Row per synthetic record
        if self._manifest is not None:
            self._write_manifest(enc, batches, tables, ledger, late_rows=late_rows,
                                 outside=None if late_rows else outside)
        if self._errors is None:
            return out  # rejected rows: counted (metrics, manifest) and dropped
        rejected = enc["rejected"]
        if outside is not None:  # dead letters in the global window, as in the API
            rejected = ((rejected | "GlobalRejected" >> beam.WindowInto(GlobalWindows()), outside)
                        | "WithOutside" >> beam.Flatten())
            if not rejected.is_bounded:  # a stream: kept by sinks that window by event time
                rejected = rejected | "StampNow" >> beam.Map(stamp_now)
        # without position_field a row's place in its batch is no position (BatchElements sizes
        # batches by timing: line 401 came out as row 145, then 25), so it is null
        positioned = self._position is not None
        step = self._step  # the source of its error rows, as the statistics steps' (H70)
        rejected = rejected | "RejectedRows" >> beam.Map(
            lambda r: beam.Row(source=step, row=r.row if positioned else None,
                               reason=r.reason, raw=r.raw)
        ).with_output_types(ERROR_ROW_TYPE)
        return {"output": out, self._errors: rejected}

    @staticmethod
    def _run_counts(method: Any) -> tuple:
        """The method's run-time records (``(field, n)`` per window), prefixed for the sum."""
        runs = getattr(method, "run_counts", None)
        if runs is None:
            return ()
        return (runs | "PrefixRunCounts" >> beam.Map(lambda kv: (_RUN + kv[0], kv[1])),)

    def _default_trigger(self, tables, label: str = "OutWindows"):
        """``tables`` (or the method's run-time records) with the declared windows' default
        trigger, as the other counts: a release per window carries AfterWatermark, and a Flatten
        of both logged Beam's "All input pcollections must have the same window" when built
        (H84). Each is stamped at its window's end, so it stays in its window."""
        if self._windows is None:
            return tables
        return tables | label >> beam.WindowInto(self._windows)

    def _write_manifest(self, enc, batches, tables, ledger: "_JobLedger", *,
                        late_rows: bool = False, outside=None) -> None:
        plan, cfg = self._plan, self._plan.config
        counts = (
            (enc["batches"] | "ReadCounts" >> beam.Map(lambda b: ("rows_read", len(b))),
             enc["batches"] | "BoundIn" >> beam.Map(lambda b: ("rows_dropped_by_bound", len(b))),
             batches | "BoundOut" >> beam.Map(lambda b: ("rows_dropped_by_bound", -len(b))),
             enc["rejected"] | "RejectedCounts" >> beam.Map(lambda _r: ("rows_rejected", 1)),
             enc["rejected"] | "RejectedRead" >> beam.Map(lambda _r: ("rows_read", 1)),
             batches | "UsedCounts" >> beam.Map(lambda b: ("rows_used", len(b))),
             enc["batches"] | "RoundedCounts" >> beam.Map(
                 lambda b: ("privacy_ids_rounded", count_rounded_ids(b.pids))),
             self._default_trigger(tables)
             | "OutCounts" >> beam.Map(lambda t: ("rows_out", t.num_rows)),
             *[self._default_trigger(c, f"RunWindows{i}")
               for i, c in enumerate(self._run_counts(plan.method))])
            | "AllCounts" >> beam.Flatten()
        )
        # (name, rows) pairs
        info = {
            "command": f"beam-yaml {STEP}", "method": plan.method.name, "inputs": [self._step],
            "schema_name": plan.schema.name, "schema_fingerprint": plan.schema.fingerprint(),
            "seed": cfg.seed, "privacy_ids": plan.schema.privacy_ids,  # as encode_rows read ids (H83)
            "privacy_unit": {"privacy_id": plan.schema.privacy_id,
                             "max_contributions": cfg.max_contributions,
                             "per": "window" if self._windows is not None else "run",
                             "neighbouring": "add/remove one privacy unit"},
            "details": {"step": self._step, "step_budget": plan.accountant.to_dict(),
                        "method": plan.method.details(),
                        "declared_windows": None if self._windows is None else self._windows.describe(),
                        "dead_letters": "error_handling output" if self._errors else
                                        "dropped and counted (no error_handling output)"},
        }
        if late_rows:  # known when built: the input is a stream
            info["details"]["late_rows"] = (
                "rows arriving after their window's release are not in these counts: "
                + ("error_handling output" if self._errors else "dropped")
                + ", counted in beamsynth/rows_late")
        side = {}
        if outside is not None:  # a bounded input with declared windows: its rows outside them
            # are error rows of no window; every window's manifest counts them for the run (H70)
            info["details"]["rows_outside_windows"] = (
                "rows of the whole run stamped outside every declared window (error rows, in no "
                "window's rows_read; the same number in each window's manifest)")
            side["outside"] = beam.pvalue.AsSingleton(
                outside | "OutsideCount" >> beam.combiners.Count.Globally())
            # int (global window): rows outside the declared windows
        _ = (combine_globally(counts, _SumCountsFn(rounded=reads_rounded_ids(plan.schema)),
                              "SumCounts")
             # dict of exact counts, once per release window (operational, not DP)
             | "WriteManifest" >> beam.ParDo(_WriteManifestFn(
                 path=self._manifest, info=info, ledger=ledger, step=plan.accountant,
                 run_time=getattr(plan.method, "run_time_details", None)), **side))
