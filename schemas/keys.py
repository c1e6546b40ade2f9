"""Hierarchical key encoders: text, spatial points and declared categorical hierarchies.

A *key codec* turns raw values into fixed-width sequences of **symbols**, one symbol per level of
a declared, data-independent hierarchy (seed 003, Section 2: "records as sequences of a type K").
Symbols are ``1..fanout``; ``0`` pads a sequence after its end. A *prefix* of length ``d`` names a
node at depth ``d`` of the hierarchy; the root is the empty prefix.

* :class:`TextKeyCodec` — strings over a declared alphabet (default the paper's ``a-z``, ``0-9``,
  space and period, Section 5.2) after declared normalization: case folding, a character map, and
  what happens to every other character (``reject`` → dead-letter output with a reason, or
  ``drop`` the character). A declared ``max_length``; longer strings are rejected or truncated as
  declared. An end-of-string symbol (EOS) follows the last character, so complete strings are
  leaves of the hierarchy and a prefix ending in EOS is a complete string.
* :class:`SpatialKeyCodec` — points in a declared bounding box of ``d`` numeric columns (lat/lon or
  any), as sequences of ``2^d``-ary cells (quadtree for ``d = 2``), ``depth`` levels. Decoding draws
  a point uniformly inside the prefix's cell.
* :class:`HierarchyKeyCodec` — a declared categorical tree (e.g. country > region > city), one
  level per column. Decoding a prefix that stops above the last level draws a uniform declared
  descendant.

Nothing here reads data to learn a domain: alphabets, lengths, boxes and trees are declared, in a
key-spec mapping (YAML form in ``docs/prefixes.md``) or on the command line. Encoding is columnar:
a block of raw values → ``codes`` (uint8, or big-endian uint16 when ``fanout > 254``) of shape
``(n, depth)`` plus a list of ``(row, reason)`` rejections.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from beamsynth.schemas.domains_base import parse_numbers

__all__ = [
    "DEFAULT_ALPHABET",
    "HierarchyKeyCodec",
    "KeyCodec",
    "KeySpecError",
    "SpatialKeyCodec",
    "TextKeyCodec",
    "WORLD_BOX",
    "key_codec_from_spec",
    "load_key_spec",
    "load_tree",
    "prefix_bytes",
]

DEFAULT_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 ."
WORLD_BOX = ((-90.0, 90.0), (-180.0, 180.0))  # (lat, lon)
_MAX_UINT8_FANOUT = 254


class KeySpecError(ValueError):
    """A key declaration is invalid (message names the field and the bad value)."""


def prefix_bytes(codes: np.ndarray, depth: int) -> np.ndarray:
    """The first ``depth`` symbols of each row as fixed-width bytes (sortable, searchable).

    ``codes`` is ``(n, >= depth)``; the result has dtype ``S{depth * itemsize}``. Prefixes of
    live keys never contain the padding symbol 0, so numpy's trailing-null stripping is harmless.
    """
    if depth < 1:
        raise ValueError(f"depth ({depth}) must be >= 1 (the root has no bytes)")
    part = np.ascontiguousarray(codes[:, :depth])
    return part.view(np.dtype(f"S{depth * part.dtype.itemsize}")).ravel()


def _symbol_dtype(fanout: int) -> np.dtype:
    return np.dtype(np.uint8) if fanout <= _MAX_UINT8_FANOUT else np.dtype(">u2")


class KeyCodec(ABC):
    """A declared hierarchy over keys: ``depth`` levels, ``fanout`` children per node at most."""

    kind: str = ""

    @property
    @abstractmethod
    def depth(self) -> int:
        """Number of levels (symbols per key)."""

    @property
    @abstractmethod
    def fanout(self) -> int:
        """Largest number of children of a node."""

    @property
    @abstractmethod
    def input_columns(self) -> tuple[str, ...]:
        """Raw columns read to build one key."""

    @property
    @abstractmethod
    def output_columns(self) -> tuple[str, ...]:
        """Columns of the decoded synthetic keys."""

    @property
    def symbol_dtype(self) -> np.dtype:
        """dtype of ``codes``."""
        return _symbol_dtype(self.fanout)

    @abstractmethod
    def encode(self, columns: Mapping[str, pd.Series]) -> tuple[np.ndarray, list[tuple[int, str]]]:
        """Raw columns (``n`` rows) → codes of the accepted rows and ``(row, reason)`` rejections.

        ``codes[i]`` belongs to the i-th accepted row in input order.
        """

    @abstractmethod
    def decode(self, prefixes: np.ndarray, rs: Any) -> dict[str, np.ndarray]:
        """Prefixes ``(m, d)`` → one synthetic value per row (uniform inside the node if needed).

        ``rs`` is a :class:`~beamsynth.transforms.noise.RandomSource` (post-processing draws).
        """

    def valid_children(self, prefixes: np.ndarray) -> np.ndarray:
        """Which of the ``fanout`` child symbols exist below each prefix: bool ``(m, fanout)``."""
        return np.ones((prefixes.shape[0], self.fanout), dtype=bool)

    def is_terminal(self, prefixes: np.ndarray) -> np.ndarray:
        """Prefixes ``(m, d)`` that have no children (complete keys or full depth)."""
        return np.full(prefixes.shape[0], prefixes.shape[1] >= self.depth, dtype=bool)

    def is_complete(self, prefixes: np.ndarray) -> np.ndarray:
        """Prefixes that name one complete key (decode gives no further choice for text)."""
        return np.ones(prefixes.shape[0], dtype=bool)

    def labels(self, prefixes: np.ndarray) -> list[str]:
        """Human-readable names of prefixes (for the released tree)."""
        return ["/".join(str(int(s) - 1) for s in row) for row in prefixes]

    def cell_diameter(self, depth: int) -> float:
        """Diameter of a node at ``depth`` (spatial only; 1 elsewhere)."""
        return 1.0

    def to_spec(self) -> dict[str, Any]:
        """The declaration as a JSON-friendly mapping (for manifests)."""
        return {"kind": self.kind}


# -- text ------------------------------------------------------------------------------------------
class TextKeyCodec(KeyCodec):
    """Strings over a declared alphabet, one character per level, then EOS.

    Args:
      column: the raw column holding the strings.
      alphabet: the declared characters (distinct); symbols ``1..len(alphabet)``, EOS is
        ``len(alphabet) + 1``.
      max_length: longest string kept (characters, after normalization); depth is
        ``max_length + 1``.
      casefold: fold case before anything else.
      char_map: characters replaced (value may be ``""`` to delete), applied after case folding.
      on_other: characters still outside the alphabet: ``reject`` the row (dead letter) or ``drop``
        the character.
      on_too_long: ``reject`` the row or ``truncate`` to ``max_length``.
      strip: strip leading/trailing whitespace first.
    """

    kind = "text"

    def __init__(
        self,
        *,
        column: str,
        alphabet: str = DEFAULT_ALPHABET,
        max_length: int = 20,
        casefold: bool = True,
        char_map: Mapping[str, str] | None = None,
        on_other: str = "reject",
        on_too_long: str = "reject",
        strip: bool = False,
    ) -> None:
        if not isinstance(column, str) or not column:
            raise KeySpecError(f"text column ({column!r}) must be a non-empty string")
        if not isinstance(alphabet, str) or not alphabet or len(set(alphabet)) != len(alphabet):
            raise KeySpecError(f"alphabet ({alphabet!r}) must be a non-empty string of distinct characters")
        if len(alphabet) + 1 > 65_000:
            raise KeySpecError(f"alphabet has {len(alphabet)} characters; at most 64999 are supported")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or not 1 <= max_length <= 1000:
            raise KeySpecError(f"max_length ({max_length!r}) must be an int in [1, 1000]")
        if on_other not in ("reject", "drop"):
            raise KeySpecError(f"on_other ({on_other!r}) must be one of 'reject', 'drop'")
        if on_too_long not in ("reject", "truncate"):
            raise KeySpecError(f"on_too_long ({on_too_long!r}) must be one of 'reject', 'truncate'")
        char_map = dict(char_map or {})
        for k, v in char_map.items():
            if not (isinstance(k, str) and len(k) == 1 and isinstance(v, str)):
                raise KeySpecError(f"char_map entry {k!r}: {v!r} must map one character to a string")
            if any(ch not in alphabet for ch in v):
                raise KeySpecError(f"char_map entry {k!r}: {v!r} maps to characters outside the alphabet")
        self.column, self.alphabet, self.max_length = column, alphabet, max_length
        self.casefold, self.char_map, self.on_other = bool(casefold), char_map, on_other
        self.on_too_long, self.strip = on_too_long, bool(strip)
        self._eos = len(alphabet) + 1
        self._map_table = str.maketrans(char_map)
        # translate to symbol characters chr(symbol); uint16 keys use 2 bytes per symbol
        self._to_sym = {ord(ch): chr(i + 1) for i, ch in enumerate(alphabet)}
        self._from_sym = {i + 1: ch for i, ch in enumerate(alphabet)}
        self._from_sym_table = str.maketrans({chr(i + 1): ch for i, ch in enumerate(alphabet)})
        self._delete_alphabet = str.maketrans({ch: None for ch in alphabet})

    @property
    def depth(self) -> int:
        return self.max_length + 1

    @property
    def fanout(self) -> int:
        return len(self.alphabet) + 1

    @property
    def eos(self) -> int:
        """The end-of-string symbol."""
        return self._eos

    @property
    def input_columns(self) -> tuple[str, ...]:
        return (self.column,)

    @property
    def output_columns(self) -> tuple[str, ...]:
        return (self.column,)

    def normalize(self, value: Any) -> tuple[str | None, str | None]:
        """``(normalized string, None)`` or ``(None, reason)`` for one raw value."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None, "missing value"
        s = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)  # H55
        if self.strip:
            s = s.strip()
        if self.casefold:
            s = s.casefold()
        s = s.translate(self._map_table)
        other = s.translate(self._delete_alphabet)
        if other:
            if self.on_other == "reject":
                bad = "".join(sorted(set(other)))[:20]
                return None, f"characters outside the declared alphabet: {bad!r}"
            s = "".join(ch for ch in s if ord(ch) in self._to_sym)
        if len(s) > self.max_length:
            if self.on_too_long == "reject":
                return None, f"length {len(s)} exceeds the declared max_length {self.max_length}"
            s = s[: self.max_length]
        return s, None

    def encode_strings(self, strings: Sequence[str]) -> np.ndarray:
        """Already-normalized strings → codes ``(n, depth)`` (EOS appended, 0-padded)."""
        n = len(strings)
        codes = np.zeros((n, self.depth), dtype=self.symbol_dtype)
        if n == 0:
            return codes
        eos = chr(self._eos)
        if self.symbol_dtype.itemsize == 1:
            raw = np.array([s.translate(self._to_sym).encode("latin-1") + eos.encode("latin-1")
                            for s in strings], dtype=f"S{self.depth}")
            return raw.view(np.uint8).reshape(n, self.depth).copy()
        for i, s in enumerate(strings):
            syms = [self._to_sym[ord(ch)] for ch in s] + [eos]
            codes[i, : len(syms)] = [ord(c) for c in syms]
        return codes

    def encode(self, columns: Mapping[str, pd.Series]) -> tuple[np.ndarray, list[tuple[int, str]]]:
        values = columns[self.column].tolist()
        good: list[str] = []
        bad: list[tuple[int, str]] = []
        for i, v in enumerate(values):
            s, reason = self.normalize(v)
            if reason is None:
                good.append(s)  # type: ignore[arg-type]
            else:
                bad.append((i, reason))
        return self.encode_strings(good), bad

    def strings(self, prefixes: np.ndarray) -> list[str]:
        """Prefixes → their characters (EOS and padding removed)."""
        out = []
        for row in np.asarray(prefixes).tolist():
            out.append("".join(self._from_sym.get(int(s), "") for s in row))
        return out

    def decode(self, prefixes: np.ndarray, rs: Any = None) -> dict[str, np.ndarray]:
        return {self.column: np.array(self.strings(prefixes), dtype=object)}

    def valid_children(self, prefixes: np.ndarray) -> np.ndarray:
        m, d = prefixes.shape
        out = np.ones((m, self.fanout), dtype=bool)
        if d >= self.max_length:  # only EOS may follow max_length characters
            out[:, :] = False
            out[:, self._eos - 1] = True
        return out

    def is_terminal(self, prefixes: np.ndarray) -> np.ndarray:
        m, d = prefixes.shape
        if d == 0:
            return np.zeros(m, dtype=bool)
        return (prefixes[:, -1] == self._eos) | (d >= self.depth)  # EOS can only come last

    def is_complete(self, prefixes: np.ndarray) -> np.ndarray:
        m, d = prefixes.shape
        if d == 0:
            return np.zeros(m, dtype=bool)
        return (prefixes == self._eos).any(axis=1)

    def labels(self, prefixes: np.ndarray) -> list[str]:
        out = []
        for row in np.asarray(prefixes).tolist():
            out.append("".join("$" if int(s) == self._eos else self._from_sym.get(int(s), "") for s in row))
        return out

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "text", "column": self.column, "alphabet": self.alphabet,
                "max_length": self.max_length, "casefold": self.casefold, "char_map": self.char_map,
                "on_other": self.on_other, "on_too_long": self.on_too_long, "strip": self.strip}


# -- spatial ---------------------------------------------------------------------------------------
def _short(value: Any) -> str:
    """A raw value for a dead letter's reason: its repr, at most 40 characters; never raises."""
    try:
        text = repr(value)
    except Exception:  # a value whose repr fails
        return f"<{type(value).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."


class SpatialKeyCodec(KeyCodec):
    """Points in a declared box of ``d`` numeric columns → ``2^d``-ary cell sequences.

    Args:
      columns: the coordinate columns (``d`` of them, 1 ≤ d ≤ 7).
      box: ``[(low, high), ...]`` per column, declared (never read off the data).
      depth: levels of subdivision (each halves every side), 1..30.
      on_outside: points outside the box: ``reject`` (dead letter) or ``clip`` to the box.
    """

    kind = "spatial"

    def __init__(
        self,
        *,
        columns: Sequence[str],
        box: Sequence[Sequence[float]],
        depth: int = 16,
        on_outside: str = "reject",
    ) -> None:
        columns = tuple(columns)
        if not 1 <= len(columns) <= 7 or len(set(columns)) != len(columns):
            raise KeySpecError(f"spatial columns ({list(columns)!r}) must be 1..7 distinct names")
        if len(box) != len(columns):
            raise KeySpecError(f"box ({box!r}) needs one (low, high) pair per column ({len(columns)})")
        lo, hi = [], []
        for c, pair in zip(columns, box):
            if len(pair) != 2:
                raise KeySpecError(f"box entry for {c!r} ({pair!r}) must be (low, high)")
            a, b = float(pair[0]), float(pair[1])
            if not (math.isfinite(a) and math.isfinite(b) and a < b):
                raise KeySpecError(f"box entry for {c!r} ({pair!r}) must have finite low < high")
            lo.append(a)
            hi.append(b)
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 30:
            raise KeySpecError(f"depth ({depth!r}) must be an int in [1, 30]")
        if on_outside not in ("reject", "clip"):
            raise KeySpecError(f"on_outside ({on_outside!r}) must be one of 'reject', 'clip'")
        self.columns, self.low, self.high = columns, np.array(lo), np.array(hi)
        self._depth, self.on_outside = depth, on_outside

    @property
    def dims(self) -> int:
        """Number of coordinates d."""
        return len(self.columns)

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def fanout(self) -> int:
        return 2 ** self.dims

    @property
    def input_columns(self) -> tuple[str, ...]:
        return self.columns

    @property
    def output_columns(self) -> tuple[str, ...]:
        return self.columns

    def encode_points(self, points: np.ndarray) -> np.ndarray:
        """Points ``(n, d)`` inside the box → codes ``(n, depth)``."""
        n = points.shape[0]
        scale = float(2 ** self._depth)
        u = (points - self.low) / (self.high - self.low)
        grid = np.minimum(np.floor(u * scale), scale - 1).astype(np.int64)
        grid = np.maximum(grid, 0)
        codes = np.zeros((n, self._depth), dtype=self.symbol_dtype)
        for level in range(self._depth):
            shift = self._depth - 1 - level
            sym = np.zeros(n, dtype=np.int64)
            for j in range(self.dims):
                sym |= ((grid[:, j] >> shift) & 1) << j
            codes[:, level] = sym + 1
        return codes

    def encode(self, columns: Mapping[str, pd.Series]) -> tuple[np.ndarray, list[tuple[int, str]]]:
        """Coordinates parse like a declared numeric domain, **each value alone**
        (:func:`~beamsynth.schemas.domains_base.parse_numbers`: text by Arrow after trimming white
        space, numbers by ``float()``; booleans, complex values, containers are malformed), so no
        value of a block changes how another parses (``tests/unit/test_keys.py``)."""
        vals = np.column_stack([parse_numbers(columns[c]) for c in self.columns]
                               ) if len(columns[self.columns[0]]) else np.zeros((0, self.dims))
        bad_mask = ~np.isfinite(vals).all(axis=1)
        reasons: dict[int, str] = {}
        for i in np.flatnonzero(bad_mask).tolist():  # the first bad coordinate, value echoed
            j = int(np.flatnonzero(~np.isfinite(vals[i]))[0])
            raw = _short(columns[self.columns[j]].iloc[i])
            reasons[i] = f"coordinate {self.columns[j]} {raw} is missing or not a number"
        outside = ((vals < self.low) | (vals > self.high)).any(axis=1) & ~bad_mask
        if self.on_outside == "reject":
            for i in np.flatnonzero(outside).tolist():
                reasons[i] = (f"point ({', '.join(f'{v:g}' for v in vals[i])}) outside the declared "
                              "box " + ", ".join(f"{c} in [{a:g}, {b:g}]" for c, a, b in zip(
                                  self.columns, self.low, self.high))
                              + " (check the column order, or on_outside='clip')")
            bad_mask = bad_mask | outside
        else:
            vals = np.clip(vals, self.low, self.high)
        codes = self.encode_points(vals[~bad_mask])
        return codes, sorted(reasons.items())

    def cells(self, prefixes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Low corners and side lengths ``(m, d)`` of the cells named by prefixes ``(m, k)``."""
        m, k = prefixes.shape
        grid = np.zeros((m, self.dims), dtype=np.int64)
        syms = prefixes.astype(np.int64) - 1
        for level in range(k):
            for j in range(self.dims):
                grid[:, j] = (grid[:, j] << 1) | ((syms[:, level] >> j) & 1)
        side = (self.high - self.low) / float(2 ** k)
        low = self.low + grid * side
        return low, np.broadcast_to(side, (m, self.dims))

    def decode(self, prefixes: np.ndarray, rs: Any) -> dict[str, np.ndarray]:
        low, side = self.cells(np.asarray(prefixes))
        u = rs.uniform(low.shape) if low.size else np.zeros(low.shape)
        pts = low + u * side
        return {c: pts[:, j] for j, c in enumerate(self.columns)}

    def cell_diameter(self, depth: int) -> float:
        side = (self.high - self.low) / float(2 ** depth)
        return float(np.sqrt(np.sum(side**2)))

    def labels(self, prefixes: np.ndarray) -> list[str]:
        return ["".join(format(int(s) - 1, "x") for s in row) for row in np.asarray(prefixes).tolist()]

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "spatial", "columns": list(self.columns),
                "box": [[float(a), float(b)] for a, b in zip(self.low, self.high)],
                "depth": self._depth, "on_outside": self.on_outside}


# -- categorical hierarchy ---------------------------------------------------------------------------
class HierarchyKeyCodec(KeyCodec):
    """A declared categorical tree, one column per level (e.g. country > region > city).

    Args:
      columns: one column per level, root-most first.
      tree: nested mapping ``{country: {region: [city, ...]}}``; the last level is a list.
        Every path must have exactly ``len(columns)`` levels.
    """

    kind = "hierarchy"

    def __init__(self, *, columns: Sequence[str], tree: Mapping[str, Any]) -> None:
        columns = tuple(columns)
        if not columns or len(set(columns)) != len(columns):
            raise KeySpecError(f"hierarchy columns ({list(columns)!r}) must be distinct names")
        self.columns = columns
        self._children: dict[tuple[int, ...], list[str]] = {}
        self._index: dict[tuple[int, ...], dict[str, int]] = {}
        self._build((), tree, 0)
        self._fanout = max(len(v) for v in self._children.values())
        self.tree = tree

    def _build(self, path: tuple[int, ...], node: Any, level: int) -> None:
        last = level == len(self.columns) - 1
        if last:
            if isinstance(node, Mapping) or not isinstance(node, Sequence) or isinstance(node, str):
                raise KeySpecError(f"hierarchy level {self.columns[level]!r} under {path!r} must be a list")
            names = [str(x) for x in node]
        else:
            if not isinstance(node, Mapping):
                raise KeySpecError(f"hierarchy level {self.columns[level]!r} under {path!r} must be a mapping")
            names = [str(x) for x in node]
        if not names or len(set(names)) != len(names):
            raise KeySpecError(f"hierarchy level {self.columns[level]!r} under {path!r} needs distinct values")
        self._children[path] = names
        self._index[path] = {n: i for i, n in enumerate(names)}
        if not last:
            for i, name in enumerate(names):
                self._build(path + (i,), node[name], level + 1)

    @property
    def depth(self) -> int:
        return len(self.columns)

    @property
    def fanout(self) -> int:
        return self._fanout

    @property
    def input_columns(self) -> tuple[str, ...]:
        return self.columns

    @property
    def output_columns(self) -> tuple[str, ...]:
        return self.columns

    def encode(self, columns: Mapping[str, pd.Series]) -> tuple[np.ndarray, list[tuple[int, str]]]:
        cols = [columns[c].tolist() for c in self.columns]
        n = len(cols[0])
        rows: list[list[int]] = []
        bad: list[tuple[int, str]] = []
        for i in range(n):
            path: tuple[int, ...] = ()
            reason = None
            for level, c in enumerate(self.columns):
                idx = self._index[path].get(str(cols[level][i]))
                if idx is None and isinstance(cols[level][i], float) and cols[level][i].is_integer():
                    idx = self._index[path].get(str(int(cols[level][i])))  # 1.0 -> "1", as codes
                if idx is None:
                    v = cols[level][i]
                    missing = v is None or (isinstance(v, float) and math.isnan(v))
                    reason = (f"{c} is missing" if missing else f"{c} value {str(v)[:40]!r} is not "
                              f"declared") + f" under {self._names(path)}"
                    break
                path = path + (idx,)
            if reason is None:
                rows.append([p + 1 for p in path])
            else:
                bad.append((i, reason))
        codes = np.array(rows, dtype=self.symbol_dtype).reshape(len(rows), self.depth)
        return codes, bad

    def _names(self, path: tuple[int, ...]) -> str:
        out, p = [], ()
        for i in path:
            out.append(self._children[p][i])
            p = p + (i,)
        return " > ".join(out) or "the root"

    def valid_children(self, prefixes: np.ndarray) -> np.ndarray:
        m = prefixes.shape[0]
        out = np.zeros((m, self.fanout), dtype=bool)
        for r, row in enumerate(np.asarray(prefixes, dtype=np.int64).tolist()):
            out[r, : len(self._children.get(tuple(s - 1 for s in row), []))] = True
        return out

    def decode(self, prefixes: np.ndarray, rs: Any) -> dict[str, np.ndarray]:
        prefixes = np.asarray(prefixes, dtype=np.int64)
        m, k = prefixes.shape
        out = {c: np.empty(m, dtype=object) for c in self.columns}
        draws = rs.uniform((m, max(self.depth - k, 1))) if m else np.zeros((0, 1))
        for r in range(m):
            path = tuple(int(s) - 1 for s in prefixes[r])
            for j in range(k, self.depth):
                kids = self._children[path]
                path = path + (min(int(draws[r, j - k] * len(kids)), len(kids) - 1),)
            p: tuple[int, ...] = ()
            for level, i in enumerate(path):
                out[self.columns[level]][r] = self._children[p][i]
                p = p + (i,)
        return out

    def labels(self, prefixes: np.ndarray) -> list[str]:
        return [self._names(tuple(int(s) - 1 for s in row)).replace(" > ", "/")
                for row in np.asarray(prefixes).tolist()]

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "hierarchy", "columns": list(self.columns), "tree": self.tree}


# -- declarations ------------------------------------------------------------------------------------
_TEXT_KEYS = {"kind", "column", "alphabet", "max_length", "casefold", "char_map", "on_other",
              "on_too_long", "strip"}
_SPATIAL_KEYS = {"kind", "columns", "box", "depth", "on_outside"}
_HIER_KEYS = {"kind", "columns", "tree", "tree_file"}


def key_codec_from_spec(spec: Mapping[str, Any], *, base_dir: Path | None = None) -> KeyCodec:
    """Build a codec from a declaration mapping (the YAML ``key:`` block; see docs/prefixes.md)."""
    if not isinstance(spec, Mapping):
        raise KeySpecError(f"a key declaration must be a mapping, got {type(spec).__name__}")
    kind = spec.get("kind")
    allowed = {"text": _TEXT_KEYS, "spatial": _SPATIAL_KEYS, "hierarchy": _HIER_KEYS}.get(str(kind))
    if allowed is None:
        raise KeySpecError(f"key kind ({kind!r}) must be one of 'text', 'spatial', 'hierarchy'")
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise KeySpecError(f"unknown fields for a {kind} key: {unknown} (allowed: {sorted(allowed)})")
    args = {k: v for k, v in spec.items() if k != "kind"}
    try:
        if kind == "text":
            return TextKeyCodec(**args)
        if kind == "spatial":
            if args.get("box") == "world":
                args["box"] = WORLD_BOX
            return SpatialKeyCodec(**args)
        if "tree_file" in args:
            path = Path(args.pop("tree_file"))
            if base_dir is not None and not path.is_absolute():
                path = base_dir / path
            args["tree"] = load_tree(path)
        return HierarchyKeyCodec(**args)
    except TypeError as exc:
        raise KeySpecError(f"{kind} key: {exc}") from exc


def load_tree(path: str | Path) -> Any:
    """A hierarchy tree from YAML with every value read as a string.

    YAML 1.1 would read ``ON``, ``NO`` or ``YES`` (Ontario, Norway, ...) as booleans; categories
    are strings, so the tree is parsed with ``BaseLoader``.
    """
    try:
        return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=yaml.BaseLoader)  # noqa: S506
    except (OSError, yaml.YAMLError) as exc:
        raise KeySpecError(f"tree {str(path)!r}: cannot read: {exc}") from exc


def load_key_spec(path: str | Path) -> KeyCodec:
    """Load a key declaration from a YAML/JSON file with a top-level ``key:`` mapping."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        raise KeySpecError(f"key spec {str(p)!r}: cannot read: {exc}") from exc
    if not isinstance(data, Mapping) or "key" not in data:
        raise KeySpecError(f"key spec {str(p)!r}: needs a top-level 'key:' mapping")
    spec = dict(data["key"]) if isinstance(data["key"], Mapping) else data["key"]
    if isinstance(spec, dict) and spec.get("kind") == "hierarchy" and "tree" in spec:
        spec["tree"] = yaml.load(text, Loader=yaml.BaseLoader)["key"]["tree"]  # categories as strings
    return key_codec_from_spec(spec, base_dir=p.parent)
