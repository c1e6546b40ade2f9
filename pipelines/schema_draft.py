"""``beamsynth schema draft``: a schema drafted from a *public* data dictionary, for review.

Reads a data dictionary or codebook — never the data — and writes a schema YAML in which every
guess carries a ``# REVIEW:`` comment (rounded bounds, bins of wide ranges, null tokens, columns
the dictionary does not declare). Domains must come from such a public declaration: a bound,
category list or null token read off the private rows would leak them (``docs/schema-guide.md``).

Input forms (``--format``, default ``auto``):

* ``sdnist`` — NIST SDNist's ``data_dictionary.json``: ``{column: {description, values}}``
  where ``values`` maps codes to labels and/or has ``min``/``max`` (``N`` = not applicable);
* ``domain-json`` — ``{column: {type, min, max} | {type, categories}}`` (``adult-domain.json``),
  ``{column: size}`` (codes ``0..size-1``, private-pgm), or ``{column: {code: label}}`` (a code
  map such as German credit's ``values_maps.json``: the codes become the categories);
* ``csv`` — a codebook with a header and columns ``column, type`` and optionally ``values``
  (``|``-separated), ``min``, ``max``, ``null_values`` (``|``-separated), ``granularity``,
  ``description``;
* ``smartnoise`` — SmartNoise SQL metadata YAML (``collection: {schema: {table: {...}}}``): table
  options ``row_privacy``, ``max_ids`` and per column ``type`` (int, float, string, boolean,
  datetime, unknown), ``lower``/``upper``, ``private_id``, ``nullable``, ``missing_value``.

More dictionaries (``also``, CLI ``--with``) fill in what the first one leaves undeclared (a
string column's categories); where both declare a domain, the first wins and a ``# REVIEW:``
note names the other. ``header_from`` orders the columns as a data file's header line (public
structure: only that line is read, never a record).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DRAFT_FORMATS", "DraftColumn", "DraftTable", "data_header", "draft_schema",
           "merge_drafts", "nice_step", "order_by_header", "read_dictionary", "read_draft",
           "render_yaml"]

DRAFT_FORMATS = ("auto", "sdnist", "domain-json", "csv", "smartnoise")
WIDE_RANGE = 200  # integer ranges with more values than this are drafted with bins
TARGET_BINS = 50  # about this many bins for a wide integer range
FLOAT_BINS = 20  # about this many bins for a float range
NULL_LABEL_PREFIXES = ("n/a", "na ", "not applicable", "missing")
_TYPES = ("categorical", "integer", "float", "datetime", "string", "text")
_DOMAIN_KEYS = {"type", "categories", "values", "min", "max", "description"}  # domain-json keys


@dataclass
class DraftColumn:
    """One drafted column: its schema spec (``None`` if it cannot be drafted) and review notes."""

    name: str
    spec: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    description: str = ""
    pending: dict[str, Any] | None = None  # the spec without its domain, for another dictionary


@dataclass
class DraftTable:
    """A drafted table: its columns, privacy id and table-level review notes."""

    fmt: str
    columns: list[DraftColumn]
    privacy_id: str | None = None
    notes: list[str] = field(default_factory=list)
    source: str = ""
    unit_declared: bool = False  # the dictionary says who the privacy unit is (SmartNoise)


def nice_step(width: float, target: int) -> float:
    """The smallest of 1, 2, 5 × 10^k that is at least ``width / target`` (bin width)."""
    if width <= 0 or target < 1:
        raise ValueError(f"width ({width}) must be > 0 and target ({target}) >= 1")
    raw = width / target
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw:
            step = m * power
            return float(int(step)) if step >= 1 else step
    return 10 * power  # pragma: no cover (the loop always returns)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_number(value: Any) -> float | None:
    if _is_number(value):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def _integer_column(name: str, low: float, high: float, notes: list[str]) -> dict[str, Any]:
    """An integer domain from declared bounds; wide ranges get rounded bounds and bins."""
    lo, hi = math.floor(low), math.ceil(high)
    if lo != low or hi != high:
        notes.append(f"integer bounds {low:g}..{high:g} widened to whole numbers {lo}..{hi}")
    if hi - lo + 1 <= WIDE_RANGE:
        return {"kind": "integer", "low": lo, "high": hi}
    step = int(nice_step(hi - lo + 1, TARGET_BINS))
    rlo = math.floor(lo / step) * step
    rhi = math.ceil((hi + 1) / step) * step - 1
    edges = list(range(rlo, rhi + 2, step))
    if rlo != lo:
        notes.append(f"min rounded down from {lo} to {rlo}")
    if rhi != hi:
        notes.append(f"max rounded up from {hi} to {rhi} (a dictionary maximum is often the "
                     "largest value observed: values just above it would be rejected)")
    notes.append(f"{hi - lo + 1} values binned into {len(edges) - 1} bins of {step}: pick edges "
                 "that matter for your analyses")
    return {"kind": "integer", "low": rlo, "high": rhi, "edges": edges}


def _float_column(low: float, high: float, notes: list[str]) -> dict[str, Any]:
    step = nice_step(high - low, FLOAT_BINS)
    rlo = math.floor(low / step) * step
    rhi = math.ceil(high / step) * step
    if rhi == rlo:
        rhi = rlo + step
    n = round((rhi - rlo) / step)
    edges = [round(rlo + i * step, 10) for i in range(n + 1)]
    notes.append(f"range {low:g}..{high:g} rounded out to {edges[0]:g}..{edges[-1]:g}, "
                 f"{n} bins of {step:g}")
    return {"kind": "float", "low": edges[0], "high": edges[-1], "edges": edges}


def _range_column(name: str, low: float, high: float, codes: Sequence[str],
                  notes: list[str]) -> tuple[str, dict[str, Any]]:
    """Type and domain for a declared min/max (plus numeric codes such as ``0`` outside it)."""
    extra = [v for v in (_as_number(c) for c in codes) if v is not None]
    if extra:
        lo2, hi2 = min([low, *extra]), max([high, *extra])
        if (lo2, hi2) != (low, high):
            notes.append(f"range {low:g}..{high:g} extended to {lo2:g}..{hi2:g} to hold the "
                         f"declared code(s) {', '.join(codes)}")
        low, high = lo2, hi2
    if all(float(v).is_integer() for v in (low, high)):
        return "integer", _integer_column(name, low, high, notes)
    return "float", _float_column(low, high, notes)


def _looks_null(code: str, label: Any) -> bool:
    text = str(label).strip().lower()
    return code in ("N", "NA", "") or any(text.startswith(p) for p in NULL_LABEL_PREFIXES)


# -- the three dictionary forms ---------------------------------------------------------------------
def _from_sdnist(name: str, entry: Mapping[str, Any]) -> DraftColumn:
    desc = str(entry.get("description", ""))
    values = entry.get("values")
    col = DraftColumn(name, None, description=desc)
    if not isinstance(values, Mapping) or not values:
        where = f" (see {entry['link']})" if "link" in entry else ""
        col.notes.append(f"the dictionary declares no values or range for {name}{where}; not "
                         "drafted (input column ignored): add it with a declared domain, e.g. "
                         "the published code list")
        return col
    codes = {str(k): v for k, v in values.items() if k not in ("min", "max")}
    nulls = [c for c, label in codes.items() if _looks_null(c, label)]
    for c in nulls:
        col.notes.append(f"code {c!r} ({codes[c]}) read as a null token")
    kept = [c for c in codes if c not in nulls]
    if "min" in values or "max" in values:
        if not ("min" in values and "max" in values):
            col.notes.append("only one of min/max is declared; not drafted")
            return col
        ctype, domain = _range_column(name, float(values["min"]), float(values["max"]), kept,
                                      col.notes)
    else:
        ctype, domain = "categorical", {"kind": "categorical", "values": kept}
    col.spec = {"name": name, "type": ctype, "domain": domain}
    if nulls:
        col.spec.update(nullable=True, null_values=nulls)
    return col


def _from_domain_json(name: str, entry: Any) -> DraftColumn:
    col = DraftColumn(name, None)
    if _is_number(entry) and float(entry).is_integer() and entry >= 1:
        col.notes.append(f"a size only: codes 0..{int(entry) - 1}")
        col.spec = {"name": name, "type": "integer",
                    "domain": {"kind": "integer", "low": 0, "high": int(entry) - 1}}
        return col
    if not isinstance(entry, Mapping):
        col.notes.append(f"entry {entry!r} is neither a size nor a mapping; not drafted")
        return col
    if entry and not set(entry) & _DOMAIN_KEYS and all(isinstance(v, str) for v in entry.values()):
        # a code -> label map ({"A11": "... < 0 DM", ...}: German credit's values_maps.json)
        labels = "; ".join(f"{k} = {v}" for k, v in list(entry.items())[:6])
        col.notes.append(f"a code -> label map: the codes are the declared categories ({labels}"
                         + ("; ..." if len(entry) > 6 else "") + ")")
        col.spec = {"name": name, "type": "categorical",
                    "domain": {"kind": "categorical", "values": [str(k) for k in entry]}}
        return col
    kind = str(entry.get("type", "")).lower()
    cats = entry.get("categories", entry.get("values"))
    if isinstance(cats, list):
        values = [str(v) for v in cats]
        odd = [v for v in values if v.strip() in ("?", "", "NA", "N/A", "null")]
        for v in odd:
            col.notes.append(f"{v!r} looks like a missing-value marker; kept as a declared "
                             "category (or make it null_values with nullable: true)")
        col.spec = {"name": name, "type": "categorical",
                    "domain": {"kind": "categorical", "values": values}}
        return col
    if "min" in entry and "max" in entry:
        ctype, domain = _range_column(name, float(entry["min"]), float(entry["max"]), [],
                                      col.notes)
        if kind in ("float", "continuous", "real") and ctype == "integer":
            ctype, domain = "float", _float_column(float(entry["min"]), float(entry["max"]),
                                                   col.notes)
        col.spec = {"name": name, "type": ctype, "domain": domain}
        return col
    col.notes.append(f"no categories and no min/max in {entry!r}; not drafted")
    return col


def _split(cell: str | None) -> list[str]:
    return [v.strip() for v in (cell or "").split("|") if v.strip() != ""]


def _from_csv_row(row: Mapping[str, str], line: int) -> DraftColumn:
    name = (row.get("column") or "").strip()
    col = DraftColumn(name or f"line {line}", None, description=(row.get("description") or ""))
    ctype = (row.get("type") or "").strip().lower()
    if ctype not in _TYPES:
        col.notes.append(f"line {line}: type ({ctype!r}) must be one of {list(_TYPES)}; not drafted")
        return col
    values, nulls = _split(row.get("values")), _split(row.get("null_values"))
    low, high = (row.get("min") or "").strip(), (row.get("max") or "").strip()
    spec: dict[str, Any] = {"name": name, "type": ctype}
    if ctype == "datetime":
        if not (low and high):
            col.notes.append(f"line {line}: a datetime column needs min and max; not drafted")
            return col
        spec["domain"] = {"kind": "datetime", "start": low, "end": high,
                          "granularity": (row.get("granularity") or "day").strip()}
    elif values:
        spec["domain"] = {"kind": "categorical", "values": values}
        if ctype in ("integer", "float"):
            spec["type"] = "categorical"
            col.notes.append(f"{ctype} codes listed one by one: drafted as categorical")
    elif low and high and _as_number(low) is not None and _as_number(high) is not None:
        t, spec["domain"] = _range_column(name, float(low), float(high), [], col.notes)
        if ctype == "float" and t == "integer":
            spec["domain"] = _float_column(float(low), float(high), col.notes)
        spec["type"] = "float" if ctype == "float" else t
    else:
        col.notes.append(f"line {line}: neither values nor min/max declared; not drafted")
        return col
    if nulls:
        spec.update(nullable=True, null_values=nulls)
    col.spec = spec
    return col


# -- SmartNoise SQL metadata YAML ---------------------------------------------------------------------
_SN_TABLE_KEYS = {"max_ids", "row_privacy", "rows", "rowcount", "rows_exact", "sample_max_ids",
                  "censor_dims", "clamp_counts", "clamp_columns", "use_dpsu"}
_SN_COLUMN_KEYS = {"type", "lower", "upper", "private_id", "private_key", "nullable",
                   "missing_value", "sensitivity", "cardinality"}
_SN_TYPES = ("int", "float", "string", "boolean", "datetime", "unknown")
_SN_NULLABLE = "SmartNoise columns are nullable unless `nullable: false`"


def _is_sn_table(node: Any) -> bool:
    return isinstance(node, Mapping) and any(isinstance(v, Mapping) and "type" in v
                                             for v in node.values())


def _sn_tables(data: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(schema.table, table node)`` of a SmartNoise collection (collection: schema: table:)."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    for coll in data.values():
        if not isinstance(coll, Mapping):
            continue
        for sname, schema in coll.items():
            if _is_sn_table(schema):  # collection: table: (no schema level)
                found.append((str(sname), schema))
                continue
            if isinstance(schema, Mapping):
                found.extend((f"{sname}.{t}" if sname else str(t), node)
                             for t, node in schema.items() if _is_sn_table(node))
    return found


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


def _sn_column(name: str, entry: Mapping[str, Any]) -> DraftColumn:
    col = DraftColumn(name, None)
    ctype = str(entry.get("type", "")).strip().lower()
    unknown = sorted(set(map(str, entry)) - _SN_COLUMN_KEYS)
    if unknown:
        col.notes.append(f"key(s) {unknown} not understood; ignored")
    extra: dict[str, Any] = {}
    if "missing_value" in entry:
        extra = {"nullable": True, "null_values": [""]}
        col.notes.append(f"missing_value {entry['missing_value']!r}: SmartNoise replaces a null by "
                         "it; here a null (empty field) stays its own cell. To impute, fill it in "
                         "before the synthesis, or set nullable: false")
    elif _truthy(entry.get("nullable", True)):
        extra = {"nullable": True, "null_values": [""]}  # SmartNoise's default: nullable
    if "sensitivity" in entry:
        col.notes.append("sensitivity (for SmartNoise sums) has no use here; ignored")
    lower, upper = entry.get("lower"), entry.get("upper")
    if ctype in ("int", "float"):
        lo, hi = _as_number(lower), _as_number(upper)
        if lo is None or hi is None or lo > hi:
            kind = "integer" if ctype == "int" else "float"
            col.notes.append(f"{ctype} column without both lower and upper; not drafted: declare "
                             f"type: {kind}, domain: {{kind: {kind}, low: ..., high: ...}} from "
                             "the documentation (never from the data)")
            return col
        if ctype == "int":
            spec = {"name": name, "type": "integer", "domain": _integer_column(name, lo, hi,
                                                                               col.notes)}
        else:
            spec = {"name": name, "type": "float", "domain": _float_column(lo, hi, col.notes)}
    elif ctype == "datetime":
        if lower is None or upper is None:
            col.notes.append("datetime column without lower and upper; not drafted: declare type: "
                             "datetime, domain: {kind: datetime, start: ..., end: ..., "
                             "granularity: day}")
            return col
        col.notes.append("granularity 'day' guessed")
        spec = {"name": name, "type": "datetime", "domain": {
            "kind": "datetime", "start": str(lower), "end": str(upper), "granularity": "day"}}
    elif ctype == "boolean":
        col.notes.append("boolean drafted as the categories False, True: list the spelling the "
                         "file uses (true/false, 1/0, Y/N)")
        spec = {"name": name, "type": "categorical",
                "domain": {"kind": "categorical", "values": ["False", "True"]}}
    elif ctype == "string":
        hint = (f" (the metadata's cardinality hint: about {entry['cardinality']} values)"
                if "cardinality" in entry else "")
        col.notes.append(
            "string column: the metadata lists no categories; not drafted. Declare every value "
            "the documentation lists: type: categorical, domain: {kind: categorical, values: "
            f"[...]}}{hint}, or give a dictionary that lists them with --with (e.g. a domain "
            "JSON {column: size} for codes 0..size-1). Never list the values found in the data")
        col.pending = {"name": name, "type": "categorical", **extra}
        return col
    else:
        what = "unknown (SmartNoise ignores the column)" if ctype == "unknown" else repr(ctype)
        col.notes.append(f"type {what}; not drafted (types: {', '.join(_SN_TYPES)})")
        return col
    if lower is not None and ctype not in ("int", "float", "datetime"):
        col.notes.append(f"lower/upper on a {ctype} column ignored")
    col.spec = {**spec, **extra}
    return col


def _from_smartnoise(data: Mapping[str, Any], source: str, table: str | None) -> DraftTable:
    tables = _sn_tables(data)
    if not tables:
        raise ValueError(f"dictionary {source!r}: a YAML file with no SmartNoise table "
                         "(collection: schema: table: column: {type: ...}); draft reads "
                         "SmartNoise metadata YAML, an SDNist data_dictionary.json, a domain JSON "
                         "or a CSV codebook (docs/schema-guide.md)")
    names = [n for n, _ in tables]
    if table is not None:
        tables = [(n, t) for n, t in tables if table in (n, n.rsplit(".", 1)[-1])]
        if len(tables) != 1:
            raise ValueError(f"dictionary {source!r}: --table {table!r} names "
                             f"{len(tables)} of its tables {names}")
    elif len(tables) > 1:
        raise ValueError(f"dictionary {source!r} holds {len(tables)} tables {names}: choose one "
                         "with --table")
    tname, node = tables[0]
    out = DraftTable("smartnoise", [], source=source, unit_declared=True)
    ids = [str(c) for c, e in node.items() if isinstance(e, Mapping)
           and (_truthy(e.get("private_id", False)) or _truthy(e.get("private_key", False)))]
    row_privacy = _truthy(node.get("row_privacy", False))
    max_ids = node.get("max_ids")
    where = f"table {tname} of {source}"
    if ids:
        out.privacy_id = ids[0]
        out.notes.append(f"privacy_id {ids[0]!r}: the private_id column of {where}")
        if len(ids) > 1:
            out.notes.append(f"private_id on {ids}: SmartNoise's unit is their combination; a "
                             f"schema names one column: {ids[0]!r} is used alone. Join them into "
                             "one column before the synthesis if it does not identify a person")
        bound = 1 if max_ids is None else max_ids
        out.notes.append(
            f"max_ids {bound}" + (" (SmartNoise's default)" if max_ids is None else "")
            + f": each person's rows are bounded at run time, `beamsynth synthesize ... "
            f"--max-contributions {bound}` (the schema has no such key); rows beyond it are "
            "dropped at random")
    elif row_privacy:
        out.notes.append(f"row_privacy: true in {where}: one record = one person "
                         "(privacy_id: null)")
    else:
        out.notes.append(f"{where} sets neither row_privacy nor a private_id column (SmartNoise "
                         "refuses to query it): privacy_id: null treats each record as one "
                         "person; name the column identifying a person if people have several rows")
    if row_privacy and (ids or (max_ids is not None and max_ids != 1)):
        out.notes.append("row_privacy: true beside a private_id or max_ids > 1 (SmartNoise "
                         "requires max_ids 1 with row_privacy): the private_id column is used")
    if any(k in node for k in ("rows", "rowcount", "rows_exact")):
        out.notes.append("the row count in the metadata is not used (and not copied here): the "
                         "synthesis releases a DP count; --rows sets the output size")
    ignored = sorted(k for k in node if k in _SN_TABLE_KEYS - {"max_ids", "row_privacy", "rows",
                                                                 "rowcount", "rows_exact"})
    if ignored:
        out.notes.append(f"query-engine option(s) {ignored} have no meaning for a synthesis; "
                         "ignored")
    odd = sorted(str(k) for k, v in node.items() if k not in _SN_TABLE_KEYS
                 and not isinstance(v, Mapping))
    if odd:
        out.notes.append(f"table key(s) {odd} not understood; ignored")
    out.notes.append(_SN_NULLABLE + ": each drafted column takes an empty field as null (one more cell); remove nullable where "
                     "the documentation says every value is set")
    for cname, entry in node.items():
        if isinstance(entry, Mapping) and str(cname) not in ids:
            out.columns.append(_sn_column(str(cname), entry))
    return out


def _yaml_dictionary(text: str, source: str, table: str | None) -> DraftTable:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"dictionary {source!r}: not valid YAML: {exc}") from exc
    if isinstance(data, Mapping) and isinstance(data.get("columns"), list):
        raise ValueError(f"dictionary {source!r}: a beamsynth schema (it has 'columns:'); it needs "
                         "no draft: `beamsynth schema validate` it (docs/schema-guide.md)")
    if not isinstance(data, Mapping):
        raise ValueError(f"dictionary {source!r}: expected a YAML mapping (SmartNoise metadata: "
                         "collection: schema: table: columns)")
    return _from_smartnoise(data, source, table)


# -- reading and rendering ----------------------------------------------------------------------------
def read_dictionary(path: str | Path, fmt: str = "auto") -> tuple[str, list[DraftColumn]]:
    """``(format, drafted columns)`` of a public dictionary file (never the data)."""
    got = read_draft(path, fmt)
    return got.fmt, got.columns


def read_draft(path: str | Path, fmt: str = "auto", *, table: str | None = None) -> DraftTable:
    """The drafted table of a public dictionary file (never the data); ``table`` picks one
    table of a SmartNoise collection."""
    if fmt not in DRAFT_FORMATS:
        raise ValueError(f"format ({fmt!r}) must be one of {list(DRAFT_FORMATS)}")
    from beamsynth.pipelines.io.filesystem import read_bytes

    p = Path(path)  # for its name and extension; read through Beam FileSystems (gs://, ...)
    try:
        text = read_bytes(str(path)).decode("utf-8-sig")
    except OSError as exc:
        raise ValueError(f"dictionary {str(path)!r}: cannot read: {exc}") from exc
    if fmt == "smartnoise" or (fmt == "auto" and p.suffix.lower() in (".yaml", ".yml")):
        return _yaml_dictionary(text, p.name, table)
    if table is not None:
        raise ValueError("--table picks a table of SmartNoise metadata YAML only")
    fmt, cols = _read_flat(p, text, fmt)
    return DraftTable(fmt, cols, source=p.name)


def _read_flat(p: Path, text: str, fmt: str) -> tuple[str, list[DraftColumn]]:
    if p.suffix.lower() in (".jsonl", ".ndjson"):  # JSON lines: beamsynth's data format (H66)
        raise ValueError(f"dictionary {str(p)!r}: a JSON-lines file is data (one record per line), "
                         "not a dictionary: `schema draft` reads a public data dictionary or "
                         "codebook, never the data (docs/schema-guide.md)")
    if fmt == "auto":
        fmt = "csv" if p.suffix.lower() in (".csv", ".tsv") else "json"
    if fmt == "csv":
        lines = text.splitlines()
        header = next(csv.reader(lines[:1]), [])
        if "column" not in header or "type" not in header:  # judged before any other line is parsed
            shown = ", ".join(repr(h) for h in header[:6]) + (", ..." if len(header) > 6 else "")
            raise ValueError(
                f"dictionary {str(p)!r}: a CSV codebook needs a header with at least 'column' and "
                f"'type' (one row per column of your data), but its header is [{shown}]. If this is "
                "the data itself: draft reads a public data dictionary or codebook, never the data; "
                "write a codebook with 'column,type,values,min,max,null_values' from the data's "
                "documentation (docs/schema-guide.md)")
        rows = list(csv.DictReader(lines))
        if not rows:
            raise ValueError(f"dictionary {str(p)!r}: the CSV codebook lists no column")
        return "csv", [_from_csv_row(r, i + 2) for i, r in enumerate(rows)]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"dictionary {str(p)!r}: not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"dictionary {str(p)!r}: expected a JSON object of columns")
    refuse = _records_table(data)
    if refuse:
        raise ValueError(f"dictionary {str(p)!r}: {refuse}")
    if fmt == "json":
        sdnist = all(isinstance(v, Mapping) and ("description" in v or "values" in v and
                                                  isinstance(v.get("values"), Mapping))
                     for v in data.values())
        fmt = "sdnist" if sdnist else "domain-json"
    build = _from_sdnist if fmt == "sdnist" else _from_domain_json
    return fmt, [build(str(k), v) for k, v in data.items()]


def _records_table(data: Mapping[str, Any]) -> str | None:
    """Why ``data`` is a table of records (pandas ``to_json``) and not a dictionary, else
    ``None``: ``{row: {column: value}}`` (top keys ``"0" .. "n-1"``, every entry the same fields),
    or ``{column: {row: value}}`` (every entry the same keys, or keys ``"0" .. "n-1"``) where some
    entry repeats a value or holds a number (a code map's labels are distinct text), or where two
    or more entries share the keys ``"0" .. "n-1"``, n ≥ 3, whatever their values (a table of
    distinct names; shared 0/1 codes still draft). The message names no value: draft never reads
    the data (rule 1)."""
    entries = list(data.values())
    if all(not isinstance(e, (Mapping, list)) for e in entries) and not all(
            _is_number(e) and float(e).is_integer() and e >= 1 for e in entries):
        return _RECORD_MESSAGE  # one record {column: value} (a JSON-lines line; H66)
    if not all(isinstance(e, Mapping) and e and not set(e) & _DOMAIN_KEYS for e in entries):
        return None
    keys = set(entries[0])
    same = len(entries) > 1 and all(set(e) == keys for e in entries)
    rows = {str(i) for i in range(len(keys))}
    if (same or len(entries) == 1) and set(data) == {str(i) for i in range(len(data))}:
        return _TABLE_MESSAGE  # {row: {column: value}}, one record too (H45)
    if same and keys == rows and len(keys) >= 3:  # {column: {row: value}} whatever the values (H45)
        return _TABLE_MESSAGE
    if not (same or keys == rows):  # {column: {row: value}}
        return None
    scalars = [[v for v in e.values() if not isinstance(v, (Mapping, list))] for e in entries]
    if not any(len(set(map(repr, s))) < len(s) or any(isinstance(v, (int, float)) for v in s)
               for s in scalars):
        return None
    return _TABLE_MESSAGE


_TABLE_MESSAGE = (
    "its entries look like records (row numbers as keys, or the same keys in every entry with "
    "repeated or numeric values): this is a table of records, not a dictionary (e.g. a data file "
    "saved with pandas to_json). `schema draft` reads a public data dictionary or codebook, never "
    "the data: write one from the data's documentation (docs/schema-guide.md)")

_RECORD_MESSAGE = (
    "its entries are single values (text, booleans, fractions or nulls), as in one record of a "
    "data file ({column: value}), not sizes, domains or code maps: `schema draft` reads a public "
    "data dictionary or codebook, never the data (a record's values would become declared "
    "domains, rule 1); write one from the data's documentation (docs/schema-guide.md)")


def _flow(value: Any) -> str:
    """A YAML flow value (JSON is YAML; strings stay quoted so codes like "01" stay strings)."""
    return json.dumps(value, ensure_ascii=False)


def render_yaml(name: str, columns: Sequence[DraftColumn], *, source: str, fmt: str,
                privacy_id: str | None = None, notes: Sequence[str] = (),
                id_declared: bool = False) -> str:
    """The drafted schema as YAML text, each guess marked ``# REVIEW:``; ``notes`` are
    table-level review notes, ``id_declared``: the dictionary said who the privacy unit is."""
    drafted = [c for c in columns if c.spec is not None]
    lines = [
        f"# Drafted by `beamsynth schema draft` from the public dictionary {source} ({fmt}).",
        "# Every domain below comes from that dictionary, never from the data. Review each",
        "# '# REVIEW:' line, then check the file with `beamsynth schema validate`.",
        f"name: {_flow(name)}",
    ]
    lines += [f"# REVIEW: {note}" for note in notes]
    if privacy_id is None and not id_declared:
        lines.append("privacy_id: null   # REVIEW: name the column identifying a person, if any")
    else:
        lines.append(f"privacy_id: {_flow(privacy_id)}")
    lines += ["extra_columns: ignore", "columns:"]
    for c in columns:
        if c.description:
            lines.append(f"  # {c.name}: {' '.join(c.description.split())}")
        prefix = "  " if c.spec is not None else "  # "
        for note in c.notes:
            lines.append(f"  # REVIEW: {note}")
        if c.spec is None and c.pending is None:
            lines.append(f"  # - name: {_flow(c.name)}   (not drafted)")
            continue
        if c.spec is None:  # a template to complete: the domain's values are left empty
            lines.append(f"  # - name: {_flow(c.name)}   (not drafted: list the values, uncomment)")
        spec = c.spec or {**c.pending, "domain": {"kind": "categorical", "values": []}}
        if c.spec is not None:
            lines.append(f"{prefix}- name: {_flow(spec['name'])}")
        lines.append(f"{prefix}  type: {spec['type']}")
        lines.append(f"{prefix}  domain: {_flow(spec['domain'])}")
        if spec.get("nullable"):
            lines.append(f"{prefix}  nullable: true")
            lines.append(f"{prefix}  null_values: {_flow(spec['null_values'])}")
    if not drafted:
        raise ValueError(f"dictionary {source!r}: no column could be drafted; `schema draft` reads "
                         "an SDNist data_dictionary.json, a domain JSON ({column: {type, min, max} "
                         "| {categories: [...]} | size} or {column: {code: label}}), a CSV "
                         "codebook (column,type[,values,min,max,...]) or SmartNoise metadata YAML; "
                         "see the notes above each column in the output; a second dictionary "
                         "(--with) can supply what the first lacks (docs/schema-guide.md)")
    return "\n".join(lines) + "\n"


# -- combining dictionaries, ordering by a data header -------------------------------------------------
def _domain_text(spec: Mapping[str, Any]) -> str:
    d = spec["domain"]
    if d.get("kind") == "categorical":
        vals = d.get("values", [])
        shown = ", ".join(map(str, vals[:8])) + (", ..." if len(vals) > 8 else "")
        return f"categorical [{shown}] ({len(vals)} values)"
    if d.get("kind") in ("integer", "float"):
        return f"{d['kind']} {d['low']:g}..{d['high']:g}"
    return _flow(d)


def _as_categories(spec: Mapping[str, Any]) -> list[str] | None:
    """A supplement's domain as category codes: its values, or a small integer range's codes."""
    d = spec["domain"]
    if d.get("kind") == "categorical" and isinstance(d.get("values"), list):
        return [str(v) for v in d["values"]]
    if d.get("kind") == "integer" and "edges" not in d and d["high"] - d["low"] < 1000:
        return [str(v) for v in range(int(d["low"]), int(d["high"]) + 1)]
    return None


def merge_drafts(main: DraftTable, others: Sequence[DraftTable]) -> DraftTable:
    """``main`` completed by ``others`` (in order): a column ``main`` could not draft takes the
    first other's domain (a string column's categories: its listed values or codes
    ``0..size-1``), keeping ``main``'s type and null settings; where both declare a domain,
    ``main``'s stays and a note names the other's; a column only the others list is added at
    the end with a note. Public dictionaries only: nothing here reads data."""
    cols = list(main.columns)
    index = {c.name: i for i, c in enumerate(cols)}
    notes = list(main.notes)
    pid, declared = main.privacy_id, main.unit_declared
    for other in others:
        src = other.source
        if other.unit_declared and not declared:  # the unit from the first that declares it
            pid, declared = other.privacy_id, True
            notes += [f"from {src}: {n}" for n in other.notes
                      if not n.startswith(_SN_NULLABLE)]  # about its own columns
        for oc in other.columns:
            if oc.name == pid:
                notes.append(f"{src} declares the privacy id column {oc.name!r}; not drafted")
                continue
            if oc.name not in index:
                if oc.spec is not None:
                    oc = DraftColumn(oc.name, oc.spec, [*oc.notes, f"only in {src}, not in "
                                     f"{main.source}: is it a column of this table?"],
                                     oc.description)
                    index[oc.name] = len(cols)
                    cols.append(oc)
                continue
            i = index[oc.name]
            mc = cols[i]
            if oc.spec is None:
                continue
            if mc.spec is None:
                base = mc.pending or {"name": mc.name, "type": oc.spec["type"]}
                domain = oc.spec["domain"]
                if base["type"] == "categorical":
                    cats = _as_categories(oc.spec)
                    if cats is None:
                        mc.notes.append(f"{src} declares {_domain_text(oc.spec)}, not categories; "
                                        "not used")
                        continue
                    domain = {"kind": "categorical", "values": cats}
                spec = {**base, "domain": domain}
                if not base.get("nullable") and oc.spec.get("nullable"):
                    spec.update(nullable=True, null_values=oc.spec["null_values"])
                onotes = list(oc.notes)
                if oc.spec["type"] == "integer" and base["type"] == "categorical":
                    d = oc.spec["domain"]
                    note = (f"categories from {src}: the codes {d['low']}..{d['high']} of its "
                            "integer range, as text (check that the file writes them so)")
                    onotes = [n for n in onotes if not n.startswith("a size only")]
                else:
                    note = f"domain from {src}: {_domain_text(spec)}"
                cols[i] = DraftColumn(mc.name, spec, [*[n for n in mc.notes if not n.startswith(
                    ("string column:", "int column", "float column"))], note, *onotes],
                    mc.description or oc.description)
            elif mc.spec.get("domain") != oc.spec.get("domain") or mc.spec["type"] != oc.spec["type"]:
                # the declared domains themselves: _domain_text shows the first categories and
                # rounds numbers, so two dictionaries differing past them were no conflict
                mine, theirs = _domain_text(mc.spec), _domain_text(oc.spec)
                if mc.spec["type"] != oc.spec["type"]:
                    mine, theirs = f"{mc.spec['type']}: {mine}", f"{oc.spec['type']}: {theirs}"
                mc.notes.append(f"conflict: {src} declares {theirs}"
                                + (f" ({oc.notes[0]})" if oc.notes else "")
                                + f"; kept {main.source}'s {mine} (the first dictionary wins): "
                                "values only one of them allows would be rejected by the other; "
                                "choose from the documentation")
    if pid is not None and pid in index:
        i = index[pid]
        notes.append(f"the privacy id {pid!r} is also a column of {main.source}: not drafted "
                     "(a privacy id is never synthesized)")
        cols[i] = DraftColumn(pid, None, cols[i].notes, cols[i].description)
    return DraftTable(main.fmt, cols, pid, notes, main.source, declared)


def data_header(path: str | Path) -> list[str]:
    """The column names of a data file's header, reading nothing else: a CSV's first line, an
    Avro file's writer schema, a Parquet file's schema, read by the pre-flight of ``synthesize``
    (:func:`~beamsynth.pipelines.io.preflight.header_columns`, Beam ``FileSystems``: local
    paths, ``gs://`` and any file system Beam has). Column names are public structure
    (``docs/schema-guide.md``); no record is read."""
    from beamsynth.pipelines.io.preflight import header_columns

    path = str(path)
    header = header_columns(path)
    if header is None:
        raise ValueError(f"--header-from {path!r}: a JSON-lines file has no header line; order "
                         "the columns in the drafted file by hand")
    if not header:
        raise ValueError(f"--header-from {path!r}: no header line")
    return header


def order_by_header(table: DraftTable, header: Sequence[str], source: str) -> DraftTable:
    """``table``'s columns in the order of a data file's header; a dictionary column missing
    from it is left out (it would fail the pre-flight), header columns the dictionary does not
    declare are named in a note (``extra_columns: ignore`` skips them)."""
    pos = {h: i for i, h in enumerate(header)}
    notes = list(table.notes)
    kept, gone = [], []
    for c in table.columns:
        if c.name in pos:
            kept.append(c)
        elif c.spec is not None:
            gone.append(c.name)
            kept.append(DraftColumn(c.name, None, [*c.notes, f"not in the header of {source}: "
                                    "left out (a declared column missing from the file fails "
                                    "the run's pre-flight); check the name"], c.description))
        else:
            kept.append(c)
    kept.sort(key=lambda c: pos.get(c.name, len(pos)))
    names = {c.name for c in table.columns} | {table.privacy_id}
    extra = [h for h in header if h not in names]
    notes.append(f"columns in the order of {source}'s header line (only that line was read)")
    if extra:
        notes.append(f"{source}'s header has column(s) {extra} that no dictionary declares: "
                     "ignored by the synthesis (extra_columns: ignore) and absent from its output")
    if table.privacy_id is not None and table.privacy_id not in pos:
        notes.append(f"the privacy id {table.privacy_id!r} is not in {source}'s header")
    return DraftTable(table.fmt, kept, table.privacy_id, notes, table.source, table.unit_declared)


def draft_schema(path: str | Path, *, fmt: str = "auto", name: str | None = None,
                 table: str | None = None, also: Sequence[str | Path] = (),
                 header_from: str | Path | None = None) -> str:
    """The drafted schema YAML for a dictionary file (see the module docstring), completed by
    the dictionaries ``also`` and ordered by ``header_from``'s header line."""
    got = read_draft(path, fmt, table=table)
    if also:
        got = merge_drafts(got, [read_draft(p) for p in also])
    if header_from is not None:
        got = order_by_header(got, data_header(header_from), Path(header_from).name)
    sources = ", ".join([Path(path).name, *(Path(p).name for p in also)])
    return render_yaml(name or Path(path).stem, got.columns, source=sources, fmt=got.fmt,
                       privacy_id=got.privacy_id, notes=got.notes, id_declared=got.unit_declared)
