"""The declared domain's base class, its encoding codes, and the per-value numeric parser.

* :class:`Domain` — a finite, declared set of cells: exact ``size`` (a Python int), ``encode`` /
  ``encode_many`` (value → cell index, :data:`OUT_OF_DOMAIN` or :data:`MALFORMED`),
  ``decode`` / ``decode_many``, and uniform sampling of cells without enumerating the domain
  (``sample_distinct``, ``sample_uniform``);
* :func:`parse_numbers` — raw values → floats, NaN where unparseable, **each value judged alone**
  (stability: no value changes how another one parses); the numeric domains
  (:mod:`~beamsynth.schemas.domains_numeric`) and the spatial key codec
  (:mod:`~beamsynth.schemas.keys`) read numbers through it.

Shapes: values are a sequence or a pandas object ``Series`` of raw values (strings, numbers,
``None``, anything a reader produced); codes are int64 numpy arrays of the same length.

Privacy: nothing here is learned from data (rule 1); a domain is declared, and a value that
does not parse is ``MALFORMED`` (a dead letter upstream), never a reason to fail the run.
"""

from __future__ import annotations

import decimal
import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
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
    "Domain",
    "parse_numbers",
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


# -- numbers, each value parsed alone ------------------------------------------------------------
def parse_numbers(values: Sequence[Any]) -> np.ndarray:
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
    if issubclass(t, (numbers.Real, decimal.Decimal)) and not issubclass(
            t, (bool, np.bool_, np.timedelta64)):  # a duration is no number (float() refuses it)
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
