"""Declared record schemas: columns, their domains, nullability and the privacy unit.

A schema file (YAML or JSON) looks like::

    name: adult
    privacy_id: null            # or the name of a column identifying a person
    privacy_ids: rounded        # or exact: ids beyond 2**53 kept digit for digit (see privacy_id_text)
    extra_columns: ignore       # input columns not declared here: ignore | reject
    target: income              # optional: the column models will be trained to predict (public)
    columns:
      - name: age
        type: integer
        domain: {kind: integer, low: 17, high: 90, bins: 15}
      - name: workclass
        type: categorical
        domain: {kind: categorical, values: [Private, Self-emp-not-inc, ...]}
        nullable: false
        null_values: [""]       # raw tokens read as null (default [""])
        on_out_of_domain: reject   # or: other (needs a catch-all 'other' in the domain)
        open: {tolerance: 0.5}  # optional: huge declared domain, released with CatHist (ρ)
        normalize: {case: lower, unicode: NFKC, strip: true}   # optional, categorical/text only

``schemas/schema.json`` is the JSON Schema of this format. Every error names the file, the column
and the problem. Nothing here looks at data rows: domains are declared.
"""

from __future__ import annotations

import datetime
import decimal
import difflib
import functools
import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from beamsynth.schemas.domains import (
    MALFORMED,
    OUT_OF_DOMAIN,
    CategoricalDomain,
    Domain,
    domain_from_spec,
)

__all__ = [
    "Column",
    "Normalization",
    "EncodedBatch",
    "Schema",
    "SchemaError",
    "load_schema",
    "bundled_schema_path",
    "NULL_CODE_REASON",
    "avro_field_name",
    "privacy_id_text",
    "encode_privacy_ids",
    "count_rounded_ids",
    "ID_MODES",
    "reader_caveats",
]

COLUMN_TYPES = ("categorical", "integer", "float", "datetime", "string", "text")
_TYPE_KINDS = {
    "categorical": {"categorical", "product", "string", "union"},
    "integer": {"integer"},
    "float": {"float"},
    "datetime": {"datetime"},
    "string": {"string", "categorical", "product", "union"},
    "text": {"string", "categorical", "product", "union"},
}
NULL_CODE_REASON = "null in a non-nullable column"
_EXAMPLES = Path(__file__).resolve().parent / "examples"


class SchemaError(ValueError):
    """A schema file or object is invalid; the message names the file, column and problem."""


CASES = ("none", "lower", "upper", "fold")
UNICODE_FORMS = ("none", "NFC", "NFKC", "NFD", "NFKD")


@dataclass(frozen=True)
class Normalization:
    """Declared normalisation of a categorical/string/text column's input values.

    Applied to every non-null input value before it is matched against the declared domain (the
    domain itself is never changed, so declare it in normalised form: a lower-case word list with
    ``case: lower``). The same options as the prefix keys' ``casefold`` (``schemas/keys.py``),
    per column. Order: Unicode normalisation, then case, then stripping.

    Attributes:
      case: ``lower`` (``str.lower``), ``upper``, ``fold`` (``str.casefold``: also ``ß`` → ``ss``)
        or ``none``.
      unicode: ``NFC``, ``NFKC`` (compatibility forms: ``ﬁ`` → ``fi``, full-width → ASCII),
        ``NFD``, ``NFKD`` or ``none``.
      strip: strip leading/trailing white space of every value (not only of values that fail to
        match, as ``strip_whitespace`` does).

    Privacy: a fixed, declared, per-value map (no statistic of the data), so it changes nothing
    in any mechanism's sensitivity; a record's encoding still depends on that record alone.
    """

    case: str = "none"
    unicode: str = "none"
    strip: bool = False

    def __post_init__(self) -> None:
        if self.case not in CASES:
            raise ValueError(f"normalize.case ({self.case!r}) must be one of {list(CASES)}")
        if self.unicode not in UNICODE_FORMS:
            raise ValueError(
                f"normalize.unicode ({self.unicode!r}) must be one of {list(UNICODE_FORMS)}"
            )
        if not isinstance(self.strip, bool):
            raise ValueError(f"normalize.strip ({self.strip!r}) must be true or false")

    @property
    def is_identity(self) -> bool:
        """Whether the normalisation changes nothing."""
        return self.case == "none" and self.unicode == "none" and not self.strip

    def apply_one(self, value: str) -> str:
        """The normalised form of one string."""
        if self.unicode != "none":
            value = unicodedata.normalize(self.unicode, value)
        if self.case == "lower":
            value = value.lower()
        elif self.case == "upper":
            value = value.upper()
        elif self.case == "fold":
            value = value.casefold()
        return value.strip() if self.strip else value

    def apply(self, series: pd.Series) -> pd.Series:
        """``series`` with every string normalised (other values, e.g. JSON numbers, unchanged)."""
        if self.is_identity or series.empty:
            return series
        values = series.to_numpy(dtype=object)
        cache: dict[str, str] = {}
        out = np.empty(values.size, dtype=object)
        for i, v in enumerate(values.tolist()):
            if isinstance(v, str):
                n = cache.get(v)
                if n is None:
                    n = cache[v] = self.apply_one(v)
                out[i] = n
            else:
                out[i] = v
        return pd.Series(out, index=series.index, dtype=object)

    def to_spec(self) -> dict[str, Any]:
        """Declarative form (only the options that differ from the defaults)."""
        spec: dict[str, Any] = {}
        if self.case != "none":
            spec["case"] = self.case
        if self.unicode != "none":
            spec["unicode"] = self.unicode
        if self.strip:
            spec["strip"] = True
        return spec


@dataclass(frozen=True)
class Column:
    """One declared column.

    Attributes:
      name: column name in the input.
      type: one of categorical, integer, float, datetime, string, text.
      domain: the declared domain.
      nullable: whether nulls are allowed; a null is then one extra cell (index ``domain.size``).
      null_values: raw tokens read as null.
      on_out_of_domain: ``reject`` (dead-letter the row) or ``other`` (map to the catch-all cell).
      tolerance: ρ for open columns (released with the CatHist mechanism), else ``None``.
      strip_whitespace: strip leading/trailing white space of string values before matching
        (``" Male"`` from ``a, b`` CSVs matches ``Male``); set false to match values exactly.
      normalize: declared normalisation of input values (:class:`Normalization`), or ``None``.
    """

    name: str
    type: str
    domain: Domain
    nullable: bool = False
    null_values: tuple[str, ...] = ("",)
    on_out_of_domain: str = "reject"
    tolerance: float | None = None
    strip_whitespace: bool = True
    normalize: Normalization | None = None

    @property
    def cells(self) -> int:
        """Number of cells of this column in measurements (domain size, +1 for null)."""
        return self.domain.size + (1 if self.nullable else 0)

    @property
    def null_index(self) -> int | None:
        """Cell index of null, if the column is nullable."""
        return self.domain.size if self.nullable else None

    @property
    def is_open(self) -> bool:
        """Whether the column is released with CatHist over a huge declared domain."""
        return self.tolerance is not None

    def _classify(self, series: pd.Series) -> tuple[np.ndarray, np.ndarray]:
        """(null mask, codes) for a Series; codes of null positions are left unset."""
        is_null = (series.isna() | series.isin(list(self.null_values))).to_numpy(dtype=bool)
        codes = np.full(len(series), MALFORMED, dtype=np.int64)
        present = np.flatnonzero(~is_null)
        if present.size:
            codes[present] = self.domain.encode_many(series.iloc[present])
        return is_null, codes

    def encode(self, values: Sequence[Any]) -> tuple[np.ndarray, dict[int, str]]:
        """Cell codes for raw values, and ``{position: reason}`` for values that could not be encoded."""
        series = values if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
        series = series.reset_index(drop=True)
        if series.dtype == object and any(t is not str and issubclass(t, str)
                                          for t in set(map(type, series.tolist()))):
            # a str subclass (np.str_) is its text, as the memo's lookups take it: pandas'
            # datetime parser refused it alone and read it beside plain strings (rule 6)
            series = pd.Series([str.__str__(v) if isinstance(v, str) else v
                                for v in series.tolist()], dtype=object)
        raw = series
        dated = self.type != "datetime" and _pandas_date_name(self.name)
        if dated and any(map(_is_timestamp, series.tolist())):
            series = self._undo_timestamps(series)
        if self.normalize is not None and not self.normalize.is_identity:
            # null tokens are matched on the raw value; everything else is normalised first
            raw_null = (series.isna() | series.isin(list(self.null_values))).to_numpy(dtype=bool)
            normed = self.normalize.apply(series)
            series = normed.where(~raw_null, series)
        is_null, codes = self._classify(series)
        if self.strip_whitespace:
            # retry only values that failed and carry surrounding white space (rare, so cheap)
            failed = np.flatnonzero((codes < 0) & ~is_null)
            vals = series.to_numpy(dtype=object)
            padded = [i for i in failed.tolist()
                      if isinstance(vals[i], str) and vals[i] != vals[i].strip()]
            if padded:
                sub = pd.Series([vals[i].strip() for i in padded], dtype=object)
                sub_null, sub_codes = self._classify(sub)
                is_null[padded] = sub_null
                codes[padded] = sub_codes
        if dated:
            # text pandas' JSON reader would have made a timestamp ("2020-01-01" beside a
            # declared "2020-01") is judged by that instant, as the timestamp is (H66)
            vals = series.to_numpy(dtype=object)
            failed = [i for i in np.flatnonzero((codes < 0) & ~is_null).tolist()
                      if isinstance(vals[i], str) and vals[i].strip() and _value_key(vals[i]) is None]
            stamps = {i: _json_reader_stamp(vals[i]) for i in failed}
            stamped = [i for i in failed if stamps[i] is not None]
            if stamped:
                sub = self._undo_timestamps(pd.Series([stamps[i] for i in stamped], dtype=object))
                sub_codes = self._classify(sub)[1]
                codes[stamped] = np.where(sub_codes >= 0, sub_codes, codes[stamped])
        if self.type in ("categorical", "string", "text"):
            # a whole float whose own text is not declared is its integer code (1.0 -> "1": a
            # pandas column with a blank turns 1 into 1.0), as privacy ids; each value alone
            vals = series.to_numpy(dtype=object)
            whole = [i for i in np.flatnonzero(codes == OUT_OF_DOMAIN).tolist()
                     if isinstance(vals[i], float) and vals[i].is_integer()]
            if whole:
                sub_codes = self._classify(pd.Series([privacy_id_text(vals[i]) for i in whole],
                                                     dtype=object))[1]
                codes[whole] = np.where(sub_codes >= 0, sub_codes, codes[whole])
            if isinstance(self.domain, CategoricalDomain):
                # a number or boolean whose text is not declared is the declared category of its
                # value ("01" for 1: pandas' CSV reader parses a code column as numbers unless one
                # of its values is no number, rule 6, H45); so is text a pandas reader would give
                # as that value ("1", " 1", "1.0", "TRUE"), else the same field was used or not
                # depending on another row (H55); each value alone, ambiguity rejected
                numbers = [i for i in np.flatnonzero(codes == OUT_OF_DOMAIN).tolist()
                           if _value_key(vals[i]) is not None]
                if numbers:
                    by_value = _declared_numbers(self.domain.values)
                    for i in numbers:
                        codes[i] = by_value.get(_value_key(vals[i]), OUT_OF_DOMAIN)
            else:  # an open string: a number, or number-looking text its own spelling does not
                # fit, is its number's text ("1" for 1, 1.0, "1e0"), not malformed, so a pandas
                # reader's number and text agree on whether the row is used (H55)
                numbers = [i for i in np.flatnonzero(codes < 0).tolist()
                           if (_value_key(vals[i]) or ("",))[0] == "n"]
                if numbers:
                    sub_codes = self._classify(pd.Series([str(_value_key(vals[i])[1])
                                                          for i in numbers], dtype=object))[1]
                    codes[numbers] = np.where(sub_codes >= 0, sub_codes, codes[numbers])
        reasons: dict[int, str] = {}
        if is_null.any():
            if self.nullable:
                codes[is_null] = self.domain.size
            else:
                codes[is_null] = MALFORMED
                for i in np.flatnonzero(is_null).tolist():
                    reasons[i] = f"column {self.name!r}: {NULL_CODE_REASON}"
        ood = codes == OUT_OF_DOMAIN
        if ood.any():
            if self.on_out_of_domain == "other":
                assert isinstance(self.domain, CategoricalDomain)  # checked at load
                codes[ood] = self.domain.other_index
            else:
                bounds = _declared_bounds(self.domain) + _way_out(self.domain)
                for i in np.flatnonzero(ood).tolist():
                    reasons[i] = (
                        f"column {self.name!r}: value {_short(raw[i])} is outside the declared "
                        f"{self.domain.kind} domain{bounds}"
                    )
        bad = np.flatnonzero(codes == MALFORMED)
        for i in bad:
            reasons.setdefault(
                int(i), f"column {self.name!r}: value {_short(raw[i])} is not a valid {self.type}"
            )
        return codes, reasons

    def _undo_timestamps(self, series: pd.Series) -> pd.Series:
        """Timestamps in a column that is no datetime (named as pandas converts: see
        :func:`_pandas_date_name`) back to the declared value they stand for.

        pandas' JSON reader (``beam.io.ReadFromJson``, Beam YAML's ``ReadFromJson``) turns a
        column named like a date (``date``, ``*_at``, ``*_time``, ``timestamp*``, ...) into
        timestamps when every value of the chunk parses as one, and leaves it alone beside one
        that does not, so a value was used or rejected depending on another row (rule 6; H55).
        A categorical column takes the one declared category that parses to the same instant
        (``"2020-01"``); an integer/float column the epoch number in the first unit, as pandas
        tries them (s, ms, us, ns), that is whole and inside the declared range. Each value
        alone, declared values only; anything else stays a timestamp (then malformed).

        Text the reader would have made a timestamp ("2020-01-01", "Jan 2020" beside a declared
        "2020-01"; an ISO date in an epoch column) is judged by the same instant in ``encode``,
        else it was used in a chunk of dates and rejected beside one word (rule 6; H66). An epoch
        number is undone only to a value pandas converts (> 31,536,000, its ``min_stamp``), else
        one millisecond value in the chunk made every second value 1,000 times smaller (H66)."""
        out = []
        instants = (_declared_instants(tuple(self.domain.values))  # once per call, not per value
                    if isinstance(self.domain, CategoricalDomain) else None)
        low, high = getattr(self.domain, "low", None), getattr(self.domain, "high", None)
        for v in series.tolist():
            if not _is_timestamp(v):
                out.append(v)
                continue
            ns = pd.Timestamp(v).value
            if instants is not None:
                out.append(instants.get(ns, v))
                continue
            found = v
            if low is not None and high is not None:
                for unit in (10**9, 10**6, 10**3, 1):
                    raw = ns / unit if self.type == "float" else ns // unit
                    if (self.type == "float" or ns % unit == 0) and raw > _JSON_MIN_STAMP \
                            and low <= raw <= high:
                        found = raw
                        break
            out.append(found)
        return pd.Series(out, dtype=object)

    def decode(self, codes: np.ndarray, rs: Any = None) -> list[Any]:
        """Values for cell codes (null cell → None); numeric bins sample inside the bin with ``rs``."""
        codes = np.asarray(codes, dtype=np.int64)
        if not self.nullable:
            return self.domain.decode_many(codes, rs)
        out: list[Any] = [None] * codes.size
        keep = np.flatnonzero(codes != self.domain.size)
        if keep.size:
            for i, v in zip(keep.tolist(), self.domain.decode_many(codes[keep], rs)):
                out[i] = v
        return out

    def to_spec(self) -> dict[str, Any]:
        """Declarative form."""
        spec: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "domain": self.domain.to_spec(),
            "nullable": self.nullable,
            "null_values": list(self.null_values),
            "on_out_of_domain": self.on_out_of_domain,
        }
        if self.tolerance is not None:
            spec["open"] = {"tolerance": self.tolerance}
        if not self.strip_whitespace:
            spec["strip_whitespace"] = False
        if self.normalize is not None and not self.normalize.is_identity:
            spec["normalize"] = self.normalize.to_spec()
        return spec


def _declared_bounds(domain: Domain) -> str:
    """`` [17, 99]`` for an integer, float or datetime domain, else ``""``: an out-of-domain
    reason names the declared (public) range to compare the value with (H87: ``value 150 is
    outside the declared integer domain`` sent the user to the schema file)."""
    spec = domain.to_spec()
    low, high = spec.get("low", spec.get("start")), spec.get("high", spec.get("end"))
    return "" if low is None or high is None else f" [{low}, {high}]"


def _way_out(domain: Domain) -> str:
    """How a categorical column keeps a value it does not declare (the schema's catch-all cell),
    for its out-of-domain reason; ``""`` for other domains. H87: a new category gave dead letters
    and no way to keep such rows."""
    if not isinstance(domain, CategoricalDomain):
        return ""
    if domain.other is not None:
        return (f" (to count such values in its catch-all {domain.other!r} instead: "
                "on_out_of_domain: other)")
    return (" (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and "
            "on_out_of_domain: other; docs/schema-format.md)")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class EncodedBatch:
    """A columnar batch of encoded records: ``codes[row, column]`` are cell indices.

    ``pids`` holds the privacy id of each row (strings) when the schema names a privacy-id
    column, else ``None``. Batches are what flows between beamsynth steps (thousands of rows per
    element), never one Python object per row.
    """

    codes: np.ndarray
    pids: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle ``codes`` compactly (see :func:`_pack_codes`); unpickling restores the dtype.

        Beam encodes batches with ``FastPrimitivesCoder``, which falls back to ``pickle`` for this
        type, so this is the wire form in ``Create`` payloads, shuffles, side inputs and
        multi-process transfers. ``pids`` is pickled as is.
        """
        return (_unpack_batch, (_pack_codes(self.codes), self.pids))

    def __copy__(self) -> EncodedBatch:
        """A shallow copy sharing ``codes`` and ``pids`` (``__reduce__`` would copy them)."""
        return EncodedBatch(self.codes, self.pids)


_NARROW = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32))


def _pack_codes(codes: Any) -> tuple[Any, ...]:
    """Exact, compact serialized form of a code array: ``(dtype, shape, offset, narrow, bytes)``.

    Integer codes are stored C-contiguous in the narrowest unsigned dtype (uint8/16/32) that holds
    ``codes - offset``, where ``offset`` is the minimum if it is negative (sentinels such as
    ``OUT_OF_DOMAIN``) else 0; one-byte codes and 64-bit codes spanning 2**32 or more are stored
    as their own bytes. The dtype string keeps the byte order (numpy's own pickling drops it below
    protocol 5). Anything else (non-integer dtypes, non-arrays) is kept as is: ``(codes,)``.
    """
    if not isinstance(codes, np.ndarray) or codes.dtype.kind not in "iu":
        return (codes,)
    offset, narrow = 0, codes.dtype
    if codes.size and codes.dtype.itemsize > 1:
        lo, hi = int(codes.min()), int(codes.max())
        fits = [d for d in _NARROW if hi - min(lo, 0) <= np.iinfo(d).max]
        if fits:
            offset, narrow = min(lo, 0), fits[0]
    shifted = codes if offset == 0 else codes.astype(np.int64) - offset  # int64: no overflow
    return (codes.dtype.str, codes.shape, offset, narrow.str, shifted.astype(narrow, copy=False).tobytes())


def _unpack_codes(packed: tuple[Any, ...]) -> Any:
    """Inverse of :func:`_pack_codes`: the original values in the original dtype (a fresh array)."""
    if len(packed) == 1:
        return packed[0]
    dtype, shape, offset, narrow, data = packed
    small = np.frombuffer(data, dtype=narrow).reshape(shape)
    if offset == 0:
        return small.astype(dtype)
    return (small.astype(np.int64) + offset).astype(dtype)


def _unpack_batch(packed: tuple[Any, ...], pids: Any) -> EncodedBatch:
    return EncodedBatch(_unpack_codes(packed), pids)


@dataclass(frozen=True)
class Schema:
    """A declared record schema (see the module docstring for the file format)."""

    name: str
    columns: tuple[Column, ...]
    privacy_id: str | None = None
    extra_columns: str = "ignore"
    description: str = ""
    source: str | None = field(default=None, compare=False)
    target: str | None = None  # declared prediction target (public; PrivBayes' small-input star)
    privacy_ids: str = "rounded"  # ID_MODES: how ids beyond 2**53 are read (H71)

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if self.privacy_ids not in ID_MODES:
            raise SchemaError(
                f"{self._where()}: privacy_ids ({self.privacy_ids!r}) must be one of "
                f"{list(ID_MODES)}: 'rounded' (default) reads an id beyond 2**53 as its nearest "
                "float, as a pandas reader may; 'exact' keeps its digits (read the id column as "
                "text: ReadFromCsv(path, dtype={'pid': str}), csv.DictReader)")
        if not names:
            raise SchemaError(f"{self._where()}: a schema needs at least one column")
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise SchemaError(f"{self._where()}: duplicate column names {dups}")
        if self.privacy_id is not None and self.privacy_id in names:
            raise SchemaError(
                f"{self._where()}: privacy_id column {self.privacy_id!r} must not also be a "
                "synthesized column"
            )
        if self.extra_columns not in ("ignore", "reject"):
            raise SchemaError(
                f"{self._where()}: extra_columns ({self.extra_columns!r}) must be ignore or reject"
            )
        if self.target is not None and (not isinstance(self.target, str)
                                        or self.target not in names or len(names) < 2):
            raise SchemaError(
                f"{self._where()}: target ({self.target!r}) must name one of the declared "
                f"columns {names}" + (" and needs another column" if len(names) < 2 else "")
            )

    def _where(self) -> str:
        return f"schema {self.source or self.name!r}"

    @property
    def names(self) -> list[str]:
        """Column names in order."""
        return [c.name for c in self.columns]

    @property
    def shape(self) -> tuple[int, ...]:
        """Cells per column."""
        return tuple(c.cells for c in self.columns)

    def column(self, name: str) -> Column:
        """The column called ``name``."""
        for c in self.columns:
            if c.name == name:
                return c
        close = self.nearest_name(name)  # schema.select(["marital_status"]): the declared name
        hint = f"did you mean {close!r}?; " if close else ""
        raise KeyError(f"{self._where()} has no column {name!r} ({hint}columns: {self.names})")

    def nearest_name(self, name: Any) -> str | None:
        """The declared column ``name`` most likely means: the same name in another case or as
        its field name (``native_country`` for ``native-country``, what output rows and
        ``job.private`` use), else a close spelling; ``None`` if there is none."""
        if not isinstance(name, str):
            return None
        same = [d for d in self.names if name.lower() in (d.lower(), avro_field_name(d).lower())]
        close = same or difflib.get_close_matches(name, self.names, n=1, cutoff=0.75)
        return close[0] if close else None

    def index(self, name: str) -> int:
        """Position of column ``name``."""
        return self.names.index(self.column(name).name)

    def select(self, names: Sequence[str]) -> Schema:
        """A schema with only the named columns (same privacy id)."""
        if isinstance(names, str):  # else its letters would be looked up as column names
            raise TypeError(f"select takes a list of column names, e.g. [{names!r}], not the "
                            f"string {names!r}")
        return Schema(
            name=self.name,
            columns=tuple(self.column(n) for n in names),
            privacy_id=self.privacy_id,
            extra_columns=self.extra_columns,
            description=self.description,
            source=self.source,
            target=self.target if self.target in names and len(names) > 1 else None,
            privacy_ids=self.privacy_ids,
        )

    def to_spec(self) -> dict[str, Any]:
        """Declarative form (what a schema file holds); ``target`` and ``privacy_ids: exact``
        only when declared (so a schema without them keeps its fingerprint)."""
        return {
            "name": self.name,
            "description": self.description,
            "privacy_id": self.privacy_id,
            "extra_columns": self.extra_columns,
            **({} if self.target is None else {"target": self.target}),
            **({} if self.privacy_ids == "rounded" else {"privacy_ids": self.privacy_ids}),
            "columns": [c.to_spec() for c in self.columns],
        }

    def fingerprint(self) -> str:
        """SHA-256 of the canonical JSON form (recorded in manifests)."""
        blob = json.dumps(self.to_spec(), sort_keys=True, default=str).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()

    # -- encoding ---------------------------------------------------------------------------
    def check_header(self, header: Sequence[str]) -> None:
        """Raise :class:`SchemaError` if the input header lacks declared columns (or has extras
        under ``extra_columns: reject``)."""
        have = list(header)
        missing = [n for n in self.names if n not in have]
        if self.privacy_id is not None and self.privacy_id not in have:
            missing.append(self.privacy_id)
        if missing:
            raise SchemaError(
                f"input header lacks declared column(s) {missing}; header is {have}"
            )
        if self.extra_columns == "reject":
            extra = [h for h in have if h not in self.names and h != self.privacy_id]
            if extra:
                raise SchemaError(
                    f"input has undeclared column(s) {extra} and the schema says "
                    "extra_columns: reject"
                )
        dups = sorted({h for h in have if have.count(h) > 1 and (h in self.names or h == self.privacy_id)})
        if dups:
            raise SchemaError(f"input header repeats declared column(s) {dups}")

    def encode_columns(
        self, columns: Mapping[str, Sequence[Any]], n_rows: int
    ) -> tuple[EncodedBatch, list[tuple[int, str]]]:
        """Encode raw column values; returns the batch of good rows and (row, reason) for bad rows."""
        codes = np.empty((n_rows, len(self.columns)), dtype=np.int64)
        reasons: dict[int, str] = {}
        for j, col in enumerate(self.columns):
            c, why = col.encode(columns[col.name])
            codes[:, j] = c
            for i, r in why.items():
                reasons.setdefault(i, r)
        pids = None
        if self.privacy_id is not None:
            pids, why = encode_privacy_ids(list(columns[self.privacy_id]), self.privacy_id,
                                           exact=self.privacy_ids == "exact")
            for i, r in why.items():
                reasons.setdefault(i, r)
        bad = sorted(reasons.items())
        if bad:
            keep = np.ones(n_rows, dtype=bool)
            keep[[i for i, _ in bad]] = False
            codes = codes[keep]
            if pids is not None:
                pids = pids[keep]
        dtype = np.int32 if all(c.cells < 2**31 for c in self.columns) else np.int64
        return EncodedBatch(codes.astype(dtype, copy=False), pids), bad

    def decode_rows(self, codes: np.ndarray, rs: Any = None) -> dict[str, list[Any]]:
        """Columns of values for a batch of cell codes."""
        return {c.name: c.decode(codes[:, j], rs) for j, c in enumerate(self.columns)}

    # -- Avro -------------------------------------------------------------------------------
    def avro_schema(self) -> dict[str, Any]:
        """Avro record schema for synthetic output records (nullable columns as unions)."""
        fields = []
        for c in self.columns:
            t = {
                "categorical": "string",
                "string": "string",
                "text": "string",
                "datetime": "string",
                "integer": "long",
                "float": "double",
            }[c.type]
            fields.append(
                {"name": avro_field_name(c.name), "type": ["null", t] if c.nullable else t}
            )
        return {
            "type": "record",
            "name": avro_field_name(self.name or "record"),
            "namespace": "beamsynth.synthetic",
            "fields": fields,
        }


_NUMBER_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")  # ASCII, as pandas
_BOOL_TEXT = {"true": True, "false": False}  # pandas' spellings: true, True, TRUE (and False)


_EXACT_INT = 2**53  # beyond it a float64 (a pandas column with a blank) loses an int's last digits
_INF_TEXT = re.compile(r"[+-]?inf(inity)?", re.IGNORECASE)  # what pandas' CSV reader reads as inf


def _number_value(value: Any) -> int | float | None:
    """An int/float value (not bool, not NaN) as an int if whole, else a float; else ``None``.

    An int beyond 2**53 is the int of its nearest float (9007199254740993 -> ...992): a pandas
    reader gives the field as that int, as text, or, in a column with a blank, as the float,
    so only the float's value is the same whatever the other rows (rule 6; H66)."""
    if isinstance(value, (bool, np.bool_, np.timedelta64)) or not isinstance(
            value, (int, float, np.integer, np.floating)):  # np.timedelta64 is an np.integer
        return None
    if isinstance(value, (int, np.integer)):
        n = int(value)
        if abs(n) <= _EXACT_INT:
            return n
        try:
            return int(float(n))
        except OverflowError:  # no float: pandas keeps such a field as text in every chunk
            return None
    v = float(value)
    if np.isnan(v):
        return None
    return (int(v) if v.is_integer() else v) if np.isfinite(v) else v


def _value_key(value: Any) -> tuple[str, Any] | None:
    """``("n", number)`` or ``("b", bool)`` for a number, a boolean, or text a pandas reader parses
    as one (``"01"``, ``" 1"``, ``"1.0"``, ``"1e0"``, ``"TRUE"``); else ``None``."""
    if isinstance(value, (bool, np.bool_)):
        return ("b", bool(value))
    if isinstance(value, str):
        text = value.strip()
        if text in ("true", "True", "TRUE", "false", "False", "FALSE"):
            return ("b", _BOOL_TEXT[text.lower()])
        if _INF_TEXT.fullmatch(text):  # 'inf', 'Infinity', '-INF': pandas' float infinity
            return ("n", float(text))
        if not _NUMBER_TEXT.fullmatch(text):
            return None
        value = int(text) if text.lstrip("+-").isdigit() else float(text)
        if isinstance(value, float) and not np.isfinite(value):
            return None  # '1e400': pandas keeps it as text in every chunk
    number = _number_value(value)
    return None if number is None else ("n", number)


def _declared_numbers(values: Sequence[str]) -> dict[tuple[str, Any], int]:
    """``{value key: index}`` of the declared categories written as one number or boolean ("01",
    "1.50", "true"); a value two categories spell goes to the one written as Python writes it
    ("1" of "1" and "01", "True" of "true" and "True"), else is left out (declared values only:
    public)."""
    out = {}
    for key, ix in _spellings_by_value(values).items():
        plain = [i for i in ix if values[i] == str(key[1])]
        if len(ix) == 1 or len(plain) == 1:
            out[key] = ix[0] if len(ix) == 1 else plain[0]
    return out


def _spellings_by_value(values: Sequence[str]) -> dict[tuple[str, Any], list[int]]:
    """``{value key: [indices]}`` of the declared categories written as one number or boolean
    (without surrounding spaces), e.g. ``"1"`` and ``"01"`` under ``("n", 1)``."""
    found: dict[tuple[str, Any], list[int]] = {}
    for i, text in enumerate(values):
        key = _value_key(text) if text == text.strip() else None
        if key is not None:
            found.setdefault(key, []).append(i)
    return found


def _pandas_date_name(name: str) -> bool:
    """Whether pandas' JSON reader converts a column of this name (or its Avro-safe field name)
    to timestamps by default (``keep_default_dates``: ``*_at``, ``*_time``, ``timestamp*``,
    ``modified``, ``date``, ``datetime``)."""
    return any(n.endswith(("_at", "_time")) or n.startswith("timestamp")
               or n in ("modified", "date", "datetime")
               for n in (name.lower(), avro_field_name(name).lower()))


def _is_timestamp(value: Any) -> bool:
    """A pandas/NumPy/Python datetime (not NaT), as pandas' JSON reader gives a date column."""
    return isinstance(value, (pd.Timestamp, np.datetime64, datetime.datetime)) and not pd.isna(value)


_JSON_MIN_STAMP = 31_536_000  # pandas' JSON reader converts numbers above it only
_CLOCK_TIME = re.compile(r"(?:[0-9]|[01][0-9]|2[0-3]):[0-5][0-9]")
"""Text pandas takes for a time of day (its ``does_string_look_like_time``: ``H:MM`` or ``HH:MM``
at the very start, hour <= 23): parsed with today's date as the default for every missing part."""


@functools.lru_cache(maxsize=4096)
def _json_reader_stamp(text: str) -> Any:
    """The timestamp pandas' JSON reader gives ``text`` (no number) in a date-named column, else
    ``None``. The reader converts a chunk only when all its values parse, each value alone, by
    ``to_datetime(..., unit=u)`` for u in s, ms, us, ns: text that is no number fails the first
    three and is parsed in the last, as here (equal to ``pd.read_json`` on one record for 20
    spellings: ISO, tz offsets, 'Jan 2020', '01/02/2020', words; 0.15 ms instead of 3.6 ms)."""
    value = _machine_free_instant(text)
    return value if _is_timestamp(value) else None


def _machine_free_instant(text: str, *, reader: bool = True) -> Any:
    """``pd.to_datetime`` of one text as pandas' JSON reader parses it (``unit='ns'``; a declared
    category, ``reader=False``: as ``pd.to_datetime(text)``), or
    ``None`` where that depends on the machine: the wall clock (``now``, ``today``, a time of day,
    whose missing date parts are today's: "12:30", "12:30 Jan 2020") or its time zone (a zone
    name: "2020-01-01 12:30 CET" was 12:30 naive on a UTC machine, 12:30+09:00 for JST on a
    Tokyo one, and raised AttributeError, failing the run, where the name is the local zone's;
    H74), and any failure."""
    import warnings

    if text.strip().lower() in ("now", "today") or _CLOCK_TIME.match(text):
        return None
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            value = (pd.to_datetime([text], errors="raise", unit="ns")[0] if reader
                     else pd.to_datetime(text))
    except Exception:  # noqa: BLE001 - no instant (a local zone name raised AttributeError)
        return None
    if any("timezone" in str(w.message).lower() for w in seen):  # a zone name: the machine's
        return None
    return value


@functools.lru_cache(maxsize=64)
def _declared_instants(values: tuple[str, ...]) -> dict[int, str]:
    """``{epoch ns: category}`` of the declared categories pandas parses as one instant (each
    instant spelled by one category only; declared values only: public)."""
    found: dict[int, list[str]] = {}
    for text in values:
        value = _machine_free_instant(text, reader=False)  # none: wall clock or zone name (H74)
        if value is None or not _is_timestamp(value):
            continue
        found.setdefault(pd.Timestamp(value).value, []).append(text)
    return {ns: texts[0] for ns, texts in found.items() if len(texts) == 1}


def ambiguous_values(schema: Schema) -> dict[str, list[list[str]]]:
    """``{column: [[spellings], ...]}``: declared categories spelling one number or boolean
    (``"1"`` and ``"01"``), which a pandas reader (``beam.io.ReadFromCsv``, ``ReadFromJson``)
    gives as one value unless another value of its chunk is not one (declared values only)."""
    out: dict[str, list[list[str]]] = {}
    for col in schema.columns:
        if isinstance(col.domain, CategoricalDomain):
            values = col.domain.values
            same = [[values[i] for i in ix]
                    for ix in _spellings_by_value(values).values() if len(ix) > 1]
            if same:
                out[col.name] = same
    return out


def _number_alphabet(alphabet: str) -> bool:
    """Whether an open string's alphabet spells numbers only (digits, with signs, point or
    exponent): values of such a column are numbers to a pandas reader in a chunk without a word."""
    return any(c.isdigit() for c in alphabet) and all(c in "0123456789+-.eE " for c in alphabet)


_RESPELLED = (
    "an open string over digits: a pandas reader gives number-looking text ('02134', '1.0') as a "
    "number unless another value of the chunk is none, and the number's text ('2134', '1') is "
    "another string, so one record could respell others; read it as text "
    "(ReadFromCsv(path, dtype={...: str}))")


def reader_caveats(schema: Schema, keys: Mapping[str, Any] | None = None) -> dict[str, str]:
    """``{column: why}`` for declared columns a pandas reader (``beam.io.ReadFromCsv``,
    ``ReadFromJson``, Beam YAML's) may give differently depending on the other values of its
    chunk in a way no encoder can undo (declared structure only: public; H66): columns named
    like a date (not ``datetime``), and open strings and text keys (``keys``: name -> codec with
    ``column``/``alphabet``) whose alphabet spells numbers only. See ``ambiguous_values`` for
    categories."""
    out: dict[str, str] = {}
    for col in schema.columns:
        if col.type != "datetime" and _pandas_date_name(col.name):
            out[col.name] = (
                "named like a date: pandas' JSON reader (ReadFromJson) makes it timestamps when "
                "every value of the chunk parses as one, and then reads every epoch number in the "
                "unit its largest value allows (1.6e9 s and 1.6e12 ms are one instant) and some "
                "text only beside dates ('2020'), so one record could move or drop others; read "
                "it with ReadFromJson(path, lines=True, convert_dates=False, "
                "keep_default_dates=False), declare it datetime, or rename it")
        elif col.type in ("string", "text") and _number_alphabet(getattr(col.domain, "alphabet", "")):
            out[col.name] = _RESPELLED
    for codec in (keys or {}).values():
        if _number_alphabet(getattr(codec, "alphabet", "")) and getattr(codec, "column", None):
            out.setdefault(codec.column, _RESPELLED.replace("an open string", "a text key"))
    return out


def privacy_id_text(value: Any) -> str:
    """A privacy id as text, one spelling per person: 7, "7" and 7.0 (a JSON or pandas float)
    are the id "7", so the contribution bound holds per person, not per spelling. So are "07",
    " 7" and "7.0": a pandas reader gives them as the number 7 in a file (or chunk) whose ids are
    all numbers and as text beside an id that is none, so one person's records in two files
    were two persons (rule 5; H55). An int beyond 2**53 is its nearest float's ("9007199254740993"
    is "9007199254740992"): in a column with a blank a pandas reader gives every id as a float,
    which merged such persons only then; every spelling pandas reads as infinity is "inf" and
    as a boolean ("true", "TRUE") is "True" or "False" (rule 5; H66). Other text is kept as it is.
    A schema declaring ``privacy_ids: exact`` keeps the digits instead (:func:`encode_privacy_ids`;
    H71)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return str(int(value) if abs(int(value)) <= _EXACT_INT else _number_value(value) or value)
    if isinstance(value, str) and value and value[0] in " +-.0123456789iI" and (
            value[0] in " +-.0iI" or value[-1] == " " or "." in value or "e" in value.lower()
            or len(value) > 15):
        key = _value_key(value)  # number-looking text not already canonical ("7": as it is)
        if key is not None and key[0] == "n":
            return str(key[1])
    if isinstance(value, str) and 4 <= len(value.strip()) <= 5 and value.strip() in (
            "true", "TRUE", "false", "FALSE", "True", "False"):
        return str(_BOOL_TEXT[value.strip().lower()])  # pandas' booleans: "True", as True (H66)
    if isinstance(value, np.bool_):
        return str(bool(value))
    return str(value)


ID_MODES = ("rounded", "exact")
"""How a schema's ``privacy_ids`` reads an id beyond 2**53 (H71): ``rounded`` (the default) as
its nearest float's value, the same whatever a pandas reader made of it; ``exact`` digit for digit,
for readers that keep the digits (the CLI's, ``csv.DictReader``, ``ReadFromCsv(path,
dtype={'pid': str})``)."""

_EXACT_INT_TEXT = str(2**53)  # 16 digits: "9007199254740992"


def _exact_id_text(value: Any) -> str | None:
    """A privacy id as text with every digit kept (``privacy_ids: exact``), ``None`` for a float
    of 2**53 or more (its last digits may be lost: 2**53 + 1 reads 2**53). Below 2**53 it is
    :func:`privacy_id_text`'s text; beyond, an int is its own digits and number text its exact
    value ("9007199254740993", "+09007199254740993", "9007199254740993.0" are one person)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return None if np.isfinite(value) and abs(float(value)) >= _EXACT_INT else privacy_id_text(value)
    if isinstance(value, str) and (len(value) > 15 or "e" in value or "E" in value):
        text = value.strip()
        if _NUMBER_TEXT.fullmatch(text):
            exact = decimal.Decimal(text)
            if abs(exact) > _EXACT_INT and abs(exact.adjusted()) < 1000:
                whole = exact == exact.to_integral_value()
                return str(int(exact)) if whole else format(exact.normalize(), "f")
    return privacy_id_text(value)


def _exact_float_reason(column: str, value: Any) -> str:
    return (f"privacy id column {column!r}: {_short(value)} is a float of 2**53 or more, whose "
            "last digits may be lost (another person's id may read the same), and the schema says "
            "privacy_ids: exact; read the column as text (ReadFromCsv(path, dtype={"
            f"{column!r}: str}}), csv.DictReader) or declare privacy_ids: rounded")


def encode_privacy_ids(values: Sequence[Any], column: str, *, exact: bool = False,
                       nan_is_empty: bool = False) -> tuple[np.ndarray, dict[int, str]]:
    """``(ids as text, {row: reason})`` of a privacy id column, each value alone: an empty id
    (``None``, blank text; NaN if ``nan_is_empty``) is a reason, else :func:`privacy_id_text`
    (``exact=False``) or its digit-keeping form (``exact=True``: ``privacy_ids: exact``, where a
    float beyond 2**53 is a reason naming the read option). Rejected rows' ids are ``""``."""
    pids = np.empty(len(values), dtype=object)
    reasons: dict[int, str] = {}
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()) or (
                nan_is_empty and isinstance(v, float) and v != v):
            reasons[i] = f"privacy id column {column!r} is empty"
            pids[i] = ""
        elif not exact:
            pids[i] = privacy_id_text(v)
        else:
            text = _exact_id_text(v)
            if text is None:
                reasons[i] = _exact_float_reason(column, v)
            pids[i] = text or ""
    return pids, reasons


def count_rounded_ids(pids: Any) -> int:
    """How many ids of an encoded batch (:func:`privacy_id_text`'s texts) are 2**53 or beyond, each
    read as its nearest float's value under ``privacy_ids: rounded`` (persons whose ids share a
    float are one person there). Each id alone: the count never depends on another row."""
    if pids is None:
        return 0
    return sum(1 for p in pids if len(p) > 15 and _is_rounded_text(p))


def _is_rounded_text(text: str) -> bool:
    """Whether ``text`` is an integer of 2**53 or more in absolute value (optional sign, 16 or
    more ASCII digits, ``abs(int(text)) >= 2**53``) without a regex or ``int``: the digits without
    leading zeros compared as text (at one length, text order is number order)."""
    digits = text[1:] if text[0] in "+-" else text
    if len(digits) < 16 or not (digits.isascii() and digits.isdigit()):
        return False
    digits = digits.lstrip("0")
    return len(digits) > 16 or (len(digits) == 16 and digits >= _EXACT_INT_TEXT)


def avro_field_name(name: str) -> str:
    """The Avro-safe form of a column name (letters, digits, underscore; no leading digit)."""
    out = "".join(ch if (ch.isalnum() or ch == "_") else "_" for ch in name)
    return out if out and not out[0].isdigit() else f"_{out}"


# -- loading ---------------------------------------------------------------------------------------
_COLUMN_KEYS = {"name", "type", "domain", "nullable", "null_values", "on_out_of_domain", "open",
                "description", "strip_whitespace", "normalize"}
_SCHEMA_KEYS = {"name", "description", "privacy_id", "privacy_ids", "extra_columns", "columns",
                "target"}


def bundled_schema_path(name: str) -> Path | None:
    """Path of a bundled example schema (``adult``), or None."""
    for ext in (".yaml", ".yml", ".json"):
        p = _EXAMPLES / f"{name}{ext}"
        if p.is_file():
            return p
    return None


def load_schema(source: str | Path | Mapping[str, Any]) -> Schema:
    """Load and validate a schema from a YAML/JSON file, a bundled name (``adult``) or a mapping."""
    if isinstance(source, Mapping):
        return _schema_from_dict(dict(source), where="schema", base_dir=None)
    path = Path(source)
    if not path.exists():
        bundled = bundled_schema_path(str(source))
        if bundled is None:
            raise SchemaError(
                f"schema {str(source)!r}: no such file, and not a bundled schema name "
                f"(bundled: {sorted(p.stem for p in _EXAMPLES.glob('*.yaml'))})"
            )
        path = bundled
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SchemaError(f"schema {str(path)!r}: cannot read: {exc}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SchemaError(f"schema {str(path)!r}: not valid YAML/JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise SchemaError(f"schema {str(path)!r}: the top level must be a mapping")
    return _schema_from_dict(data, where=f"schema {str(path)!r}", base_dir=path.parent, source=str(path))


def _schema_from_dict(
    data: dict[str, Any], *, where: str, base_dir: Path | None, source: str | None = None
) -> Schema:
    unknown = set(data) - _SCHEMA_KEYS
    if unknown:
        raise SchemaError(f"{where}: unknown top-level key(s) {sorted(unknown)} (allowed: {sorted(_SCHEMA_KEYS)})")
    cols = data.get("columns")
    if not isinstance(cols, list) or not cols:
        raise SchemaError(f"{where}: 'columns' must be a non-empty list")
    built = [
        _column_from_dict(c, where=f"{where}, column #{i + 1}", base_dir=base_dir)
        for i, c in enumerate(cols)
    ]
    pid = data.get("privacy_id")
    if pid is not None and not isinstance(pid, str):
        raise SchemaError(f"{where}: privacy_id must be a column name or null, got {pid!r}")
    try:
        return Schema(
            name=str(data.get("name") or (Path(source).stem if source else "schema")),
            columns=tuple(built),
            privacy_id=pid,
            extra_columns=str(data.get("extra_columns", "ignore")),
            description=str(data.get("description") or ""),
            source=source,
            target=data.get("target"),
            privacy_ids=data.get("privacy_ids", "rounded"),
        )
    except SchemaError:
        raise


def _column_from_dict(c: Any, *, where: str, base_dir: Path | None) -> Column:
    if not isinstance(c, dict):
        raise SchemaError(f"{where}: a column must be a mapping, got {c!r}")
    name = c.get("name")
    if not isinstance(name, str) or not name:
        raise SchemaError(f"{where}: 'name' must be a non-empty string, got {name!r}")
    where = f"{where.rsplit(', column', 1)[0]}, column {name!r}"
    unknown = set(c) - _COLUMN_KEYS
    if unknown:
        raise SchemaError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_COLUMN_KEYS)})")
    ctype = c.get("type")
    if ctype not in COLUMN_TYPES:
        raise SchemaError(f"{where}: type ({ctype!r}) must be one of {list(COLUMN_TYPES)}")
    if "domain" not in c:
        raise SchemaError(
            f"{where}: no declared domain; every column needs one (domains are never read "
            "from the data)"
        )
    try:
        domain = domain_from_spec(c["domain"], base_dir=base_dir, where="domain")
    except ValueError as exc:
        raise SchemaError(f"{where}: {exc}") from exc
    if domain.kind not in _TYPE_KINDS[ctype]:
        raise SchemaError(
            f"{where}: a {ctype} column cannot have a {domain.kind} domain "
            f"(allowed: {sorted(_TYPE_KINDS[ctype])})"
        )
    nullable = c.get("nullable", False)
    if not isinstance(nullable, bool):
        raise SchemaError(f"{where}: nullable must be true or false, got {nullable!r}")
    null_values = c.get("null_values", [""])
    if not isinstance(null_values, list) or not all(isinstance(v, str) for v in null_values):
        raise SchemaError(f"{where}: null_values must be a list of strings, got {null_values!r}")
    ood = c.get("on_out_of_domain", "reject")
    if ood not in ("reject", "other"):
        raise SchemaError(f"{where}: on_out_of_domain ({ood!r}) must be reject or other")
    if ood == "other" and not (isinstance(domain, CategoricalDomain) and domain.other is not None):
        raise SchemaError(
            f"{where}: on_out_of_domain: other needs a categorical domain with an 'other' label"
        )
    tolerance = None
    if "open" in c:
        spec = c["open"]
        if not isinstance(spec, dict) or set(spec) != {"tolerance"}:
            raise SchemaError(f"{where}: open must be a mapping {{tolerance: ρ}}, got {spec!r}")
        tolerance = spec["tolerance"]
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
            0 < tolerance < 1
        ):
            raise SchemaError(f"{where}: open.tolerance ({tolerance!r}) must be in (0, 1)")
        tolerance = float(tolerance)
        if ctype in ("integer", "float", "datetime"):
            raise SchemaError(f"{where}: only categorical/string/text columns can be open")
    strip = c.get("strip_whitespace", True)
    if not isinstance(strip, bool):
        raise SchemaError(f"{where}: strip_whitespace must be true or false, got {strip!r}")
    return Column(
        name=name,
        type=ctype,
        domain=domain,
        nullable=nullable,
        null_values=tuple(null_values),
        on_out_of_domain=ood,
        tolerance=tolerance,
        strip_whitespace=strip,
        normalize=_normalization_from(c.get("normalize"), ctype=ctype, where=where),
    )


_NORMALIZE_KEYS = ("case", "unicode", "strip")


def _normalization_from(spec: Any, *, ctype: str, where: str) -> Normalization | None:
    """The ``normalize:`` option of a column (``None`` when absent)."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise SchemaError(
            f"{where}: normalize must be a mapping {{case: lower|upper|fold|none, "
            f"unicode: NFC|NFKC|NFD|NFKD|none, strip: true|false}}, got {spec!r}"
        )
    unknown = sorted(set(spec) - set(_NORMALIZE_KEYS))
    if unknown:
        raise SchemaError(f"{where}: normalize has unknown key(s) {unknown} (allowed: {list(_NORMALIZE_KEYS)})")
    if ctype not in ("categorical", "string", "text"):
        raise SchemaError(
            f"{where}: normalize applies to categorical/string/text columns only, not {ctype!r}"
        )
    try:
        return Normalization(case=spec.get("case", "none"), unicode=spec.get("unicode", "none"),
                             strip=spec.get("strip", False))
    except ValueError as exc:
        raise SchemaError(f"{where}: {exc}") from exc
