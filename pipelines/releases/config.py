"""Release configs: the YAML format (``docs/releases.md``, :data:`RELEASE_CONFIG_SCHEMA`) and its
validation **before any data is read** (:func:`load_release_config` → :class:`ReleaseConfig` of
:class:`TableSpec`): unknown keys, schemas and their domains, methods, per-column options,
overspend, each problem reported with its YAML path (``tables[1].columns.age.epsilon``) as a
:class:`ReleaseConfigError`. Planning and running are :mod:`beamsynth.pipelines.releases.release`.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import glob
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from beamsynth.pipelines.io import filesystem as fs
from beamsynth.pipelines.methods.registry import get_method, method_option_names
from beamsynth.pipelines.releases.ledger import LedgerPolicy
from beamsynth.schemas.schema import Schema, avro_field_name, load_schema
from beamsynth.transforms.private import names_of

__all__ = [
    "FORMATS",
    "RELEASE_CONFIG_SCHEMA",
    "ReleaseConfig",
    "ReleaseConfigError",
    "TableSpec",
    "load_release_config",
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
                "rows": {"type": ["integer", "null"], "minimum": 1},
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


# PyYAML follows YAML 1.1, whose float needs a dot: ``delta: 1e-5`` loads as the *string* "1e-5".
# A plain decimal number written that way is read as the number the user meant.
_YAML11_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _number(value: Any, path: str, *, low: float, high: float | None = None,
            low_open: bool = True, high_open: bool = False) -> float:
    if isinstance(value, str) and _YAML11_NUMBER.fullmatch(value.strip()):
        value = float(value)
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
    unknown = sorted(set(options) - method_option_names(method))
    if unknown:  # a typo (targt: credit) would run the method without that option, silently
        known = sorted(method_option_names(method))
        close = difflib.get_close_matches(str(unknown[0]), known, n=1, cutoff=0.6)
        raise ReleaseConfigError(f"{path}.options.{unknown[0]}", f"is not an option of method "
                                 f"{method!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                                 + f"; its options: {', '.join(known)}")
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
    if options.get("target") not in (None, ""):  # privbayes' declared target: a (selected) column
        try:
            names_of(schema, [options["target"]], "target")
        except ValueError as exc:
            raise ReleaseConfigError(f"{path}.options.target",
                                     str(exc).removeprefix("target: ")) from None
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
        rows = _int(rows, f"{path}.rows", low=1)  # 0 would spend ε for no row (22ef3e3)
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
