"""Encoding a user's own PCollection (dicts, ``beam.Row``s, named tuples, Arrow batches) into
columnar :class:`~beamsynth.schemas.schema.EncodedBatch` elements, with Beam-style dead letters.

Each element is judged against the declared schema (and the declared prefix keys) alone:

* a field the schema does not declare is ignored (``extra_columns: reject`` dead-letters that
  element only);
* a missing nullable field is null; a missing required field, a null in a non-nullable column, an
  out-of-domain or malformed value dead-letters that element only;
* an element that is not a mapping, a row or an Arrow batch dead-letters itself.

So adding or removing one element changes the encoded records by at most that element (stability),
and no element is ever lost: the dead-letter output carries every rejected element with its
reason. Nothing here reads the data to learn a domain.

Dead letters are schema'd ``beam.Row(source: str, position: Optional[int], reason: str,
element: str)``. ``element`` is the rejected element as JSON text (at most 500 characters).
``position`` is the element's position in its source, read from the field named
``position_field`` when one is declared (attach it upstream, e.g. a line number); a plain
PCollection is unordered, so without such a field the position is ``None``: Beam gives elements no
deterministic index, and numbering them by arrival would depend on the runner.

Elements are buffered per bundle up to ``batch_rows`` rows (an Arrow element counts its rows) and
encoded column by column, each distinct value once per worker (:mod:`~beamsynth.transforms.column_memo`:
the same codes and reasons as :meth:`Schema.encode_columns`), so no Python object per row travels
between steps.
"""

from __future__ import annotations

import difflib
import json
import logging
import operator
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any, NamedTuple, Optional, Union

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints.row_type import RowTypeConstraint
from apache_beam.utils.windowed_value import WindowedValue

from beamsynth.schemas.keys import KeyCodec
from beamsynth.schemas.schema import (
    NULL_CODE_REASON,
    EncodedBatch,
    Schema,
    avro_field_name,
    count_rounded_ids,
    encode_privacy_ids,
)
from beamsynth.transforms.column_memo import SchemaMemo
from beamsynth.transforms.conventions import display_items, element_types

__all__ = [
    "DEAD_LETTER_TYPE",
    "INPUT_TYPES",
    "EncodeElements",
    "EncodeStats",
    "KeyLayout",
    "RowFields",
    "encode_elements",
    "record_position",
    "undeclared_fields",
    "reject_elements",
    "wanted_fields",
]

METRICS_NAMESPACE = "beamsynth"
_LOG = logging.getLogger(__name__)
DEFAULT_BATCH_ROWS = 20_000
_RAW_LIMIT = 500
# reasons of a null value, named 'missing' when the element lacks the field: a required column's,
# and a privacy id's (both quote the name first)
_NULL_REASONS = (NULL_CODE_REASON, "' is empty")

# what a private collection accepts (Beam checks it when the pipeline is built)
INPUT_TYPES = Union[dict[str, Any], beam.Row, pa.Table, pa.RecordBatch]  # noqa: UP007 (Beam hints)
DEAD_LETTER_TYPE = RowTypeConstraint.from_fields(
    [("source", str), ("position", Optional[int]), ("reason", str), ("element", str)])  # noqa: UP045


class EncodeStats(NamedTuple):
    """Exact (non-DP) counts of one encoded batch: elements read and rejected, and encoded
    records whose privacy id is 2**53 or more, read as its nearest float (``privacy_ids:
    rounded``; :func:`~beamsynth.schemas.schema.count_rounded_ids`)."""

    read: int
    rejected: int
    rounded_ids: int = 0


class KeyLayout:
    """Where declared prefix keys sit in the encoded code matrix.

    Columns ``0 .. len(schema) - 1`` hold the schema's cells; then, per key in declaration order,
    ``codec.depth`` columns of its symbols.
    """

    def __init__(self, schema: Schema, keys: Mapping[str, KeyCodec] | None = None) -> None:
        if not isinstance(schema, Schema):
            raise TypeError(f"schema must be a Schema, got {type(schema).__name__} ({schema!r})")
        keys = dict(keys or {})
        for name, codec in keys.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"key names must be non-empty strings, got {name!r}")
            if not isinstance(codec, KeyCodec):
                raise TypeError(f"key {name!r} must be a KeyCodec (bs.TextKey, bs.SpatialKey, "
                                f"bs.HierarchyKey), got {type(codec).__name__}")
        self.schema = schema
        self.keys = keys
        start = len(schema.columns)
        self.slices: dict[str, slice] = {}
        for name, codec in keys.items():
            self.slices[name] = slice(start, start + codec.depth)
            start += codec.depth
        self.width = start

    def key_codes(self, batch: EncodedBatch, name: str) -> EncodedBatch:
        """The symbols of key ``name`` (in the codec's dtype) with the batch's privacy ids."""
        codec = self.keys[name]
        codes = np.ascontiguousarray(batch.codes[:, self.slices[name]]).astype(codec.symbol_dtype)
        return EncodedBatch(codes, batch.pids)

    def schema_codes(self, batch: EncodedBatch) -> EncodedBatch:
        """Only the schema's columns (a view when no key is declared)."""
        if not self.keys:
            return batch
        m = len(self.schema.columns)
        return EncodedBatch(np.ascontiguousarray(batch.codes[:, :m]), batch.pids)


def _short_json(value: Any) -> str:
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    text = text if len(text) <= _RAW_LIMIT else text[: _RAW_LIMIT - 3] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class RowFields(dict):
    """A typed row's fields (``beam.Row``, named tuple): its type gives every row every field, so
    a null undeclared field is no field the row carries (``extra_columns: reject`` ignores it)."""


def _as_mapping(element: Any) -> Mapping[str, Any] | None:
    if isinstance(element, Mapping):
        return element
    asdict = getattr(element, "_asdict", None)  # beam.Row, named tuples (Beam DataFrames)
    if callable(asdict):
        return RowFields(asdict())
    return None


def undeclared_fields(record: Mapping[str, Any], declared: set[Any]) -> list[Any]:
    """A record's undeclared fields (``extra_columns: reject``). A typed row's null field is none:
    a DataFrame read gives every row the fields its sample had (one record's key is a field, null,
    in every other row; H103), and a row type cannot tell a null from an absent field."""
    typed = isinstance(record, RowFields)
    return sorted((k for k, v in record.items()
                   if k not in declared and not (typed and v is None)), key=str)


def wanted_fields(layout: KeyLayout) -> list[str]:
    """The fields an element is read by: declared columns, privacy id, key columns."""
    schema = layout.schema
    names = list(schema.names) + ([schema.privacy_id] if schema.privacy_id else [])
    for codec in layout.keys.values():
        names += [c for c in codec.input_columns if c not in names]
    return names


def missing_field_reason(col: str, fields: Sequence[Any], wanted: Sequence[str]) -> str:
    """``required field 'sex' is missing``, plus the element's own field that looks like it (a
    producer's misspelt key: ``(the element has 'sexx', which is not declared)``; H87: every dict
    of a JSON source with ``sexx`` was a dead letter saying only that ``sex`` was missing)."""
    others = [f for f in fields if isinstance(f, str) and f not in wanted
              and avro_field_name(f) not in wanted]
    lower = {f.lower(): f for f in others}
    close = ([lower[x] for x in (col.lower(), avro_field_name(col).lower()) if x in lower]
             or difflib.get_close_matches(col, others, n=1, cutoff=0.75))
    hint = f" (the element has {close[0]!r}, which is not declared)" if close else ""
    return f"required field {col!r} is missing{hint}"


def _object_array(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _record_column(records: Sequence[Mapping[str, Any]], name: str) -> list[Any]:
    """Field ``name`` of every record (None when absent); a field may also be spelled as its
    identifier form (``education_num`` for ``education-num``), looked up only where needed."""
    try:  # fast path: every record has the field under its declared name (one C loop)
        return list(map(operator.itemgetter(name), records))
    except (KeyError, TypeError):
        pass
    values = [r.get(name) for r in records]
    alias = avro_field_name(name)  # Beam field names are identifiers (education_num)
    if alias != name and None in values:
        values = [r.get(alias) if v is None and name not in r else v
                  for v, r in zip(values, records)]
    return values


class _RecordColumns(dict):
    """``{field: values}`` of a list of records, each column gathered on first use, so a column
    that the memo encodes straight from the records is never built."""

    def __init__(self, records: Sequence[Mapping[str, Any]]) -> None:
        super().__init__()
        self.records = records

    def __missing__(self, name: str) -> list[Any]:
        values = self[name] = _record_column(self.records, name)
        return values

    def gather(self, names: Sequence[str]) -> None:
        """Gather the columns ``names`` in one row-major pass (one ``itemgetter`` of every field
        per record, then a transpose) instead of one pass over the records per column, when that
        reads the same values as :func:`_record_column`: each field is read under its declared
        name if the first record has it (then every record must have it), else under its
        identifier form if no record has the declared name. Otherwise nothing is gathered (the
        columns are then read one by one)."""
        records, names = self.records, [x for x in names if x not in self]
        if len(names) < 2 or not records:
            return
        first, fields = records[0], []
        for name in names:
            alias = avro_field_name(name)
            if name in first:
                fields.append(name)
            elif alias != name and alias in first and not any(
                    map(operator.contains, records, repeat(name))):
                fields.append(alias)
            else:
                return
        try:
            rows = list(map(operator.itemgetter(*fields), records))
        except (KeyError, TypeError):
            return
        self.update(zip(names, zip(*rows)))


def _as_series(values: Sequence[Any]) -> pd.Series:
    if isinstance(values, pd.Series):
        return values
    return pd.Series(_object_array(list(values)), dtype=object, copy=False)


def _present(record: Mapping[str, Any], name: str) -> bool:
    return name in record or avro_field_name(name) in record


def record_position(record: Mapping[str, Any], field: str | None) -> int | None:
    """The integer in ``record[field]`` (an int, a whole float such as pandas' ``12.0``, or its
    text); ``None`` for anything else (absent, null, ``12.5``, ``True``, ``"a.csv:12"``): never a
    crash, never a made-up number (``int(12.7)`` gave 12 until the fifteenth session)."""
    if field is None:
        return None
    value = record.get(field)
    if value is None or isinstance(value, bool):
        return None
    try:
        whole = int(value)  # text: int's own parse ("12", " 12 ", "-2"; "a.csv:12" raises)
        exact = isinstance(value, (str, bytes)) or whole == value
    except (TypeError, ValueError, OverflowError):  # inf, nan: no position, never a crash
        return None
    return whole if exact and -2**63 <= whole < 2**63 else None  # a Beam int is 64 bits


def _dead(source: str, position: int | None, reason: str, element: Any) -> beam.Row:
    return beam.Row(source=source, position=position, reason=reason, element=_short_json(element))


def _encode_schema(schema: Schema, series: Mapping[str, Sequence[Any]], n: int,
                   memo: SchemaMemo | None = None) -> tuple[EncodedBatch, list[tuple[int, str]]]:
    """:meth:`Schema.encode_columns` with distinct values encoded once per worker (``memo``; same
    batch, same reasons)."""
    memo = SchemaMemo(schema) if memo is None else memo
    dtype = np.int32 if all(c.cells < 2**31 for c in schema.columns) else np.int64
    codes = np.empty((n, len(schema.columns)), dtype=dtype)
    reasons: dict[int, str] = {}
    records = series.records if isinstance(series, _RecordColumns) else None
    rows = {} if records is None else memo.encode_rows(records, schema.names)  # settled columns
    if records is not None and len(schema.columns) - len(rows) > 2:  # the others in one pass
        series.gather([c.name for j, c in enumerate(schema.columns) if j not in rows]
                      + ([schema.privacy_id] if schema.privacy_id else []))
    for j, col in enumerate(schema.columns):
        done = rows.get(j) or (None if records is None or col.name in series else
                               memo.encode_records(j, records, col.name))
        cells, why = memo.encode(j, series[col.name]) if done is None else done
        codes[:, j] = cells
        for i, r in why.items():
            reasons.setdefault(i, r)
    pids = None
    if schema.privacy_id is not None:
        raw_ids = series[schema.privacy_id]
        pids, why = encode_privacy_ids(
            raw_ids.tolist() if isinstance(raw_ids, pd.Series) else list(raw_ids),
            schema.privacy_id, exact=schema.privacy_ids == "exact", nan_is_empty=True)
        for i, r in why.items():
            reasons.setdefault(i, r)
    if reasons:
        keep = np.ones(n, dtype=bool)
        keep[list(reasons)] = False
        codes = codes[keep]
        pids = None if pids is None else pids[keep]
    return EncodedBatch(codes, pids), sorted(reasons.items())


def _encode_columns(layout: KeyLayout, series: Mapping[str, Sequence[Any]], n: int,
                    memo: SchemaMemo | None = None) -> tuple[EncodedBatch, dict[int, str]]:
    """Encode raw columns (schema cells, then key symbols); ``{row: reason}`` for bad rows."""
    schema = layout.schema
    batch, bad = _encode_schema(schema, series, n, memo)
    reasons = dict(bad)
    key_parts = []
    for name, codec in layout.keys.items():
        codes, key_bad = codec.encode({c: _as_series(series[c]) for c in codec.input_columns})
        ok = np.ones(n, dtype=bool)
        for i, why in key_bad:
            ok[i] = False
            reasons.setdefault(int(i), f"key {name!r}: {why}")
        full = np.zeros((n, codec.depth), dtype=np.int64)
        full[ok] = codes
        key_parts.append(full)
    if not key_parts:
        return batch, reasons
    keep = np.ones(n, dtype=bool)
    keep[list(reasons)] = False
    schema_ok = np.ones(n, dtype=bool)
    schema_ok[[i for i, _ in bad]] = False
    codes = batch.codes[keep[schema_ok]]
    pids = None if batch.pids is None else batch.pids[keep[schema_ok]]
    codes = np.concatenate([codes] + [k[keep].astype(codes.dtype) for k in key_parts], axis=1)
    return EncodedBatch(np.ascontiguousarray(codes), pids), reasons


def _drop_rows(batch: EncodedBatch, reasons: Mapping[int, str], already: set[int], n: int
               ) -> EncodedBatch:
    """Remove rows newly rejected after encoding (rows in ``already`` are not in ``batch``)."""
    extra = sorted(set(reasons) - already)
    if not extra:
        return batch
    kept_rows = np.setdiff1d(np.arange(n), np.fromiter(already, dtype=np.int64, count=len(already)))
    keep = ~np.isin(kept_rows, extra)
    return EncodedBatch(batch.codes[keep], None if batch.pids is None else batch.pids[keep])


def _encode_records(layout: KeyLayout, records: list[Mapping[str, Any]],
                    memo: SchemaMemo | None = None, position_field: str | None = None
                    ) -> tuple[EncodedBatch, dict[int, str]]:
    """Encode mappings column-wise; returns good rows and ``{index: reason}`` for bad ones
    (``position_field`` is no undeclared field under ``extra_columns: reject``)."""
    n = len(records)
    names = wanted_fields(layout)
    series = _RecordColumns(records)
    batch, reasons = _encode_columns(layout, series, n, memo)
    for i, why in list(reasons.items()):  # name a missing field as missing, not as null
        if why.endswith(_NULL_REASONS) and "'" in why:
            col = why.split("'")[1]
            if not _present(records[i], col):
                reasons[i] = missing_field_reason(col, list(records[i]), names)
    unnamed = [i for i, r in enumerate(records) if None in r and i not in reasons]
    if unnamed:  # csv.DictReader keeps a line's extra fields under None: not one record
        already = set(reasons)
        reasons.update((i, "values without a field name (csv.DictReader's extra fields: the line "
                           "has more fields than its header)") for i in unnamed)
        batch = _drop_rows(batch, reasons, already, n)
    if layout.schema.extra_columns == "reject":
        declared = set(names) | {avro_field_name(x) for x in names} | {position_field}
        already = set(reasons)
        for i, r in enumerate(records):
            extra = undeclared_fields(r, declared)
            if extra and i not in reasons:
                reasons[i] = f"undeclared field(s) {extra} and the schema says extra_columns: reject"
        batch = _drop_rows(batch, reasons, already, n)
    return batch, reasons


def encode_elements(layout: KeyLayout, elements: Sequence[Any], *, source: str,
                    position_field: str | None = None, memo: SchemaMemo | None = None
                    ) -> tuple[list[EncodedBatch], list[beam.Row]]:
    """Encode a list of elements (Beam-free): encoded batches and dead-letter rows.

    Arrow tables and record batches are encoded column-wise without per-row Python objects
    (rows are materialized only for the dead letters' text); mappings and rows are gathered
    column by column. ``memo`` (one per worker) remembers the codes of distinct values across
    calls; without it each call starts afresh (same result).
    """
    memo = SchemaMemo(layout.schema) if memo is None else memo
    batches: list[EncodedBatch] = []
    dead: list[beam.Row] = []
    records: list[Mapping[str, Any]] = []
    kinds = set(map(type, elements))
    if kinds == {dict}:  # the common case (json.loads): no per-element checks
        records, elements = list(elements), []
    elif len(kinds) == 1 and _named_tuple_type(next(iter(kinds))) and \
            layout.schema.extra_columns != "reject":  # schema'd rows of one generated type
        tuples = _encode_tuples(layout, elements, memo, source=source, position_field=position_field)
        if tuples is not None:
            return tuples
    for element in elements:
        if isinstance(element, (pa.Table, pa.RecordBatch)):
            try:
                b, d = _encode_arrow(layout, element, source=source, position_field=position_field,
                                     memo=memo)
            except Exception as exc:  # noqa: BLE001 - only the rows that fail alone are bad
                b, d = _encode_arrow_split(layout, element, exc, source=source,
                                           position_field=position_field, memo=memo)
            batches.append(b)
            dead += d
            continue
        record = _as_mapping(element)
        if record is None:
            dead.append(_dead(source, None, f"element of type {type(element).__name__} is not a "
                              "dict, beam.Row, named tuple or Arrow table", element))
            continue
        records.append(record)
    if records:
        try:
            b, reasons = _encode_records(layout, records, memo, position_field)
        except Exception:  # noqa: BLE001 - one odd element must not fail its neighbours
            b, reasons = _encode_one_by_one(layout, records, memo, position_field)
        batches.append(b)
        dead += [_dead(source, record_position(records[i], position_field), why, dict(records[i]))
                 for i, why in sorted(reasons.items())]
    return batches, dead


def _named_tuple_type(kind: type) -> bool:
    return issubclass(kind, tuple) and isinstance(getattr(kind, "_fields", None), tuple)


def _encode_tuples(layout: KeyLayout, elements: Sequence[tuple], memo: SchemaMemo, *, source: str,
                   position_field: str | None) -> tuple[list[EncodedBatch], list[beam.Row]] | None:
    """Rows of one generated NamedTuple type (``ReadFromParquet(as_rows=True)``, ``ReadFromCsv``,
    ``to_pcollection``), column-wise like an Arrow table: the columns are one transpose
    (``zip(*rows)``, in C), no dict per row; a row becomes a dict only for its dead letter. Each
    declared field is read under its name, else its identifier form, as :func:`_record_column`
    reads a row's ``_asdict()``; a field the type lacks is null in every row. ``None`` when the
    batch fails as a whole (the caller then encodes the rows as mappings, one by one if need be).
    """
    fields = type(elements[0])._fields
    n = len(elements)
    by_field = dict(zip(fields, zip(*elements))) if n else {}
    series: dict[str, Sequence[Any]] = {}
    missing = []
    for name in wanted_fields(layout):
        field = name if name in fields else avro_field_name(name)
        if field in fields:
            series[name] = by_field.get(field, ())
        else:
            series[name] = [None] * n
            missing.append(name)
    try:
        batch, reasons = _encode_columns(layout, series, n, memo)
    except Exception:  # noqa: BLE001 - the mapping path judges the rows one by one
        return None
    dead = []
    for i, why in sorted(reasons.items()):
        if why.endswith(_NULL_REASONS) and "'" in why and why.split("'")[1] in missing:
            why = missing_field_reason(why.split("'")[1], fields, wanted_fields(layout))
        record = elements[i]._asdict()
        dead.append(_dead(source, record_position(record, position_field), why, dict(record)))
    return [batch], dead


def _encode_one_by_one(layout: KeyLayout, records: list[Mapping[str, Any]], memo: SchemaMemo,
                       position_field: str | None = None) -> tuple[EncodedBatch, dict[int, str]]:
    """Fallback when a batch fails as a whole: split in halves until the records that fail stand
    alone (each dead-lettered with why it fails alone); every other record encodes as it would
    alone (stability), in input order. Same result as encoding each record alone, at a cost of
    about log2(n) batch encodes per failing record instead of n one-record encodes."""
    parts: list[EncodedBatch] = []
    reasons: dict[int, str] = {}

    def visit(lo: int, hi: int) -> None:
        try:
            b, why = _encode_records(layout, records[lo:hi], memo, position_field)
        except Exception as exc:  # noqa: BLE001
            if hi - lo == 1:
                reasons[lo] = _unencodable(layout, records[lo], exc)
                return
            visit(lo, (lo + hi) // 2)
            visit((lo + hi) // 2, hi)
            return
        parts.append(b)
        reasons.update((lo + i, r) for i, r in why.items())

    n = len(records)
    for lo, hi in ((0, n // 2), (n // 2, n)) if n > 1 else ((0, n),):  # the whole batch failed
        visit(lo, hi)
    return _concat(layout, parts), dict(sorted(reasons.items()))


def _unencodable(layout: KeyLayout, record: Mapping[str, Any], exc: Exception) -> str:
    """Why one record failed as a whole: a declared field holding a nested value, else the error."""
    return _nested_reason(layout, record) or f"cannot encode element: {type(exc).__name__}: {exc}"


def _nested_reason(layout: KeyLayout, record: Mapping[str, Any]) -> str | None:
    """``column 'sex': value {...} is a dict, not one value; flatten ...`` for a declared field
    holding a nested value (a dict's, a row's or an Arrow struct's), else ``None``."""
    for name in wanted_fields(layout):
        value = record.get(name, record.get(avro_field_name(name)))
        if isinstance(value, (Mapping, list, tuple, set)):
            return (f"column {name!r}: value {value!r:.80} is a {type(value).__name__}, not one "
                    "value; flatten nested fields before job.private (e.g. in a beam.Map)")
    return None


def _concat(layout: KeyLayout, parts: list[EncodedBatch]) -> EncodedBatch:
    if not parts:
        pids = None if layout.schema.privacy_id is None else np.zeros(0, dtype=object)
        return EncodedBatch(np.zeros((0, layout.width), np.int32), pids)
    pids = None if parts[0].pids is None else np.concatenate([p.pids for p in parts])
    return EncodedBatch(np.concatenate([p.codes for p in parts]), pids)


def _encode_arrow(layout: KeyLayout, table: pa.Table | pa.RecordBatch, *, source: str,
                  position_field: str | None, memo: SchemaMemo | None = None
                  ) -> tuple[EncodedBatch, list[beam.Row]]:
    """An Arrow element, column-wise; rows are materialized only for dead letters."""
    n = table.num_rows
    have = set(table.schema.names)
    wanted = wanted_fields(layout)
    if layout.schema.extra_columns == "reject":
        declared = set(wanted) | {avro_field_name(x) for x in wanted}
        extra = sorted(h for h in have if h not in declared and h != position_field)
        if extra:
            return _concat(layout, []), [
                _dead(source, record_position(r, position_field),
                      f"undeclared field(s) {extra} and the schema says extra_columns: reject", r)
                for r in table.to_pylist()]
    series: dict[str, pd.Series] = {}
    missing = []
    for name in wanted:
        field = name if name in have else avro_field_name(name)
        if field in have:
            # integer_object_nulls: an int column with a null stays ints (not floats: 7 -> "7.0"
            # would change other rows' categories and privacy ids)
            column = table.column(field)
            # a nested column (list, struct, map) as Python values, as a dict holds them (pandas
            # gives numpy arrays: 'value array([31])', not the dict's '[31]')
            series[name] = (pd.Series(column.to_pylist(), dtype=object)
                            if pa.types.is_nested(column.type) else
                            column.to_pandas(integer_object_nulls=True).astype(object))
        else:  # a missing field is null in every row (rejected where the column is required)
            series[name] = pd.Series([None] * n, dtype=object)
            missing.append(name)
    batch, reasons = _encode_columns(layout, series, n, memo)
    if not reasons:
        return batch, []
    for i, why in list(reasons.items()):
        if why.endswith(_NULL_REASONS) and "'" in why and why.split("'")[1] in missing:
            reasons[i] = missing_field_reason(why.split("'")[1], table.column_names,
                                              wanted_fields(layout))
    rows = table.to_pylist()
    return batch, [_dead(source, record_position(rows[i], position_field), why, rows[i])
                   for i, why in sorted(reasons.items())]


def _encode_arrow_split(layout: KeyLayout, table: pa.Table | pa.RecordBatch, error: Exception, *,
                        source: str, position_field: str | None, memo: SchemaMemo | None
                        ) -> tuple[EncodedBatch, list[beam.Row]]:
    """An Arrow element that fails as a whole (``error``), split in halves until the rows that
    fail stand alone: each of those is one dead letter, every other row encodes as it would
    alone (stability), and no row is lost."""
    n = table.num_rows
    if n <= 1:
        reason = f"cannot encode Arrow element: {type(error).__name__}: {error}"
        try:
            rows = table.to_pylist()
            reason = _nested_reason(layout, rows[0]) or reason if rows else reason  # as a dict's
        except Exception:  # noqa: BLE001 - a value Python cannot hold: the fields, no value
            rows = [{"arrow_fields": table.schema.names}] * n
        return _concat(layout, []), [_dead(source, record_position(r, position_field), reason, r)
                                     for r in rows]
    parts, dead = [], []
    for half in (table.slice(0, n // 2), table.slice(n // 2)):
        try:
            b, d = _encode_arrow(layout, half, source=source, position_field=position_field,
                                 memo=memo)
        except Exception as exc:  # noqa: BLE001
            b, d = _encode_arrow_split(layout, half, exc, source=source,
                                       position_field=position_field, memo=memo)
        parts.append(b)
        dead += d
    return _concat(layout, parts), dead


class _EncodeFn(beam.DoFn):
    """Elements → EncodedBatch (main), dead letters (``dead_letters``), stats (``stats``).

    Buffers elements up to ``batch_rows`` rows and encodes them together; the rest of a bundle is
    encoded in ``finish_bundle`` and emitted in the global window (windowed input:
    :class:`_WindowedEncodeFn`). Cheaper per element than ``beam.BatchElements``, which times every batch.
    """

    def __init__(self, layout: KeyLayout, source: str, position_field: str | None,
                 batch_rows: int) -> None:
        self._layout, self._source, self._position = layout, source, position_field
        self._batch_rows = batch_rows
        self._read = Metrics.counter(METRICS_NAMESPACE, "elements_read")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "elements_rejected")
        self._unplaced = Metrics.counter(METRICS_NAMESPACE, "dead_letters_without_position")
        self._warned = False

    def setup(self) -> None:
        self._memo = SchemaMemo(self._layout.schema)  # codes of distinct values, per worker

    def start_bundle(self) -> None:
        self._buffer: list[Any] = []
        self._rows = 0

    def process(self, element: Any):
        # not a generator: nothing to iterate per element until a batch is full
        self._buffer.append(element)
        self._rows += 1 if type(element) is dict else _element_rows(element)
        if self._rows >= self._batch_rows:
            return self._flush()
        return ()  # not None: Beam logs a warning for every DoFn whose process returns None

    def finish_bundle(self):
        for out in self._flush():
            if isinstance(out, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(out.tag, GlobalWindows.windowed_value(out.value))
            else:
                yield GlobalWindows.windowed_value(out)

    def _flush(self):
        elements, read = self._buffer, self._rows
        self._buffer, self._rows = [], 0
        if not elements:
            return
        batches, dead = encode_elements(self._layout, elements, source=self._source,
                                        position_field=self._position, memo=self._memo)
        self._read.inc(read)
        self._rejected.inc(len(dead))
        if self._position is not None:
            self._note_unplaced(sum(d.position is None for d in dead))
        schema = self._layout.schema
        rounded = 0 if schema.privacy_id is None or schema.privacy_ids == "exact" else sum(
            count_rounded_ids(b.pids) for b in batches)
        yield beam.pvalue.TaggedOutput("stats", EncodeStats(read, len(dead), rounded))
        for d in dead:
            yield beam.pvalue.TaggedOutput("dead_letters", d)
        for b in batches:
            if len(b):
                yield b


    def _note_unplaced(self, unplaced: int) -> None:
        """Dead letters whose element lacks ``position_field`` (an Arrow batch without that
        column, a dict without that key) or holds no integer there: counted
        (``beamsynth/dead_letters_without_position``) and, once per worker, logged (field names
        only, no value). Never refused: only the run sees a batch's columns, and one element must
        not fail the others (rules 7, 8)."""
        if not unplaced:
            return
        self._unplaced.inc(unplaced)
        if not self._warned:
            self._warned = True
            _LOG.warning(
                "%s", f"{self._source}: dead letters without a position: their elements lack "
                f"position_field {self._position!r} or hold no integer there; attach it upstream "
                "to every element (an Arrow batch needs it as a column: batch.append_column("
                f"{self._position!r}, pyarrow.array(range(offset, offset + batch.num_rows)))); "
                "counter beamsynth/dead_letters_without_position")


class _WindowedEncodeFn(_EncodeFn):
    """:class:`_EncodeFn` for input in declared windows: one buffer per window, and every batch,
    dead letter and stats element is emitted in its window, stamped at the window start, so no
    batch mixes windows (``MakePrivate(windows=...)``)."""

    def start_bundle(self) -> None:
        super().start_bundle()
        self._pending: dict[Any, tuple[list[Any], int]] = {}

    def process(self, element: Any, window=beam.DoFn.WindowParam):
        buffer, rows = self._pending.get(window, ([], 0))
        buffer.append(element)
        self._pending[window] = (buffer, rows + _element_rows(element))
        if self._pending[window][1] >= self._batch_rows:
            yield from self._flush_window(window)

    def finish_bundle(self):
        for window in list(self._pending):
            yield from self._flush_window(window)

    def _flush_window(self, window: Any):
        self._buffer, self._rows = self._pending.pop(window)
        for out in self._flush():
            if isinstance(out, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(out.tag, WindowedValue(out.value, window.start, (window,)))
            else:
                yield WindowedValue(out, window.start, (window,))


def reject_elements(element: Any, *, source: str, position_field: str | None,
                    reason: str) -> list[beam.Row]:
    """Dead letters for a whole element with one ``reason`` (one per row of an Arrow element)."""
    if isinstance(element, (pa.Table, pa.RecordBatch)):
        return [_dead(source, record_position(r, position_field), reason, r) for r in element.to_pylist()]
    record = _as_mapping(element)
    if record is None:
        return [_dead(source, None, reason, element)]
    return [_dead(source, record_position(record, position_field), reason, dict(record))]


def _element_rows(element: Any) -> int:
    return element.num_rows if isinstance(element, (pa.Table, pa.RecordBatch)) else 1


@element_types(outputs={"batches": EncodedBatch})
class EncodeElements(beam.PTransform):
    """User elements → ``{"batches", "dead_letters", "stats"}``.

    Input: ``PCollection`` of dicts, ``beam.Row``s / named tuples, or pyarrow Tables/RecordBatches.
    Outputs: ``batches`` (:class:`EncodedBatch`, schema cells then declared key symbols, see
    :class:`KeyLayout`), ``dead_letters`` (``beam.Row``, :data:`DEAD_LETTER_TYPE`), ``stats``
    (:class:`EncodeStats` per batch, exact and private).
    """

    def __init__(self, *, layout: KeyLayout, source: str, position_field: str | None = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS, label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(layout, KeyLayout):
            raise TypeError(f"layout must be a KeyLayout, got {type(layout).__name__}")
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
            raise ValueError(f"batch_rows ({batch_rows!r}) must be an int >= 1")
        if position_field is not None and (not isinstance(position_field, str) or not position_field):
            raise ValueError(f"position_field ({position_field!r}) must be None or a field name")
        self._layout, self._source, self._position = layout, str(source), position_field
        self._batch_rows = batch_rows

    def display_data(self) -> dict[str, Any]:
        """Source name and batching (no data values)."""
        return display_items(step="encode user elements to declared cells (dead letters tagged "
                                  "'dead_letters')", source=self._source, batch_rows=self._batch_rows,
                             position_field=self._position)

    def expand(self, elements):
        windowed = not isinstance(elements.windowing.windowfn, GlobalWindows)
        fn = _WindowedEncodeFn if windowed else _EncodeFn
        out = elements | "Encode" >> beam.ParDo(
            fn(self._layout, self._source, self._position, self._batch_rows)
        ).with_outputs("dead_letters", "stats", main="batches")
        # batches: EncodedBatch; dead_letters: beam.Row; stats: EncodeStats
        out.batches.element_type = EncodedBatch
        out.dead_letters.element_type = DEAD_LETTER_TYPE
        out.stats.element_type = EncodeStats
        dead = out.dead_letters | "DeadLetters" >> beam.Map(_same).with_output_types(DEAD_LETTER_TYPE)
        # beam.Row: a step of its own, since Beam (2.77) flushes a step's batch buffers before its
        # finish_bundle runs, so a batched sink fed straight from _EncodeFn (WriteToCsv,
        # WriteToJson, WriteToParquet, DataFrames) lost the dead letters emitted there
        return {"batches": out.batches, "dead_letters": dead, "stats": out.stats}


def _same(row: Any) -> Any:
    return row
