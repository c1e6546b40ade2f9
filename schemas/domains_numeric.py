"""Ordered declared domains: integer ranges, real ranges cut into bins, datetimes at a granularity.

* :class:`IntegerDomain` — integers in ``[low, high]``, one cell per value or per declared bin;
* :class:`FloatDomain` — reals in ``[low, high]`` in declared bins (a count of equal-width bins or
  edges);
* :class:`DatetimeDomain` — ISO 8601 datetimes in ``[start, end]`` truncated to a granularity
  (year ... second).

Shapes: ``encode_many(values)`` takes a sequence or pandas object ``Series`` of raw values and
returns int64 cell codes (numbers parsed by :func:`~beamsynth.schemas.domains_base.parse_numbers`,
each value alone); ``decode_many(idx, rs)`` returns a list of values, drawing uniformly inside
each bin when given a :class:`~beamsynth.transforms.noise.RandomSource` (post-processing).

Privacy: ranges, bins and granularities are declared (rule 1), never read off the data; values
outside are ``OUT_OF_DOMAIN``, unparseable ones ``MALFORMED``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from beamsynth.schemas.domains_base import MALFORMED, OUT_OF_DOMAIN, Domain, parse_numbers

if TYPE_CHECKING:  # annotations only: schemas/ never imports transforms/ at run time
    from beamsynth.transforms.noise import RandomSource

__all__ = [
    "DatetimeDomain",
    "FloatDomain",
    "IntegerDomain",
]


# -- numeric ranges ------------------------------------------------------------------------------
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
        num = parse_numbers(values)
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
        num = parse_numbers(values)
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
        raw = pd.Series(list(values), dtype=object)
        ts = pd.to_datetime(raw, errors="coerce", format="ISO8601", utc=True).dt.tz_convert(None)
        # pandas reads "now" and "today" as the wall clock: no value of the record's own, and a
        # recomputed step would bin it elsewhere (H74)
        malformed = ts.isna().to_numpy() | raw.isin(("now", "today")).to_numpy()
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
