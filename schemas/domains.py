"""Declared domains: finite sets of cells that are public, immutable and never read off the data.

Every domain knows its exact size (a Python int, possibly 10^10 or more), encodes a value to a
cell index (or :data:`OUT_OF_DOMAIN`), decodes a cell index back to a value, and samples cells
uniformly **without enumerating** itself. Numeric domains map values to declared bins; decoding a
bin for synthesis draws a value inside the bin.

Codes used by the vectorized encoders (``encode_many``):

* ``>= 0`` — the cell index;
* :data:`OUT_OF_DOMAIN` (-1) — a well-formed value outside the declared domain;
* :data:`MALFORMED` (-2) — a value that cannot be parsed as the column's type.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:  # annotations only: schemas/ never imports transforms/ at run time
    from beamsynth.transforms.noise import RandomSource

__all__ = [
    "MALFORMED",
    "OUT_OF_DOMAIN",
    "CategoricalDomain",
    "DatetimeDomain",
    "Domain",
    "FloatDomain",
    "IntegerDomain",
    "ProductDomain",
    "StringDomain",
    "UnionDomain",
    "domain_from_spec",
]

OUT_OF_DOMAIN = -1
MALFORMED = -2

_ENUMERATION_LIMIT = 5_000_000  # domains up to this size may be materialized as arrays


class Domain(ABC):
    """A finite, declared set of cells."""

    kind: str = "abstract"

    @property
    @abstractmethod
    def size(self) -> int:
        """Exact number of cells (Python int)."""

    @abstractmethod
    def encode(self, value: Any) -> int:
        """Cell index of ``value``; OUT_OF_DOMAIN or MALFORMED when it has none."""

    @abstractmethod
    def decode(self, index: int) -> Any:
        """A representative value of cell ``index`` (the category, the bin's lower edge, ...)."""

    @abstractmethod
    def to_spec(self) -> dict[str, Any]:
        """The declarative form (as in a schema file)."""

    def encode_many(self, values: Sequence[Any]) -> np.ndarray:
        """Vectorized :meth:`encode` → int64 array (override for speed)."""
        return np.fromiter((self.encode(v) for v in values), dtype=np.int64, count=len(values))

    def decode_many(self, indices: np.ndarray, rs: RandomSource | None = None) -> list[Any]:
        """Values for cell indices; with ``rs``, numeric bins draw a uniform value inside the bin."""
        return [self.decode(int(i)) for i in np.asarray(indices).tolist()]

    @property
    def enumerable(self) -> bool:
        """Whether the domain is small enough to hold one array entry per cell."""
        return self.size <= _ENUMERATION_LIMIT

    def __contains__(self, value: Any) -> bool:
        return self.encode(value) >= 0

    def sample_distinct(
        self, rs: RandomSource, count: int, *, exclude: Iterable[int] = ()
    ) -> list[int]:
        """``count`` distinct cell indices drawn uniformly from the cells not in ``exclude``.

        Never enumerates the domain: draws uniform indices and rejects excluded or repeated ones.
        When the excluded and chosen cells are most of a small domain it switches to a shuffled
        complement (exact either way).
        """
        excluded = set(int(i) for i in exclude)
        n = self.size
        available = n - len(excluded)
        if count < 0:
            raise ValueError(f"count ({count}) must be >= 0")
        if count > available:
            raise ValueError(
                f"cannot draw {count} distinct cells from a domain of {n} with "
                f"{len(excluded)} excluded"
            )
        if count == 0:
            return []
        if n <= 4 * (len(excluded) + count) and n <= _ENUMERATION_LIMIT:
            rest = np.setdiff1d(np.arange(n, dtype=np.int64), np.fromiter(excluded, np.int64))
            keys = rs.uniform(rest.size)
            return rest[np.argsort(keys)[:count]].tolist()
        chosen: list[int] = []
        seen = set(excluded)
        while len(chosen) < count:
            need = count - len(chosen)
            if n < 2**63:
                cand = rs.integers(n, need + 8).tolist()
            else:
                cand = [rs.randbelow(n) for _ in range(need + 8)]
            for c in cand:
                if c not in seen:
                    seen.add(c)
                    chosen.append(c)
                    if len(chosen) == count:
                        break
        return chosen

    def sample_uniform(self, rs: RandomSource, count: int) -> list[int]:
        """``count`` i.i.d. uniform cell indices (with repetition), without enumeration."""
        n = self.size
        if n < 2**63:
            return rs.integers(n, count).tolist()
        return [rs.randbelow(n) for _ in range(count)]


# -- categorical ---------------------------------------------------------------------------------
class CategoricalDomain(Domain):
    """Enumerated categories (inline or from a word-list file), optionally with a catch-all cell.

    Args:
      values: the declared categories, in order; duplicates are an error.
      other: label of an extra catch-all cell (the last index) used when a column maps
        out-of-domain values to it instead of rejecting them.
      source: where the values came from (a file path), for messages and manifests.
    """

    kind = "categorical"

    def __init__(
        self, values: Sequence[str], *, other: str | None = None, source: str | None = None
    ) -> None:
        vals = [str(v) for v in values]
        if not vals and other is None:
            raise ValueError("a categorical domain needs at least one value")
        index = pd.Index(vals)
        if not index.is_unique:
            dups = index[index.duplicated()].unique().tolist()[:5]
            raise ValueError(f"duplicate categories {dups} in {source or 'the declared list'}")
        if other is not None and str(other) in set(vals):
            raise ValueError(f"catch-all label {other!r} is also a declared category")
        self._values = vals
        self._other = None if other is None else str(other)
        self._index = pd.Index(vals + ([self._other] if self._other is not None else []))
        self._source = source

    @classmethod
    def from_file(cls, path: str | Path, *, other: str | None = None) -> CategoricalDomain:
        """One category per line (UTF-8); blank lines ignored; duplicates (after strip) dropped once.

        Word lists such as ``/usr/share/dict/words`` repeat nothing, but a list that does is a
        declaration error only if the user wrote it inline; files are de-duplicated in order.
        """
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read category file {str(p)!r}: {exc}") from exc
        seen: dict[str, None] = {}
        for line in text.splitlines():
            v = line.strip()
            if v:
                seen.setdefault(v, None)
        return cls(list(seen), other=other, source=str(p))

    @property
    def values(self) -> list[str]:
        """The declared categories (without the catch-all)."""
        return list(self._values)

    @property
    def other(self) -> str | None:
        """The catch-all label, if any."""
        return self._other

    @property
    def other_index(self) -> int | None:
        """Cell index of the catch-all, if any."""
        return None if self._other is None else len(self._values)

    @property
    def size(self) -> int:
        return len(self._values) + (1 if self._other is not None else 0)

    def encode(self, value: Any) -> int:
        if value is None:
            return OUT_OF_DOMAIN
        loc = self._index.get_indexer([str(value)])[0]
        return int(loc) if loc >= 0 else OUT_OF_DOMAIN

    def encode_many(self, values: Sequence[Any]) -> np.ndarray:
        arr = values if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
        codes = self._index.get_indexer(arr).astype(np.int64)
        miss = np.flatnonzero(codes < 0)
        if miss.size:  # non-string inputs (ints from JSON/Avro) match their string form
            retry = [None if v is None else str(v) for v in arr.iloc[miss]]
            codes[miss] = self._index.get_indexer(retry)
            codes[codes < 0] = OUT_OF_DOMAIN
        return codes

    def decode(self, index: int) -> str:
        return str(self._index[int(index)])

    def decode_many(self, indices: np.ndarray, rs: RandomSource | None = None) -> list[Any]:
        return self._index.take(np.asarray(indices, dtype=np.int64)).tolist()

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"kind": "categorical"}
        if self._source and len(self._values) > 50:
            spec["values_file"] = self._source
        else:
            spec["values"] = list(self._values)
        if self._other is not None:
            spec["other"] = self._other
        return spec


# -- numeric ranges ------------------------------------------------------------------------------
def _parse_numbers(values: Sequence[Any]) -> np.ndarray:
    """Floats for raw values (NaN where unparseable), **each value judged alone** (stability: no
    value changes how another parses): text (``str``, bytes) by Arrow's C++ parser after
    trimming Unicode white space; numbers (``int``, ``float``, numpy numbers, ``Decimal``) by
    ``float()``; anything else (booleans, complex, containers, ...) is NaN, i.e. malformed."""
    s = values if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
    try:  # the common case (CSV, JSON strings): text that Arrow casts as a whole
        arr = pa.array(s, type=pa.string(), from_pandas=True)
        return pc.cast(pc.utf8_trim_whitespace(arr), pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, UnicodeError):
        pass
    arr = s.to_numpy(dtype=object)
    kind = {t: _number_kind(t) for t in set(map(type, arr))}
    kinds = np.fromiter(map(kind.__getitem__, map(type, arr)), dtype=np.int8, count=arr.size)
    out = np.full(arr.size, np.nan)
    for k, parse in ((0, _parse_text), (1, _parse_real)):
        at = np.flatnonzero(kinds == k)
        if at.size:
            out[at] = parse(arr[at])
    return out


def _number_kind(t: type) -> int:
    """0: text, 1: a number, 2: neither (NaN)."""
    if issubclass(t, (str, bytes, bytearray, memoryview)):
        return 0
    if issubclass(t, (numbers.Real, decimal.Decimal)) and not issubclass(t, (bool, np.bool_)):
        return 1  # booleans are not numbers (JSON/Avro/Parquet true/false are malformed)
    return 2


def _parse_text(arr: np.ndarray) -> np.ndarray:
    """Arrow's float parse of each string; a batch Arrow refuses (one unparseable string, a lone
    surrogate) is split until the strings that fail stand alone (NaN), so the others parse as
    they would alone."""
    try:
        a = pa.array(arr, type=pa.string(), from_pandas=True)
        return pc.cast(pc.utf8_trim_whitespace(a), pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, UnicodeError):
        # UnicodeError: strings holding lone surrogates (undecodable input bytes) are not UTF-8
        if arr.size <= 1:
            return np.full(arr.size, np.nan)
    try:  # each distinct string once
        codes, uniques = pd.factorize(arr)
    except TypeError:  # unhashable text (bytearray)
        codes, uniques = None, arr
    if uniques.size < arr.size:
        return _parse_text(np.asarray(uniques, dtype=object))[codes]
    mid = arr.size // 2
    return np.concatenate([_parse_text(arr[:mid]), _parse_text(arr[mid:])])


def _parse_real(arr: np.ndarray) -> np.ndarray:
    """``float(v)`` of each number (NaN when it has none, e.g. ``10**400``)."""
    try:
        return arr.astype(np.float64)
    except (TypeError, ValueError, OverflowError):
        out = np.full(arr.size, np.nan)
        for i, v in enumerate(arr.tolist()):
            try:
                out[i] = float(v)
            except (TypeError, ValueError, OverflowError):
                pass
        return out


def _check_edges(edges: Sequence[float], low: float, high: float, what: str) -> np.ndarray:
    e = np.asarray(list(edges), dtype=np.float64)
    if e.ndim != 1 or e.size < 2:
        raise ValueError(f"{what}: bin edges need at least two values, got {list(edges)!r}")
    if not np.all(np.isfinite(e)):
        raise ValueError(f"{what}: bin edges must be finite, got {list(edges)!r}")
    if np.any(np.diff(e) <= 0):
        raise ValueError(f"{what}: bin edges must increase strictly, got {list(edges)!r}")
    if e[0] != low or e[-1] != high:
        raise ValueError(
            f"{what}: bin edges must start at low ({low}) and end at high ({high}), "
            f"got {e[0]}..{e[-1]}"
        )
    return e


class IntegerDomain(Domain):
    """Integers in ``[low, high]`` (both inclusive), one cell per value or per declared bin.

    Args:
      low, high: the declared range.
      bins: number of equal-width bins (integer widths, the last bin may be narrower).
      edges: explicit bin edges ``low = e0 < e1 < ... < ek = high + 1``; bin i is
        ``[e_i, e_{i+1})``.
    With neither, each integer is its own cell. Decoding with a random source draws a uniform
    integer inside the bin.
    """

    kind = "integer"

    def __init__(
        self,
        *,
        low: int,
        high: int,
        bins: int | None = None,
        edges: Sequence[int] | None = None,
    ) -> None:
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (low, high)):
            raise TypeError(f"integer domain bounds must be ints, got low={low!r}, high={high!r}")
        if low > high:
            raise ValueError(f"integer domain low ({low}) must be <= high ({high})")
        if bins is not None and edges is not None:
            raise ValueError("give either bins or edges, not both")
        self.low, self.high = int(low), int(high)
        width = self.high - self.low + 1
        if edges is not None:
            e = _check_edges(edges, self.low, self.high + 1, "integer domain")
            if np.any(e != np.round(e)):
                raise ValueError(f"integer bin edges must be integers, got {list(edges)!r}")
            self._edges: np.ndarray | None = e.astype(np.int64)
        elif bins is not None:
            if not isinstance(bins, int) or bins < 1:
                raise ValueError(f"bins ({bins!r}) must be an int >= 1")
            if bins > width:
                raise ValueError(f"bins ({bins}) exceeds the number of integers in [{low}, {high}]")
            step = math.ceil(width / bins)
            e = list(range(self.low, self.high + 1, step)) + [self.high + 1]
            self._edges = np.asarray(sorted(set(e)), dtype=np.int64)
        else:
            self._edges = None
        self._bins_spec = bins

    @property
    def edges(self) -> np.ndarray | None:
        """Bin edges (``None`` when every integer is a cell)."""
        return None if self._edges is None else self._edges.copy()

    @property
    def size(self) -> int:
        if self._edges is None:
            return self.high - self.low + 1
        return int(self._edges.size - 1)

    def _to_numbers(self, values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """(float values, malformed mask)."""
        num = _parse_numbers(values)
        malformed = ~np.isfinite(num) | (num != np.round(num))
        return num, malformed

    def encode_many(self, values: Sequence[Any]) -> np.ndarray:
        num, malformed = self._to_numbers(values)
        out = np.full(num.shape, OUT_OF_DOMAIN, dtype=np.int64)
        ok = ~malformed & (num >= self.low) & (num <= self.high)
        v = num[ok].astype(np.int64)
        if self._edges is None:
            out[ok] = v - self.low
        else:
            out[ok] = np.searchsorted(self._edges, v, side="right") - 1
        out[malformed] = MALFORMED
        return out

    def encode(self, value: Any) -> int:
        return int(self.encode_many([value])[0])

    def decode(self, index: int) -> int:
        i = int(index)
        if not 0 <= i < self.size:
            raise IndexError(f"cell {i} outside integer domain of size {self.size}")
        return self.low + i if self._edges is None else int(self._edges[i])

    def decode_many(self, indices: np.ndarray, rs: RandomSource | None = None) -> list[Any]:
        idx = np.asarray(indices, dtype=np.int64)
        if self._edges is None:
            return (idx + self.low).tolist()
        lo = self._edges[idx]
        if rs is None:
            return lo.tolist()
        width = self._edges[idx + 1] - lo
        return (lo + np.floor(rs.uniform(idx.size) * width).astype(np.int64)).tolist()

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"kind": "integer", "low": self.low, "high": self.high}
        if self._edges is not None:
            spec["edges"] = self._edges.tolist()
        return spec


class FloatDomain(Domain):
    """Reals in ``[low, high]`` cut into declared bins (a count of equal-width bins, or edges).

    Decoding with a random source draws a uniform value inside the bin.
    """

    kind = "float"

    def __init__(
        self,
        *,
        low: float,
        high: float,
        bins: int | None = None,
        edges: Sequence[float] | None = None,
    ) -> None:
        low, high = float(low), float(high)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"float domain needs finite low < high, got low={low}, high={high}")
        if (bins is None) == (edges is None):
            raise ValueError("a float domain needs exactly one of bins or edges (declared binning)")
        if edges is not None:
            self._edges = _check_edges(edges, low, high, "float domain")
        else:
            if not isinstance(bins, int) or bins < 1:
                raise ValueError(f"bins ({bins!r}) must be an int >= 1")
            self._edges = np.linspace(low, high, bins + 1)
        self.low, self.high = low, high

    @property
    def edges(self) -> np.ndarray:
        """Bin edges."""
        return self._edges.copy()

    @property
    def size(self) -> int:
        return int(self._edges.size - 1)

    def encode_many(self, values: Sequence[Any]) -> np.ndarray:
        num = _parse_numbers(values)
        out = np.full(num.shape, OUT_OF_DOMAIN, dtype=np.int64)
        malformed = ~np.isfinite(num)
        ok = ~malformed & (num >= self.low) & (num <= self.high)
        out[ok] = np.minimum(np.searchsorted(self._edges, num[ok], side="right") - 1, self.size - 1)
        out[malformed] = MALFORMED
        return out

    def encode(self, value: Any) -> int:
        return int(self.encode_many([value])[0])

    def decode(self, index: int) -> float:
        return float(self._edges[int(index)])

    def decode_many(self, indices: np.ndarray, rs: RandomSource | None = None) -> list[Any]:
        idx = np.asarray(indices, dtype=np.int64)
        lo = self._edges[idx]
        if rs is None:
            return lo.tolist()
        hi = self._edges[idx + 1]
        return (lo + rs.uniform(idx.size) * (hi - lo)).tolist()

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "float", "low": self.low, "high": self.high, "edges": self._edges.tolist()}


_GRANULARITIES = ("year", "month", "day", "hour", "minute", "second")
_SECONDS = {"day": 86400, "hour": 3600, "minute": 60, "second": 1}


class DatetimeDomain(Domain):
    """Datetimes in ``[start, end]`` truncated to a declared granularity (one cell per unit).

    Values parse as ISO 8601 (``2020-03-04``, ``2020-03-04T05:06:07``); decoding gives the unit's
    start in ISO form (date only for year/month/day granularity).
    """

    kind = "datetime"

    def __init__(self, *, start: str, end: str, granularity: str = "day") -> None:
        if granularity not in _GRANULARITIES:
            raise ValueError(f"granularity ({granularity!r}) must be one of {_GRANULARITIES}")
        try:
            self._start = pd.Timestamp(start)
            self._end = pd.Timestamp(end)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"datetime domain start/end must be ISO dates: {exc}") from exc
        if self._start.tzinfo is not None or self._end.tzinfo is not None:
            raise ValueError("datetime domain bounds must be naive (no time zone)")
        if self._end < self._start:
            raise ValueError(f"datetime domain end ({end}) is before start ({start})")
        self.granularity = granularity
        self._start = self._truncate(self._start)
        self._size = int(self._units(np.array([self._truncate(self._end).value]))[0]) + 1

    def _truncate(self, ts: pd.Timestamp) -> pd.Timestamp:
        g = self.granularity
        if g == "year":
            return pd.Timestamp(year=ts.year, month=1, day=1)
        if g == "month":
            return pd.Timestamp(year=ts.year, month=ts.month, day=1)
        return ts.floor({"day": "D", "hour": "h", "minute": "min", "second": "s"}[g])

    def _units(self, ns: np.ndarray) -> np.ndarray:
        g = self.granularity
        if g in _SECONDS:
            return (ns - self._start.value) // (_SECONDS[g] * 10**9)
        dt = pd.DatetimeIndex(ns)
        months = (dt.year - self._start.year) * 12 + (dt.month - self._start.month)
        return np.asarray(months // 12 if g == "year" else months, dtype=np.int64)

    @property
    def size(self) -> int:
        return self._size

    def encode_many(self, values: Sequence[Any]) -> np.ndarray:
        # utc=True: values with an offset are converted to UTC, naive values are read as UTC wall
        # time (as before); without it a block mixing offsets became an object Series and raised
        ts = pd.to_datetime(pd.Series(list(values), dtype=object), errors="coerce", format="ISO8601",
                            utc=True).dt.tz_convert(None)
        malformed = ts.isna().to_numpy()
        out = np.full(len(values), OUT_OF_DOMAIN, dtype=np.int64)
        ok = ~malformed
        if ok.any():
            ns = ts[ok].astype("datetime64[ns]").to_numpy().astype(np.int64)
            units = self._units(ns)
            inside = (ns >= self._start.value) & (units < self._size)
            idx = np.flatnonzero(ok)
            out[idx[inside]] = units[inside]
        out[malformed] = MALFORMED
        return out

    def encode(self, value: Any) -> int:
        return int(self.encode_many([value])[0])

    def decode(self, index: int) -> str:
        i = int(index)
        g = self.granularity
        if g in _SECONDS:
            ts = self._start + pd.Timedelta(seconds=i * _SECONDS[g])
        else:
            months = i * 12 if g == "year" else i
            ts = self._start + pd.DateOffset(months=months)
        if g in ("year", "month", "day"):
            return ts.date().isoformat()
        return ts.isoformat()

    def to_spec(self) -> dict[str, Any]:
        return {
            "kind": "datetime",
            "start": self._start.isoformat(),
            "end": self._end.isoformat(),
            "granularity": self.granularity,
        }


# -- strings and products ------------------------------------------------------------------------
class StringDomain(Domain):
    """All strings over a declared alphabet with length in ``[min_length, max_length]``.

    Cells are ordered by length, then lexicographically by alphabet position, so the size is
    ``Σ_{L=min}^{max} |A|^L`` and any index decodes in O(max_length).
    """

    kind = "string"

    def __init__(self, *, alphabet: str, min_length: int = 0, max_length: int) -> None:
        if not alphabet:
            raise ValueError("string domain alphabet must not be empty")
        if len(set(alphabet)) != len(alphabet):
            raise ValueError(f"string domain alphabet {alphabet!r} repeats characters")
        if not (isinstance(min_length, int) and isinstance(max_length, int)):
            raise TypeError("min_length and max_length must be ints")
        if not (0 <= min_length <= max_length):
            raise ValueError(
                f"need 0 <= min_length ({min_length}) <= max_length ({max_length})"
            )
        self.alphabet = alphabet
        self.min_length, self.max_length = min_length, max_length
        self._pos = {c: i for i, c in enumerate(alphabet)}
        a = len(alphabet)
        self._offsets = [0]
        for length in range(min_length, max_length + 1):
            self._offsets.append(self._offsets[-1] + a**length)

    @property
    def size(self) -> int:
        return self._offsets[-1]

    def encode(self, value: Any) -> int:
        if not isinstance(value, str):
            return OUT_OF_DOMAIN if value is None else MALFORMED
        length = len(value)
        if not (self.min_length <= length <= self.max_length):
            return OUT_OF_DOMAIN
        a = len(self.alphabet)
        idx = 0
        for ch in value:
            p = self._pos.get(ch)
            if p is None:
                return OUT_OF_DOMAIN
            idx = idx * a + p
        return self._offsets[length - self.min_length] + idx

    def decode(self, index: int) -> str:
        i = int(index)
        if not 0 <= i < self.size:
            raise IndexError(f"cell {i} outside string domain of size {self.size}")
        k = 0
        while self._offsets[k + 1] <= i:
            k += 1
        length = self.min_length + k
        rest = i - self._offsets[k]
        a = len(self.alphabet)
        chars = []
        for _ in range(length):
            rest, p = divmod(rest, a)
            chars.append(self.alphabet[p])
        return "".join(reversed(chars))

    def to_spec(self) -> dict[str, Any]:
        return {
            "kind": "string",
            "alphabet": self.alphabet,
            "min_length": self.min_length,
            "max_length": self.max_length,
        }


class ProductDomain(Domain):
    """The product of domains, as values joined by ``separator`` (e.g. word pairs).

    Index is mixed-radix (first part most significant). Encoding a string tries every split at
    the separator into the right number of parts, so parts may themselves contain the separator
    as long as the split is unambiguous (the first valid split wins).
    """

    kind = "product"

    def __init__(self, parts: Sequence[Domain], *, separator: str = " ") -> None:
        if len(parts) < 2:
            raise ValueError(f"a product domain needs at least two parts, got {len(parts)}")
        if not separator:
            raise ValueError("product separator must not be empty")
        self.parts = list(parts)
        self.separator = separator
        self._size = math.prod(p.size for p in self.parts)

    @property
    def size(self) -> int:
        return self._size

    def _encode_parts(self, pieces: list[str], parts: list[Domain]) -> int:
        if len(parts) == 1:
            return parts[0].encode(self.separator.join(pieces)) if pieces else OUT_OF_DOMAIN
        head = parts[0]
        tail_size = math.prod(p.size for p in parts[1:])
        for cut in range(1, len(pieces) - len(parts) + 2):
            h = head.encode(self.separator.join(pieces[:cut]))
            if h < 0:
                continue
            t = self._encode_parts(pieces[cut:], parts[1:])
            if t >= 0:
                return h * tail_size + t
        return OUT_OF_DOMAIN

    def encode(self, value: Any) -> int:
        if value is None:
            return OUT_OF_DOMAIN
        pieces = str(value).split(self.separator)
        if len(pieces) < len(self.parts):
            return OUT_OF_DOMAIN
        return self._encode_parts(pieces, self.parts)

    def encode_many(self, values: Sequence[Any]) -> np.ndarray:
        """Vectorized :meth:`encode` for two-part products (word pairs): the split at the first
        separator is encoded with each part's ``encode_many``; only values that fail there and
        hold more separators are retried one by one (same first-valid-split rule)."""
        if len(self.parts) != 2 or self._size >= 2**63:
            return super().encode_many(values)
        series = values if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
        series = series.reset_index(drop=True)
        codes, uniques = pd.factorize(series.astype(object), use_na_sentinel=True)
        if uniques.size == 0:
            return np.full(codes.size, OUT_OF_DOMAIN, dtype=np.int64)
        if uniques.size < codes.size:  # encode each distinct value once
            enc = self._encode_distinct(pd.Series(np.asarray(uniques, dtype=object), dtype=object))
            return np.where(codes >= 0, enc[np.maximum(codes, 0)], OUT_OF_DOMAIN).astype(np.int64)
        return self._encode_distinct(series)

    def _encode_distinct(self, series: pd.Series) -> np.ndarray:
        present = series.notna().to_numpy()
        text = series.where(present, "").astype(str)
        out = np.full(len(text), OUT_OF_DOMAIN, dtype=np.int64)
        if not len(text):
            return out
        pieces = text.str.split(self.separator, n=1, expand=True, regex=False)
        if pieces.shape[1] < 2:
            return out
        has_sep = pieces[1].notna().to_numpy() & present
        idx = np.flatnonzero(has_sep)
        head = self.parts[0].encode_many(pieces[0].iloc[idx].reset_index(drop=True))
        tail = self.parts[1].encode_many(pieces[1].iloc[idx].reset_index(drop=True))
        ok = (head >= 0) & (tail >= 0)
        out[idx[ok]] = head[ok] * int(self.parts[1].size) + tail[ok]
        retry = [int(i) for i in idx[~ok] if text.iat[int(i)].count(self.separator) > 1]
        for i in retry:
            out[i] = self.encode(text.iat[i])
        return out

    def decode(self, index: int) -> str:
        i = int(index)
        if not 0 <= i < self._size:
            raise IndexError(f"cell {i} outside product domain of size {self._size}")
        out = []
        for p in reversed(self.parts):
            i, r = divmod(i, p.size)
            out.append(str(p.decode(r)))
        return self.separator.join(reversed(out))

    def to_spec(self) -> dict[str, Any]:
        return {
            "kind": "product",
            "separator": self.separator,
            "parts": [p.to_spec() for p in self.parts],
        }


class UnionDomain(Domain):
    """Declared categories, then every value of a (possibly huge) base domain not among them.

    E.g. a codebook's categories plus all English word pairs. Cells ``0..m-1`` are the
    categories; the rest are the base domain's cells with the ``m`` categories' own cells (if any)
    removed, so every value has exactly one cell and ``size = m + base.size - |overlap|`` exactly.
    The overlap is found by encoding the ``m`` categories in the base domain (never enumerating it).
    """

    kind = "union"

    def __init__(self, first: CategoricalDomain, rest: Domain) -> None:
        if not isinstance(first, CategoricalDomain) or first.other is not None:
            raise TypeError("the first part of a union must be a CategoricalDomain without 'other'")
        if not isinstance(rest, Domain):
            raise TypeError(f"the base of a union must be a Domain, got {type(rest).__name__}")
        self.first, self.rest = first, rest
        codes = np.asarray(rest.encode_many(first.values), dtype=np.int64)
        self._overlap = np.unique(codes[codes >= 0])
        self._m = first.size
        self._size = first.size + rest.size - int(self._overlap.size)

    @property
    def size(self) -> int:
        return self._size

    def encode_many(self, values: Sequence[Any]) -> np.ndarray:
        series = values if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
        series = series.reset_index(drop=True)
        out = self.first.encode_many(series)
        miss = np.flatnonzero(out < 0)
        if miss.size:
            base = np.asarray(self.rest.encode_many(series.iloc[miss].reset_index(drop=True)))
            good = base >= 0
            shift = np.searchsorted(self._overlap, base[good], side="left")
            out[miss[good]] = self._m + base[good] - shift
            out[miss[~good]] = base[~good]
        return out

    def encode(self, value: Any) -> int:
        return int(self.encode_many([value])[0])

    def decode(self, index: int) -> Any:
        i = int(index)
        if not 0 <= i < self._size:
            raise IndexError(f"cell {i} outside union domain of size {self._size}")
        if i < self._m:
            return self.first.decode(i)
        j = i - self._m  # the j-th base cell that is not in the overlap
        c = j
        while True:
            nxt = j + int(np.searchsorted(self._overlap, c, side="right"))
            if nxt == c:
                return self.rest.decode(c)
            c = nxt

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "union", "parts": [self.first.to_spec(), self.rest.to_spec()]}


# -- construction from a declarative spec -------------------------------------------------------
def domain_from_spec(spec: Any, *, base_dir: Path | None = None, where: str = "domain") -> Domain:
    """Build a domain from its schema form. ``where`` prefixes every error message.

    Forms::

        {kind: categorical, values: [a, b], other: OTHER}
        {kind: categorical, values_file: words.txt}
        {kind: integer, low: 0, high: 99, bins: 10}          # or edges: [...], or neither
        {kind: float, low: 0, high: 1, bins: 20}             # or edges: [...]
        {kind: datetime, start: 2020-01-01, end: 2020-12-31, granularity: day}
        {kind: string, alphabet: "abc", min_length: 1, max_length: 8}
        {kind: product, separator: " ", parts: [<domain>, <domain>]}
        {kind: union, parts: [<categorical domain>, <any domain>]}  # codebook ∪ huge base
    """
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: a domain must be a mapping, got {type(spec).__name__}")
    kind = spec.get("kind")
    allowed = {
        "categorical": {"kind", "values", "values_file", "other"},
        "integer": {"kind", "low", "high", "bins", "edges"},
        "float": {"kind", "low", "high", "bins", "edges"},
        "datetime": {"kind", "start", "end", "granularity"},
        "string": {"kind", "alphabet", "min_length", "max_length"},
        "product": {"kind", "parts", "separator"},
        "union": {"kind", "parts"},
    }
    if kind not in allowed:
        raise ValueError(f"{where}: kind ({kind!r}) must be one of {sorted(allowed)}")
    unknown = set(spec) - allowed[kind]
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {sorted(unknown)} for a {kind} domain "
            f"(allowed: {sorted(allowed[kind])})"
        )
    try:
        if kind == "categorical":
            if ("values" in spec) == ("values_file" in spec):
                raise ValueError("give exactly one of 'values' or 'values_file'")
            if "values_file" in spec:
                path = Path(spec["values_file"])
                if not path.is_absolute() and base_dir is not None:
                    path = base_dir / path
                return CategoricalDomain.from_file(path, other=spec.get("other"))
            values = spec["values"]
            if not isinstance(values, list):
                raise ValueError(f"'values' must be a list, got {type(values).__name__}")
            return CategoricalDomain(values, other=spec.get("other"))
        if kind == "integer":
            _require(spec, ("low", "high"))
            return IntegerDomain(
                low=spec["low"], high=spec["high"], bins=spec.get("bins"), edges=spec.get("edges")
            )
        if kind == "float":
            _require(spec, ("low", "high"))
            return FloatDomain(
                low=spec["low"], high=spec["high"], bins=spec.get("bins"), edges=spec.get("edges")
            )
        if kind == "datetime":
            _require(spec, ("start", "end"))
            start, end = spec["start"], spec["end"]
            return DatetimeDomain(
                start=start.isoformat() if isinstance(start, (_dt.date,)) else str(start),
                end=end.isoformat() if isinstance(end, (_dt.date,)) else str(end),
                granularity=spec.get("granularity", "day"),
            )
        if kind == "string":
            _require(spec, ("alphabet", "max_length"))
            return StringDomain(
                alphabet=str(spec["alphabet"]),
                min_length=spec.get("min_length", 0),
                max_length=spec["max_length"],
            )
        parts = spec.get("parts")
        if not isinstance(parts, list):
            raise ValueError("'parts' must be a list of domains")
        built = [
            domain_from_spec(p, base_dir=base_dir, where=f"{where}.parts[{i}]")
            for i, p in enumerate(parts)
        ]
        if kind == "union":
            if len(built) != 2 or not isinstance(built[0], CategoricalDomain):
                raise ValueError(
                    "a union needs exactly two parts: a categorical domain, then any domain"
                )
            return UnionDomain(built[0], built[1])
        return ProductDomain(built, separator=str(spec.get("separator", " ")))
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        if msg.startswith(where):
            raise
        raise ValueError(f"{where}: {msg}") from exc


def _require(spec: dict[str, Any], keys: Iterable[str]) -> None:
    missing = [k for k in keys if k not in spec]
    if missing:
        raise ValueError(f"missing required key(s) {missing}")
