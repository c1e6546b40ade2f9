"""Declared domains of labels and strings: categories, strings over an alphabet, products, unions.

* :class:`CategoricalDomain` — enumerated categories (inline or a word-list file,
  :meth:`~CategoricalDomain.from_file`), optionally with a catch-all ``other`` cell;
* :class:`StringDomain` — every string over a declared alphabet with length in
  ``[min_length, max_length]`` (size ``Σ |A|^L``, decoded in O(max_length));
* :class:`ProductDomain` — values joined by a separator (e.g. word pairs), mixed-radix cells;
* :class:`UnionDomain` — declared categories, then every other value of a (possibly huge) base
  domain, sized exactly without enumerating the base.

Shapes: ``encode_many(values)`` takes a sequence or pandas object ``Series`` and returns int64
cell codes (vectorized for categories and two-part products, each distinct value encoded once);
``decode_many(idx, rs)`` returns a list of values.

Privacy: categories, alphabets, lengths and parts are declared (rule 1); huge domains (10^10
cells and more) are sampled by index, never enumerated or learned from the data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from beamsynth.schemas.domains_base import MALFORMED, OUT_OF_DOMAIN, Domain

if TYPE_CHECKING:  # annotations only: schemas/ never imports transforms/ at run time
    from beamsynth.transforms.noise import RandomSource

__all__ = [
    "CategoricalDomain",
    "ProductDomain",
    "StringDomain",
    "UnionDomain",
]


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
        # an object Index: pandas infers no dtype from the batch (one int > 1e308 raised
        # OverflowError for its whole batch, unless a string came first: rule 6)
        codes = self._index.get_indexer(pd.Index(arr.to_numpy(dtype=object), dtype=object,
                                                 copy=False)).astype(np.int64)
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
        # each distinct *text* once: values that are equal but print otherwise (1 / 1.0 / True,
        # 1.5 / Decimal('1.50')) must not share a code (rule 6); null reads as "" (no separator)
        raw = series.to_numpy(dtype=object).copy()
        raw[~series.notna().to_numpy()] = ""
        text = pd.Series(raw, dtype=object).astype(str).to_numpy(dtype=object)
        codes, uniques = pd.factorize(text)
        if uniques.size == 0:
            return np.full(codes.size, OUT_OF_DOMAIN, dtype=np.int64)
        enc = self._encode_distinct(pd.Series(np.asarray(uniques, dtype=object), dtype=object))
        return enc[codes].astype(np.int64)

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
