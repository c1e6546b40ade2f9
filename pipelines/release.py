"""Declarative releases: one YAML file → validated plan → ledger reservation → one release folder.

A release config (see ``docs/releases.md`` and :data:`RELEASE_CONFIG_SCHEMA`) names the inputs,
schemas, privacy unit, per-table mechanism and parameters, the release's total budget, output
formats, the release folder and the privacy ledger with a budget policy per data source.

:func:`load_release_config` validates the whole file **before any data is read** — unknown keys,
schemas and their domains, methods, per-column options, overspend — and reports problems with the
YAML path (``tables[1].columns.age.epsilon``). :func:`plan_release` then builds every table's
:class:`~beamsynth.pipelines.methods.synthesize.SynthesisPlan` (all spends are made here, by the methods
themselves), and :func:`run_release` reserves the spends in the
:class:`~beamsynth.pipelines.ledger.PrivacyLedger`, runs the pipelines into a hidden temp folder,
publishes it with one atomic rename and commits the reservation.

Release folder layout::

    FOLDER/release.json               public: what was released, every spend, ledger entry
    FOLDER/public/TABLE.FORMAT        the synthetic tables (DP)
    FOLDER/public/TABLE.model.json    the fitted model's description (post-processing of DP outputs)
    FOLDER/public/report.html         public report: built from the DP outputs only
    FOLDER/private/TABLE.manifest.json  full manifest incl. exact, non-DP operational counts
    FOLDER/private/TABLE.rejected.jsonl dead-letter rows (raw private data)
    FOLDER/private/report.html        quality report with private statistics (data owner only)

Publish ``public/`` and ``release.json``; keep ``private/`` with the data owner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import glob
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apache_beam as beam
import yaml
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beamsynth.pipelines.io import filesystem as fs
from beamsynth.pipelines.io.manifest import SEEDED_NOTE, build_manifest, write_json_atomic
from beamsynth.pipelines.io.preflight import check_table_inputs
from beamsynth.pipelines.io.records import METRICS_NAMESPACE, rejected_path
from beamsynth.pipelines.io.write import WriteTables
from beamsynth.pipelines.ledger import (
    RELEASE_MARKER,
    LedgerError,
    LedgerPolicy,
    LedgerSpend,
    PrivacyLedger,
    temp_folder,
)
from beamsynth.pipelines.methods.progress import Progress
from beamsynth.pipelines.methods.registry import get_method
from beamsynth.pipelines.methods.synthesize import (
    SynthesisConfig,
    SynthesisPlan,
    build_synthesis,
    counter_value,
    plan_synthesis,
)
from beamsynth.runners.presets import is_beam_dask
from beamsynth.schemas.schema import Schema, avro_field_name, load_schema
from beamsynth.schemas.tables import arrow_schema_for
from beamsynth.transforms.budget import BudgetExceededError

__all__ = [
    "FORMATS",
    "RELEASE_CONFIG_SCHEMA",
    "Progress",
    "ReleaseConfig",
    "ReleaseConfigError",
    "ReleasePlan",
    "TableSpec",
    "load_release_config",
    "plan_release",
    "public_night",
    "run_release",
]

FORMATS = ("csv", "jsonl", "avro", "parquet")
_TOP_KEYS = {"name", "description", "folder", "budget", "privacy_unit", "ledger", "seed", "demo",
             "tables", "reports"}
_TABLE_KEYS = {"name", "kind", "source", "input", "schema", "method", "epsilon", "delta", "rows",
               "count_fraction", "options", "columns", "formats", "privacy_unit", "column",
               "tolerance"}
KINDS = ("synthesize", "histogram")
_COLUMN_MECHANISMS = ("synthesize", "cathist")
_CATHIST_COLUMN_KEYS = {"mechanism", "epsilon", "tolerance", "formats"}
_KIND_KEYS = {"synthesize": {"method", "rows", "count_fraction", "options", "columns"},
              "histogram": {"column", "tolerance"}}
_UNIT_KEYS = {"privacy_id", "max_contributions"}
_LEDGER_KEYS = {"path", "policies"}
_POLICY_KEYS = {"epsilon", "delta", "window_days", "data_retention_days"}
_REPORT_KEYS = {"private", "public", "target", "max_plot_rows"}
_BUDGET_KEYS = {"epsilon", "delta"}

RELEASE_CONFIG_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "beamsynth release configuration",
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "folder", "budget", "ledger", "tables"],
    "$defs": {
        "budget": {"type": "object", "additionalProperties": False, "required": ["epsilon"],
                   "properties": {"epsilon": {"type": "number", "exclusiveMinimum": 0},
                                  "delta": {"type": "number", "minimum": 0, "exclusiveMaximum": 1}}},
        "unit": {"type": "object", "additionalProperties": False,
                 "properties": {"privacy_id": {"type": ["string", "null"]},
                                "max_contributions": {"type": "integer", "minimum": 1}}},
    },
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "folder": {"type": "string", "description": "release folder; {name} and {date} are filled in"},
        "budget": {"$ref": "#/$defs/budget"},
        "privacy_unit": {"$ref": "#/$defs/unit"},
        "seed": {"type": ["integer", "null"], "description": "only with demo: true"},
        "demo": {"type": "boolean",
                 "description": "tests and demos only: allows a seed; outputs say 'not for release'"},
        "ledger": {
            "type": "object", "additionalProperties": False, "required": ["path", "policies"],
            "properties": {
                "path": {"type": "string"},
                "policies": {"type": "object", "additionalProperties": {
                    "type": "object", "additionalProperties": False, "required": ["epsilon"],
                    "properties": {"epsilon": {"type": "number", "exclusiveMinimum": 0},
                                   "delta": {"type": "number", "minimum": 0},
                                   "window_days": {"type": "number", "exclusiveMinimum": 0},
                                   "data_retention_days": {
                                       "type": "number", "exclusiveMinimum": 0,
                                       "description": "declaration required by window_days: the "
                                                      "most days one record stays in the nightly "
                                                      "input (<= window_days)"}}}},
            }},
        "reports": {"type": "object", "additionalProperties": False,
                    "properties": {"private": {"type": "boolean"}, "public": {"type": "boolean"},
                                   "target": {"type": ["string", "null"]},
                                   "max_plot_rows": {"type": "integer", "minimum": 1}}},
        "tables": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "required": ["name", "input", "schema", "epsilon"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
                "kind": {"enum": ["synthesize", "histogram"]},
                "column": {"type": "string"},
                "tolerance": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "source": {"type": "string"},
                "input": {"type": ["string", "array"]},
                "schema": {"type": ["string", "object"]},
                "method": {"type": "string"},
                "epsilon": {"type": "number", "exclusiveMinimum": 0},
                "delta": {"type": "number", "minimum": 0},
                "rows": {"type": ["integer", "null"], "minimum": 0},
                "count_fraction": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "options": {"type": "object"},
                "columns": {"type": ["array", "object"]},
                "formats": {"type": "array", "items": {"enum": list(FORMATS)}, "minItems": 1},
                "privacy_unit": {"$ref": "#/$defs/unit"},
            }}},
    },
}


class ReleaseConfigError(ValueError):
    """A release configuration problem, reported with the YAML path of the offending entry."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.yaml_path = path


@dataclass(frozen=True)
class TableSpec:
    """One table of a release, validated."""

    name: str
    source: str
    inputs: tuple[str, ...]
    schema: Schema
    method: str
    epsilon: float
    delta: float
    rows: int | None
    count_fraction: float
    options: dict[str, Any]
    formats: tuple[str, ...]
    privacy_id: str | None
    max_contributions: int
    kind: str = "synthesize"
    column: str | None = None
    tolerance: float | None = None
    where: str = ""
    """YAML path of the entry that defines this table (``tables[1]``, ``tables[1].columns.c``)."""

    @property
    def privacy_unit(self) -> str:
        """Ledger form of the privacy unit, e.g. ``record`` or ``person_id×3``."""
        return "record" if self.privacy_id is None else f"{self.privacy_id}×{self.max_contributions}"


@dataclass(frozen=True)
class ReleaseConfig:
    """A validated release configuration (paths resolved against the config file's folder)."""

    name: str
    description: str
    folder: str
    epsilon: float
    delta: float
    ledger_path: str
    policies: dict[str, LedgerPolicy]
    seed: int | None
    tables: tuple[TableSpec, ...]
    demo: bool = False
    private_report: bool = True
    public_report: bool = True
    target: str | None = None
    max_plot_rows: int = 50_000
    config_path: str | None = None


@dataclass
class ReleasePlan:
    """A release whose every spend is made (nothing read yet)."""

    config: ReleaseConfig
    plans: dict[str, SynthesisPlan]
    spends: list[LedgerSpend] = field(default_factory=list)


# -- validation ------------------------------------------------------------------------------------
def _keys(data: Any, allowed: set[str], path: str, *, required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ReleaseConfigError(path, f"must be a mapping, got {data!r}")
    unknown = sorted(set(data) - allowed)
    if unknown:
        where = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ReleaseConfigError(where, f"unknown key (allowed: {sorted(allowed)})")
    for key in required:
        if key not in data:
            raise ReleaseConfigError(f"{path}.{key}" if path else key, "is required")
    return dict(data)


def _number(value: Any, path: str, *, low: float, high: float | None = None,
            low_open: bool = True, high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReleaseConfigError(path, f"must be a number, got {value!r}")
    v = float(value)
    bad = (v <= low if low_open else v < low) or (
        high is not None and (v >= high if high_open else v > high)) or v != v
    if bad:
        rng = ("(" if low_open else "[") + f"{low:g}, " + (
            "∞)" if high is None else f"{high:g}" + (")" if high_open else "]"))
        raise ReleaseConfigError(path, f"({value!r}) must be in {rng}")
    return v


def _int(value: Any, path: str, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ReleaseConfigError(path, f"({value!r}) must be an integer >= {low}")
    return value


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ReleaseConfigError(path, f"must be a non-empty string, got {value!r}")
    return value


def _unit(data: Any, path: str, base: tuple[str | None, int]) -> tuple[str | None, int]:
    if data is None:
        return base
    d = _keys(data, _UNIT_KEYS, path)
    pid = d.get("privacy_id", base[0])
    if pid is not None and not isinstance(pid, str):
        raise ReleaseConfigError(f"{path}.privacy_id", f"must be a column name or null, got {pid!r}")
    k = _int(d.get("max_contributions", base[1]), f"{path}.max_contributions", low=1)
    if pid is None and k != 1:
        raise ReleaseConfigError(f"{path}.max_contributions",
                                 f"({k}) needs a privacy_id; without one every record is its own unit")
    return pid, k


def _resolve(base: Path, p: str) -> str:
    if not fs.is_local(p):  # gs://, s3://, hdfs://, ...: a Beam file system path, kept as is
        return p
    return str(p) if os.path.isabs(p) else str((base / p).resolve())


def _table(data: Any, i: int, base: Path, unit: tuple[str | None, int], default_source: str,
           seen: set[str]) -> list[TableSpec]:
    path = f"tables[{i}]"
    d = _keys(data, _TABLE_KEYS, path, required=("name", "input", "schema", "epsilon"))
    name = _string(d["name"], f"{path}.name")
    if not all(ch.isalnum() or ch in "_.-" for ch in name):
        raise ReleaseConfigError(f"{path}.name", f"({name!r}) may use only letters, digits, _ . -")
    if name in seen:
        raise ReleaseConfigError(f"{path}.name", f"({name!r}) repeats another table's name")
    seen.add(name)
    source = _string(d.get("source", default_source), f"{path}.source")
    raw_inputs = d["input"] if isinstance(d["input"], list) else [d["input"]]
    inputs = []
    for j, pattern in enumerate(raw_inputs):
        where = f"{path}.input" + (f"[{j}]" if isinstance(d["input"], list) else "")
        full = _resolve(base, _string(pattern, where))
        if not glob.glob(full):
            raise ReleaseConfigError(where, f"no file matches {full!r}")
        inputs.append(full)
    schema_src = d["schema"]
    try:
        if isinstance(schema_src, Mapping):
            schema = load_schema(schema_src)
        else:
            s = _string(schema_src, f"{path}.schema")
            local = base / s
            schema = load_schema(str(local) if local.exists() else s)
    except ValueError as exc:
        raise ReleaseConfigError(f"{path}.schema", str(exc)) from None
    pid, k = _unit(d.get("privacy_unit"), f"{path}.privacy_unit", unit)
    kind = d.get("kind", "synthesize")
    if kind not in KINDS:
        raise ReleaseConfigError(f"{path}.kind", f"({kind!r}) must be one of {list(KINDS)}")
    for other, keys in _KIND_KEYS.items():
        for key in sorted(keys - _KIND_KEYS[kind]):
            if other != kind and key in d:
                raise ReleaseConfigError(f"{path}.{key}", f"is not used by kind {kind!r} (it is "
                                                          f"for kind {other!r})")
    if kind == "histogram":
        return [_histogram_table(d, path, name=name, source=source, inputs=tuple(inputs),
                                 schema=schema, privacy_id=pid, max_contributions=k)]
    method = _string(d.get("method", "independent"), f"{path}.method")
    try:
        method_cls = get_method(method)
    except ValueError as exc:
        raise ReleaseConfigError(f"{path}.method", str(exc)) from None
    options = d.get("options", {}) or {}
    if not isinstance(options, Mapping):
        raise ReleaseConfigError(f"{path}.options", f"must be a mapping, got {options!r}")
    options = dict(options)
    cols = d.get("columns")
    extra: list[TableSpec] = []
    if cols is not None:
        full = schema
        schema, column_options, cathist = _columns(cols, f"{path}.columns", schema, method_cls)
        if column_options:
            options["columns"] = column_options
        for col, opts in cathist.items():
            where = f"{path}.columns.{col}"
            sub = f"{name}.{avro_field_name(col)}"
            if sub in seen:
                raise ReleaseConfigError(where, f"its table name {sub!r} repeats another table's")
            seen.add(sub)
            if "epsilon" not in opts:
                raise ReleaseConfigError(f"{where}.epsilon", "is required for mechanism 'cathist'")
            entry = {"column": col, **{k: v for k, v in opts.items()
                                       if k in ("epsilon", "tolerance", "formats")}}
            extra.append(_histogram_table(entry, where, name=sub, source=source,
                                          inputs=tuple(inputs), schema=full, privacy_id=pid,
                                          max_contributions=k))
    formats = d.get("formats", ["csv"])
    if not isinstance(formats, list) or not formats:
        raise ReleaseConfigError(f"{path}.formats", f"must be a non-empty list of {list(FORMATS)}")
    for j, f in enumerate(formats):
        if f not in FORMATS:
            raise ReleaseConfigError(f"{path}.formats[{j}]", f"({f!r}) must be one of {list(FORMATS)}")
    if len(set(formats)) != len(formats):
        raise ReleaseConfigError(f"{path}.formats", f"({formats!r}) lists a format twice")
    rows = d.get("rows")
    if rows is not None:
        rows = _int(rows, f"{path}.rows", low=0)
    return [TableSpec(
        name=name, source=source, inputs=tuple(inputs), schema=schema, method=method,
        epsilon=_number(d["epsilon"], f"{path}.epsilon", low=0),
        delta=_number(d.get("delta", 0.0), f"{path}.delta", low=0, high=1, low_open=False, high_open=True),
        rows=rows,
        count_fraction=_number(d.get("count_fraction", 0.05), f"{path}.count_fraction", low=0,
                               high=1, high_open=True),
        options=options, formats=tuple(formats), privacy_id=pid, max_contributions=k,
        where=path)] + extra


def _histogram_table(d: dict[str, Any], path: str, *, name: str, source: str,
                     inputs: tuple[str, ...], schema: Schema, privacy_id: str | None,
                     max_contributions: int) -> TableSpec:
    """A CatHist table: one declared column released as a DP histogram (no synthesis)."""
    if "column" not in d:
        raise ReleaseConfigError(f"{path}.column", "is required for kind 'histogram'")
    col = d["column"]
    if col not in schema.names:
        raise ReleaseConfigError(f"{path}.column", f"({col!r}) is not a column of schema "
                                                   f"{schema.name!r} (columns: {schema.names})")
    tolerance = d.get("tolerance", schema.column(col).tolerance)
    if tolerance is None:
        raise ReleaseConfigError(f"{path}.tolerance", "is required (the schema declares no "
                                                      f"tolerance for column {col!r})")
    tolerance = _number(tolerance, f"{path}.tolerance", low=0, high=1, high_open=True)
    if d.get("delta", 0) not in (0, 0.0):
        raise ReleaseConfigError(f"{path}.delta", f"({d['delta']!r}) must be 0: CatHist is pure ε-DP")
    formats = d.get("formats", ["csv"])
    if not isinstance(formats, list) or len(formats) != 1 or formats[0] not in FORMATS:
        raise ReleaseConfigError(f"{path}.formats", f"({formats!r}) must be one of {list(FORMATS)} "
                                                    "in a one-item list for kind 'histogram'")
    if privacy_id == col:
        raise ReleaseConfigError(f"{path}.column", f"({col!r}) is the privacy id column")
    return TableSpec(
        name=name, source=source, inputs=inputs, schema=schema, method="cathist",
        epsilon=_number(d["epsilon"], f"{path}.epsilon", low=0), delta=0.0, rows=None,
        count_fraction=0.05, options={}, formats=tuple(formats), privacy_id=privacy_id,
        max_contributions=max_contributions, kind="histogram", column=col, tolerance=tolerance,
        where=path)


def _columns(cols: Any, path: str, schema: Schema,
             method_cls: type) -> tuple[Schema, dict[str, Any], dict[str, dict[str, Any]]]:
    """Select the synthesized columns; per-column options where the method declares them.

    A column whose options say ``mechanism: cathist`` is not synthesized: it is released as its
    own DP histogram (returned in the third item with its options).
    """
    allowed = set(getattr(method_cls, "column_options", ()) or ())
    cathist: dict[str, dict[str, Any]] = {}
    if isinstance(cols, list):
        names, per = cols, {}
        for j, c in enumerate(cols):
            if not isinstance(c, str) or c not in schema.names:
                raise ReleaseConfigError(f"{path}[{j}]", f"({c!r}) is not a column of schema "
                                                         f"{schema.name!r} (columns: {schema.names})")
    elif isinstance(cols, Mapping):
        names, per = list(cols), {}
        for c, opts in cols.items():
            if c not in schema.names:
                raise ReleaseConfigError(f"{path}.{c}", f"is not a column of schema {schema.name!r} "
                                                        f"(columns: {schema.names})")
            opts = {} if opts is None else opts
            if not isinstance(opts, Mapping):
                raise ReleaseConfigError(f"{path}.{c}", f"must be a mapping of options, got {opts!r}")
            mechanism = opts.get("mechanism", "synthesize")
            if mechanism not in _COLUMN_MECHANISMS:
                raise ReleaseConfigError(f"{path}.{c}.mechanism", f"({mechanism!r}) must be one of "
                                                                  f"{list(_COLUMN_MECHANISMS)}")
            if mechanism == "cathist":
                for key in opts:
                    if key not in _CATHIST_COLUMN_KEYS:
                        raise ReleaseConfigError(f"{path}.{c}.{key}", "unknown key for mechanism "
                                                 f"'cathist' (allowed: {sorted(_CATHIST_COLUMN_KEYS)})")
                cathist[c] = dict(opts)
                continue
            for key in (k for k in opts if k != "mechanism"):
                if key not in allowed:
                    raise ReleaseConfigError(
                        f"{path}.{c}.{key}",
                        f"method {method_cls.name!r} takes no per-column option {key!r} (it takes: "
                        f"{sorted(allowed) or 'none'})")
            if any(k != "mechanism" for k in opts):
                per[c] = {k: v for k, v in opts.items() if k != "mechanism"}
        names = [c for c in names if c not in cathist]
    else:
        raise ReleaseConfigError(path, f"must be a list of column names or a mapping, got {cols!r}")
    if not names:
        raise ReleaseConfigError(path, "must name at least one synthesized column")
    if len(set(names)) != len(names):
        raise ReleaseConfigError(path, f"({names!r}) names a column twice")
    return schema.select(names), per, cathist


def load_release_config(source: str | os.PathLike[str] | Mapping[str, Any], *,
                        date: str | None = None) -> ReleaseConfig:
    """Read and validate a release config (a YAML file or a mapping); reads no data.

    ``date`` (``YYYY-MM-DD``, default today in UTC) fills ``{date}`` in the folder.
    """
    if isinstance(source, Mapping):
        data, base, cfg_path = dict(source), Path.cwd(), None
    else:
        cfg_path = str(source)
        try:
            text = Path(cfg_path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ReleaseConfigError("", f"cannot read release config {cfg_path!r}: {exc}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ReleaseConfigError("", f"{cfg_path!r} is not valid YAML: {exc}") from None
        base = Path(cfg_path).resolve().parent
    d = _keys(data, _TOP_KEYS, "", required=("name", "folder", "budget", "ledger", "tables"))
    name = _string(d["name"], "name")
    if date is None:
        date = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    try:
        _dt.date.fromisoformat(date)
    except (TypeError, ValueError):
        raise ValueError(f"date ({date!r}) must be YYYY-MM-DD") from None
    folder_t = _string(d["folder"], "folder")
    try:
        folder = _resolve(base, folder_t.format(name=name, date=date))
    except (KeyError, IndexError, ValueError) as exc:
        raise ReleaseConfigError("folder", f"({folder_t!r}) may use only {{name}} and {{date}}: {exc}") from None
    b = _keys(d["budget"], _BUDGET_KEYS, "budget", required=("epsilon",))
    epsilon = _number(b["epsilon"], "budget.epsilon", low=0)
    delta = _number(b.get("delta", 0.0), "budget.delta", low=0, high=1, low_open=False, high_open=True)
    unit = _unit(d.get("privacy_unit"), "privacy_unit", (None, 1))
    seed = d.get("seed")
    demo = d.get("demo", False)
    if not isinstance(demo, bool):
        raise ReleaseConfigError("demo", f"must be true or false, got {demo!r}")
    if seed is not None:
        seed = _int(seed, "seed", low=0)
        if not demo:
            raise ReleaseConfigError(
                "seed", f"({seed}) makes every noise draw reproducible by anyone who learns it, so "
                "the release would not be private; a seed is allowed only with 'demo: true' "
                "(tests and demos, marked 'seeded: not for release')")
    lg = _keys(d["ledger"], _LEDGER_KEYS, "ledger", required=("path", "policies"))
    ledger_path = _string(lg["path"], "ledger.path")
    if not fs.is_local(ledger_path):
        raise ReleaseConfigError("ledger.path", f"({ledger_path!r}) must be a local file: the ledger "
                                 "is a SQLite database, which needs a local disk (release folders "
                                 "may be on gs://, s3://, hdfs://)")
    ledger_path = _resolve(base, ledger_path)
    pol = lg["policies"]
    if not isinstance(pol, Mapping) or not pol:
        raise ReleaseConfigError("ledger.policies", f"must map each data source to a policy, got {pol!r}")
    policies = {}
    for src, p in pol.items():
        where = f"ledger.policies.{src}"
        pd_ = _keys(p, _POLICY_KEYS, where, required=("epsilon",))
        window, retention = pd_.get("window_days"), pd_.get("data_retention_days")
        try:
            policies[str(src)] = LedgerPolicy(
                epsilon=_number(pd_["epsilon"], f"{where}.epsilon", low=0),
                delta=_number(pd_.get("delta", 0.0), f"{where}.delta", low=0, high=1,
                              low_open=False, high_open=True),
                window_days=None if window is None else _number(window, f"{where}.window_days", low=0),
                data_retention_days=None if retention is None else _number(
                    retention, f"{where}.data_retention_days", low=0))
        except ValueError as exc:
            if isinstance(exc, ReleaseConfigError):
                raise
            key = "data_retention_days" if retention is not None and window is not None else (
                "window_days" if window is not None else "data_retention_days")
            raise ReleaseConfigError(f"{where}.{key}", str(exc)) from None
    rep = _keys(d.get("reports") or {}, _REPORT_KEYS, "reports")
    for key in ("private", "public"):
        if not isinstance(rep.get(key, True), bool):
            raise ReleaseConfigError(f"reports.{key}", f"must be true or false, got {rep[key]!r}")
    for key in ("private", "public"):
        if rep.get(key, True):
            _require_report_packages(f"reports.{key}")
    tabs = d["tables"]
    if not isinstance(tabs, list) or not tabs:
        raise ReleaseConfigError("tables", f"must be a non-empty list, got {tabs!r}")
    default_source = next(iter(policies)) if len(policies) == 1 else name
    seen: set[str] = set()
    tables = tuple(spec for i, t in enumerate(tabs)
                   for spec in _table(t, i, base, unit, default_source, seen))
    for t in tables:
        if t.source not in policies:
            raise ReleaseConfigError(f"{t.where}.source", f"({t.source!r}) has no policy under "
                                                            f"ledger.policies ({sorted(policies)})")
    target = rep.get("target")
    if target is not None:
        for t in tables:
            if t.kind == "synthesize" and target not in t.schema.names:
                raise ReleaseConfigError("reports.target", f"({target!r}) is not a column of "
                                                           f"{t.where} ({t.schema.names})")
    _check_budget(tables, epsilon, delta)
    return ReleaseConfig(
        name=name, description=str(d.get("description") or ""), folder=folder, epsilon=epsilon,
        delta=delta, ledger_path=ledger_path, policies=policies, seed=seed, demo=demo, tables=tables,
        private_report=rep.get("private", True), public_report=rep.get("public", True),
        target=target,
        max_plot_rows=_int(rep.get("max_plot_rows", 50_000), "reports.max_plot_rows", low=1),
        config_path=cfg_path)


def _require_report_packages(path: str) -> None:
    import importlib.util

    missing = [m for m in ("matplotlib", "sklearn") if importlib.util.find_spec(m) is None]
    if missing:
        raise ReleaseConfigError(path, f"needs {missing} (pip install 'beamsynth[report]'); "
                                       "or set it to false")


def _check_budget(tables: tuple[TableSpec, ...], epsilon: float, delta: float) -> None:
    spent_e = spent_d = 0.0
    for t in tables:
        if spent_e + t.epsilon > epsilon * (1 + 1e-9):
            raise ReleaseConfigError(
                f"{t.where}.epsilon",
                f"({t.epsilon:g}) overspends budget.epsilon ({epsilon:g}): earlier tables already "
                f"take ε={spent_e:g}, {max(0.0, epsilon - spent_e):g} remains")
        if spent_d + t.delta > delta * (1 + 1e-9) + 1e-300:
            raise ReleaseConfigError(
                f"{t.where}.delta",
                f"({t.delta:g}) overspends budget.delta ({delta:g}): earlier tables already take "
                f"δ={spent_d:g}")
        spent_e += t.epsilon
        spent_d += t.delta


# -- planning --------------------------------------------------------------------------------------
def _synthesis_config(cfg: ReleaseConfig, t: TableSpec, output: str) -> SynthesisConfig:
    return SynthesisConfig(
        input=list(t.inputs) if len(t.inputs) > 1 else t.inputs[0], schema=t.schema, output=output,
        epsilon=t.epsilon, delta=t.delta, method=t.method, rows=t.rows, privacy_id=t.privacy_id,
        max_contributions=t.max_contributions, seed=cfg.seed, count_fraction=t.count_fraction,
        options=dict(t.options))


def plan_release(cfg: ReleaseConfig, *, output_root: str | None = None) -> ReleasePlan:
    """Build every table's synthesis plan (all budget spends happen here; no data is read)."""
    root = output_root or cfg.folder
    plans: dict[str, SynthesisPlan] = {}
    spends: list[LedgerSpend] = []
    for t in cfg.tables:
        out = os.path.join(root, "public", f"{t.name}.{t.formats[0]}")
        if t.kind == "histogram":
            spends.append(_plan_histogram(cfg, t))
            continue
        try:
            plan = plan_synthesis(_synthesis_config(cfg, t, out))
        except BudgetExceededError as exc:
            raise ReleaseConfigError(f"{t.where}.epsilon", str(exc)) from None
        except (ValueError, TypeError) as exc:
            raise ReleaseConfigError(t.where, str(exc)) from None
        if getattr(plan.method, "non_dp_warning", None):  # e.g. plausible's Privacy Test 1
            raise ReleaseConfigError(
                f"{t.where}.options", f"{plan.method.non_dp_warning} A release publishes DP outputs only: "
                "its ledger can charge no finite ε for it; use `beamsynth synthesize --allow-non-dp`")
        plans[t.name] = plan
        for s in plan.accountant.spends:
            spends.append(LedgerSpend(source=t.source, privacy_unit=t.privacy_unit,
                                      step=f"{t.name}.{s.step}", epsilon=s.budget.epsilon,
                                      delta=s.budget.delta, mechanism=s.mechanism,
                                      privacy_id=t.privacy_id,
                                      max_contributions=t.max_contributions))
    return ReleasePlan(cfg, plans, spends)


def _histogram_config(cfg: ReleaseConfig, t: TableSpec, output: str) -> Any:
    from beamsynth.pipelines.methods.histogram import HistogramConfig

    return HistogramConfig(
        input=list(t.inputs) if len(t.inputs) > 1 else t.inputs[0],  # type: ignore[arg-type]
        column=t.schema.column(t.column), output=output, epsilon=t.epsilon,
        tolerance=float(t.tolerance), seed=cfg.seed, privacy_id=t.privacy_id,
        max_contributions=t.max_contributions)


def _plan_histogram(cfg: ReleaseConfig, t: TableSpec) -> LedgerSpend:
    """Validate a CatHist table as its mechanism would (no data read) and return its spend."""
    from beamsynth.transforms.budget import PureDP
    from beamsynth.transforms.cathist import ColumnCells, DPCategoricalHistogram

    try:
        DPCategoricalHistogram(domain=ColumnCells(t.schema.column(t.column)),
                               budget=PureDP(epsilon=t.epsilon), tolerance=float(t.tolerance),
                               max_contributions=t.max_contributions, seed=cfg.seed)
    except (ValueError, TypeError) as exc:
        raise ReleaseConfigError(t.where, str(exc)) from None
    return LedgerSpend(source=t.source, privacy_unit=t.privacy_unit,
                       step=f"{t.name}.cathist.{t.column}", epsilon=t.epsilon, delta=0.0,
                       mechanism="CatHist: discrete Laplace on every declared bin, keep ≥ τ",
                       privacy_id=t.privacy_id, max_contributions=t.max_contributions)


def _run_histogram_table(cfg: ReleaseConfig, t: TableSpec, tmp: str, options: PipelineOptions,
                         progress: Progress) -> dict[str, Any]:
    from beamsynth.pipelines.io.manifest import manifest_path
    from beamsynth.pipelines.methods.histogram import run_histogram

    out = fs.join(tmp, "public", f"{t.name}.{t.formats[0]}")
    manifest = run_histogram(_histogram_config(cfg, t, out), options)
    fs.delete_quietly([manifest_path(out)])  # rewritten below, in private/
    _move_rejected(rejected_path(out), fs.join(tmp, "private", f"{t.name}.rejected.jsonl"))
    _remove_sink_temp(tmp)
    manifest["release"]["outputs"] = {t.formats[0]: f"public/{t.name}.{t.formats[0]}",
                                      "rejected": f"private/{t.name}.rejected.jsonl"}
    manifest["release"]["details"].update(table=t.name, source=t.source, kind="histogram",
                                          columns=[t.column])
    manifest["operational"]["inputs"] = list(t.inputs)
    write_json_atomic(fs.join(tmp, "private", f"{t.name}.manifest.json"), manifest)
    op = manifest["operational"]
    progress(f"table {t.name}: read {op.get('rows_read')} rows, released "
             f"{manifest['release'].get('rows_out')} categories of {t.column}")
    return manifest


def run_key(cfg: ReleaseConfig) -> str:
    """The identity of one night's release in the (private) ledger: name and resolved folder."""
    return f"{cfg.name}@{cfg.folder}"


def public_night(cfg: ReleaseConfig) -> str:
    """The night's identity as published in ``release.json``: the name and the folder's own name
    (no path: public files say nothing about the operator's machine)."""
    return f"{cfg.name}@{os.path.basename(cfg.folder.rstrip('/'))}"


# -- running ---------------------------------------------------------------------------------------
def _run_table(plan: SynthesisPlan, t: TableSpec, tmp: str, options: PipelineOptions,
               progress: Progress) -> dict[str, Any]:
    start = time.time()
    p = beam.Pipeline(options=options)
    built = build_synthesis(p, plan, progress_label=None if progress.quiet else t.name)
    if is_beam_dask(options):  # Beam's own DaskRunner runs only the last sink (docs/runners.md)
        return _finish_table(plan, t, tmp, p.run(), start, progress)
    for fmt in t.formats[1:]:
        built["tables"] | f"Write_{fmt}" >> WriteTables(
            fs.join(tmp, "public", f"{t.name}.{fmt}"), column_names=plan.schema.names,
            avro_schema=plan.schema.avro_schema(), arrow_schema=arrow_schema_for(plan.schema))
    model_path = fs.join(tmp, "public", f"{t.name}.model.json")
    if built.get("models") is not None:  # methods releasing records directly have no model
        (built["models"]
         | "Describe" >> beam.Map(lambda m: json.dumps(m.describe(), default=str))
         | "WriteModel" >> beam.io.WriteToText(model_path, num_shards=1, shard_name_template=""))
    return _finish_table(plan, t, tmp, p.run(), start, progress)


def _finish_table(plan: SynthesisPlan, t: TableSpec, tmp: str, result: Any, start: float,
                  progress: Progress) -> dict[str, Any]:
    cfg = plan.config
    result.wait_until_finish()
    rej_parse = counter_value(result, "rows_rejected_unparseable")
    rej_dom = counter_value(result, "rows_rejected_domain")
    used = counter_value(result, "rows_encoded")
    dropped = counter_value(result, "rows_dropped_by_bound") if plan.schema.privacy_id else 0
    counts = {"rows_read": counter_value(result, "rows_read"), "rows_dropped_by_bound": dropped,
              "rows_used": None if used is None or dropped is None else used - dropped,  # after bounding
              "rows_rejected": None if rej_parse is None or rej_dom is None else rej_parse + rej_dom,
              "rows_out": counter_value(result, "rows_synthesized"),
              "seconds": round(time.time() - start, 3)}
    _remove_sink_temp(tmp)  # some runners leave sink temp folders
    _move_rejected(rejected_path(cfg.output), fs.join(tmp, "private", f"{t.name}.rejected.jsonl"))
    outputs = {fmt: f"public/{t.name}.{fmt}" for fmt in t.formats}
    if fs.exists(fs.join(tmp, "public", f"{t.name}.model.json")):
        outputs["model"] = f"public/{t.name}.model.json"
    manifest = build_manifest(
        command="release", method=plan.method.name, inputs=list(t.inputs),
        outputs={**outputs, "rejected": f"private/{t.name}.rejected.jsonl"},
        schema_name=plan.schema.name, schema_fingerprint=plan.schema.fingerprint(),
        accountant=plan.accountant.to_dict(), seed=cfg.seed,
        privacy_unit={"privacy_id": plan.schema.privacy_id,
                      "max_contributions": cfg.max_contributions,
                      "neighbouring": "add/remove one privacy unit"},
        counts=counts,
        details={"method": plan.method.details(), "rows_requested": cfg.rows, "table": t.name,
                 "source": t.source, "columns": plan.schema.names},
    )
    write_json_atomic(fs.join(tmp, "private", f"{t.name}.manifest.json"), manifest)
    progress(f"table {t.name}: read {counts['rows_read']} rows, rejected {counts['rows_rejected']}"
             f", wrote {counts['rows_out']} synthetic rows ({counts['seconds']:.1f}s)")
    return manifest


def _move_rejected(source: str, destination: str) -> None:
    """Move a table's dead letters into ``private/`` (an empty file if a runner wrote none)."""
    if not fs.exists(source):
        fs.write_bytes_atomic(destination, b"")
        return
    if fs.is_local(destination):
        os.makedirs(os.path.dirname(destination), exist_ok=True)
    FileSystems.rename([source], [destination])


def _remove_sink_temp(tmp: str) -> None:
    """Delete the ``beam-temp-*`` folders Beam's file sinks may leave in ``public/``."""
    public = fs.join(tmp, "public")
    pattern = fs.join(public, "beam-temp-*")
    fs.delete_quietly(glob.glob(pattern) if fs.is_local(public) else _matches(pattern + "/**"))


def _matches(pattern: str) -> list[str]:
    try:
        return [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    except BeamIOError:
        return []


def _release_temp_folder(folder: str, release_id: str) -> str:
    """Where a release is assembled before it is published as ``folder`` (any Beam path)."""
    if fs.is_local(folder):
        return temp_folder(folder, release_id)
    parent, base = fs.split(folder.rstrip("/"))
    return fs.join(parent, f".{base}.tmp-{release_id}")


def _fsync_dir(folder: str) -> None:
    """Make a rename inside ``folder`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(folder: str) -> None:
    for root, _dirs, files in os.walk(folder):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def run_release(
    cfg: ReleaseConfig,
    pipeline_options: PipelineOptions | None = None,
    *,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Plan, reserve in the ledger, run, publish atomically, commit; returns ``release.json``.

    Raises (before reading any data) :class:`ReleaseConfigError` for a bad plan and
    :class:`~beamsynth.pipelines.ledger.LedgerError` when the ledger refuses the release.
    """
    progress = progress or Progress(quiet=True)
    options = pipeline_options or PipelineOptions([])
    plan = plan_release(cfg)
    if is_beam_dask(options):
        for t in cfg.tables:
            if len(t.formats) > 1:
                raise ReleaseConfigError(f"{t.where}.formats", f"({list(t.formats)}) on the "
                                         "DaskRunner a release writes one format per table")
    eps = sum(s.epsilon for s in plan.spends)
    progress(f"release {cfg.name}: validated {len(cfg.tables)} table(s), plan spends ε={eps:g}")
    if os.path.exists(cfg.ledger_path):  # exactly once, one unit per source, budget: checked
        PrivacyLedger(cfg.ledger_path).check(  # before any input file is opened
            run_key=run_key(cfg), spends=plan.spends, policies=cfg.policies)
    ledger = PrivacyLedger(cfg.ledger_path)
    release_id = ledger.reserve(run_key=run_key(cfg), name=cfg.name, folder=cfg.folder,
                                spends=plan.spends, policies=cfg.policies)
    if fs.folder_exists(cfg.folder):  # published outside this ledger, or not a release at all
        ledger.abort(release_id, "release folder already exists")
        raise ReleaseConfigError("folder", f"{cfg.folder!r} already exists and this ledger has no "
                                           "committed release for it; move it away or choose "
                                           "another folder")
    try:  # whole-file problems (header, gzip, empty input): nothing spent, exit 2
        check_table_inputs(cfg.tables)
    except ValueError as exc:
        ledger.abort(release_id, f"input check failed: {exc}"[:500])
        raise
    progress(f"reserved ε={eps:g} in ledger {cfg.ledger_path} (release {release_id}, pending)")
    sources = {t.source for t in cfg.tables}
    budgets = [s for s in ledger.summary() if s["source"] in sources]  # incl. this reservation
    parent, base = fs.split(cfg.folder.rstrip("/"))
    if fs.is_local(parent):
        os.makedirs(parent, exist_ok=True)
    stale = fs.join(parent, f".{base}.tmp-*")
    # left by a killed run of this night (object stores: the files under them)
    fs.delete_quietly(glob.glob(stale) if fs.is_local(stale) else _matches(stale + "/**"))
    tmp = _release_temp_folder(cfg.folder, release_id)
    try:
        if fs.is_local(tmp):
            os.makedirs(os.path.join(tmp, "public"))
        manifests = {}
        for t in cfg.tables:
            if t.kind == "histogram":
                progress(f"table {t.name}: reading {', '.join(t.inputs)}, CatHist of {t.column}")
                manifests[t.name] = _run_histogram_table(cfg, t, tmp, options, progress)
                continue
            progress(f"table {t.name}: reading {', '.join(t.inputs)} and synthesizing ({t.method})")
            p = plan.plans[t.name]
            p = dataclasses.replace(p, config=dataclasses.replace(
                p.config, output=fs.join(tmp, "public", f"{t.name}.{t.formats[0]}")))
            manifests[t.name] = _run_table(p, t, tmp, options, progress)
        release = _release_document(cfg, release_id, manifests, budgets)
        if cfg.public_report or cfg.private_report:
            progress("writing reports")
            from beamsynth.pipelines.report import write_release_reports

            write_release_reports(cfg, tmp, release, manifests)
        write_json_atomic(fs.join(tmp, RELEASE_MARKER), release)
        if fs.is_local(tmp):
            _fsync_tree(tmp)
    except BaseException as exc:
        fs.delete_quietly([tmp])
        with contextlib.suppress(LedgerError):  # already aborted by `ledger reconcile --force`
            ledger.abort(release_id, f"failed before publishing: {type(exc).__name__}: {exc}"[:500])
        raise
    if fs.folder_exists(cfg.folder):  # created by something else while we ran: do not replace it
        fs.delete_quietly([tmp])
        with contextlib.suppress(LedgerError):
            ledger.abort(release_id, "release folder appeared while the release ran")
        raise ReleaseConfigError("folder", f"{cfg.folder!r} appeared while the release ran")
    # publish: one atomic rename on a local disk; elsewhere file by file, release.json last
    fs.move_folder(tmp, cfg.folder, marker=RELEASE_MARKER)
    if fs.is_local(parent):
        _fsync_dir(parent)
    ledger.commit(release_id)
    progress(f"published {cfg.folder} and committed release {release_id}")
    return release


def _public_budget(s: Mapping[str, Any]) -> dict[str, Any]:
    """A source's ledger state after this release, for ``release.json`` (public budget facts)."""
    unit = s["units"][0] if len(s["units"]) == 1 else None
    return {
        "policy": s["policy"], "guarantee": s["guarantee"], "renews": s["renews"],
        "window_days": s["window_days"], "data_retention_days": s["data_retention_days"],
        "privacy_unit": None if unit is None else {
            "unit": unit["unit"], "privacy_id": unit["privacy_id"],
            "max_contributions": unit["max_contributions"]},
        "counted_by_policy": {"epsilon": s["epsilon_spent"], "delta": s["delta_spent"]},
        "left": {"epsilon": s["epsilon_left"], "delta": s["delta_left"]},
        "lifetime_total": s["lifetime"],
        "note": "totals include this release; the lifetime total covers every release on the "
                "source (sequential composition), whatever the policy renews",
    }


def _release_document(cfg: ReleaseConfig, release_id: str, manifests: Mapping[str, dict[str, Any]],
                      budgets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``release.json``: the public parts of the manifests plus the ledger entry (no paths of
    the operator's machine: the ledger file's name and the release folder's name only)."""
    doc: dict[str, Any] = {
        "beamsynth_release": 1,
        "release_id": release_id,
        "name": cfg.name,
        "description": cfg.description,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "budget": {"epsilon": cfg.epsilon, "delta": cfg.delta},
        "spent": {"epsilon": sum(m["release"]["budget"]["spent"]["epsilon"] for m in manifests.values()),
                  "delta": sum(m["release"]["budget"]["spent"]["delta"] for m in manifests.values())},
        "ledger": {"path": os.path.basename(cfg.ledger_path), "night": public_night(cfg),
                   "policies": {s: p.describe() for s, p in cfg.policies.items()},
                   "sources": {s["source"]: _public_budget(s) for s in budgets or []}},
        "tables": {name: {"source": next(t.source for t in cfg.tables if t.name == name),
                          **m["release"]} for name, m in manifests.items()},
        "metrics_namespace": METRICS_NAMESPACE,
    }
    if cfg.demo:
        doc["demo"] = ("DEMO RELEASE: " + SEEDED_NOTE
                       + (f" (seed {cfg.seed})" if cfg.seed is not None else "")
                       + "; the noise can be regenerated, so nothing here is private")
    return doc
