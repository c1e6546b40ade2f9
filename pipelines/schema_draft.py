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
  ``description``.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DRAFT_FORMATS", "DraftColumn", "draft_schema", "nice_step", "read_dictionary",
           "render_yaml"]

DRAFT_FORMATS = ("auto", "sdnist", "domain-json", "csv")
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


# -- reading and rendering ----------------------------------------------------------------------------
def read_dictionary(path: str | Path, fmt: str = "auto") -> tuple[str, list[DraftColumn]]:
    """``(format, drafted columns)`` of a public dictionary file (never the data)."""
    if fmt not in DRAFT_FORMATS:
        raise ValueError(f"format ({fmt!r}) must be one of {list(DRAFT_FORMATS)}")
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ValueError(f"dictionary {str(p)!r}: cannot read: {exc}") from exc
    if fmt == "auto" and p.suffix.lower() in (".yaml", ".yml"):
        raise ValueError(
            f"dictionary {str(p)!r}: a YAML file; draft reads an SDNist data_dictionary.json, a "
            "domain JSON or a CSV codebook. From metadata such as SmartNoise's YAML (type, lower, "
            "upper per column), write a CSV codebook 'column,type,values,min,max' (categories "
            "as a|b|c) and draft that; an existing beamsynth schema YAML needs no draft: "
            "`beamsynth schema validate` it (docs/schema-guide.md)")
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


def _flow(value: Any) -> str:
    """A YAML flow value (JSON is YAML; strings stay quoted so codes like "01" stay strings)."""
    return json.dumps(value, ensure_ascii=False)


def render_yaml(name: str, columns: Sequence[DraftColumn], *, source: str, fmt: str) -> str:
    """The drafted schema as YAML text, each guess marked ``# REVIEW:``."""
    drafted = [c for c in columns if c.spec is not None]
    lines = [
        f"# Drafted by `beamsynth schema draft` from the public dictionary {source} ({fmt}).",
        "# Every domain below comes from that dictionary, never from the data. Review each",
        "# '# REVIEW:' line, then check the file with `beamsynth schema validate`.",
        f"name: {_flow(name)}",
        "privacy_id: null   # REVIEW: name the column identifying a person, if any",
        "extra_columns: ignore",
        "columns:",
    ]
    for c in columns:
        if c.description:
            lines.append(f"  # {c.name}: {' '.join(c.description.split())}")
        prefix = "  " if c.spec is not None else "  # "
        for note in c.notes:
            lines.append(f"  # REVIEW: {note}")
        if c.spec is None:
            lines.append(f"  # - name: {_flow(c.name)}   (not drafted)")
            continue
        spec = c.spec
        lines.append(f"{prefix}- name: {_flow(spec['name'])}")
        lines.append(f"{prefix}  type: {spec['type']}")
        lines.append(f"{prefix}  domain: {_flow(spec['domain'])}")
        if spec.get("nullable"):
            lines.append(f"{prefix}  nullable: true")
            lines.append(f"{prefix}  null_values: {_flow(spec['null_values'])}")
    if not drafted:
        raise ValueError(f"dictionary {source!r}: no column could be drafted; `schema draft` reads "
                         "an SDNist data_dictionary.json, a domain JSON ({column: {type, min, max} "
                         "| {categories: [...]} | size} or {column: {code: label}}) or a CSV "
                         "codebook (column,type[,values,min,max,...]); see the notes above each "
                         "column in the output (docs/schema-guide.md)")
    return "\n".join(lines) + "\n"


def draft_schema(path: str | Path, *, fmt: str = "auto", name: str | None = None) -> str:
    """The drafted schema YAML for a dictionary file (see the module docstring)."""
    used, cols = read_dictionary(path, fmt)
    stem = Path(path).stem
    return render_yaml(name or stem, cols, source=Path(path).name, fmt=used)
