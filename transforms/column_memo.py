"""Memoized column encoding for user elements: each distinct raw value is encoded once per worker.

A PCollection of dicts (``ReadFromText | Map(json.loads)``) carries one Python object per value,
and a column of a declared schema repeats a few distinct values many times. :class:`SchemaMemo`
keeps, per column, a table from raw value to the cell code (and the dead-letter reason) that
:meth:`Column.encode <beamsynth.schemas.schema.Column.encode>` gives that value, and encodes a
batch column with one C-level lookup per value (``np.fromiter(map(table.__getitem__, values))``;
for records, straight from the records with ``operator.itemgetter``, no column list in between).
Values not seen before are encoded together with ``Column.encode`` and remembered.

Exactness: the result equals ``Column.encode`` on the same values (codes and reasons), because

* ``Column.encode`` is a function of each value alone (null tokens, normalisation, parsing and the
  declared domain; nothing is learned from the batch), and a table stores exactly its answer;
* a table only holds keys whose equality means the same value: the *text* table holds ``str``
  values and ``None`` only, so any value found there is a string or ``None`` (``True == 1`` and
  ``1.0 == 1`` never equal a string), and it is looked up without checking types; the *typed*
  table also holds one of ``int``/``bool`` and is used only for a batch column whose value types
  were checked to be ``str``/``None`` and that one number type (emptied when it changes). A column
  holding floats (``-0.0 == 0.0``), both ints and bools, or any other type is encoded by
  ``Column.encode`` directly, without a table.

Nothing here reads the data to learn a domain: the tables cache a declared, data-independent
function, bounded in size (:data:`MAX_MEMO`, emptied when full), and are never released.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import chain, repeat
from typing import Any

import numpy as np
import pandas as pd

from beamsynth.schemas.schema import Column, Schema

__all__ = ["MAX_MEMO", "ColumnMemo", "SchemaMemo"]

MAX_MEMO = 65_536  # distinct values remembered per column (emptied, then refilled, when exceeded)
_TEXT_TYPES = frozenset({str, type(None)})
_NUMBER_TYPES = frozenset({int, bool})


def _object_array(values: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values) if not isinstance(values, list) else values
    return arr


class ColumnMemo:
    """``Column.encode`` of one column with a per-worker table of distinct values.

    Args:
      column: the declared column.
      max_size: distinct values kept (the table is emptied when a batch would exceed it).
    """

    def __init__(self, column: Column, *, max_size: int = MAX_MEMO) -> None:
        if not isinstance(column, Column):
            raise TypeError(f"column must be a Column, got {type(column).__name__} ({column!r})")
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size ({max_size!r}) must be an int >= 1")
        self.column = column
        self._max = max_size
        self._text: dict[Any, int] = {}   # str / None keys only
        self._typed: dict[Any, int] = {}  # str / None and one number type (self._number)
        self._number: type | None = None
        self._text_why: dict[Any, str] = {}  # reasons of rejected values, per table
        self._typed_why: dict[Any, str] = {}
        self.settled = True  # the last call found every value in the text table (encode_rows)

    def __len__(self) -> int:
        return len(self._text) + len(self._typed)

    def _table_for(self, values: list[Any]) -> dict[Any, int] | None:
        """The table that may answer for ``values`` (``None``: encode them directly)."""
        types = set(map(type, values))
        if types <= _TEXT_TYPES:
            return self._text
        numbers = types & _NUMBER_TYPES
        if len(numbers) != 1 or not types <= _TEXT_TYPES | numbers:
            return None
        number = numbers.pop()
        if self._number is not number:
            self._typed.clear()
            self._typed_why.clear()
            self._number = number
        return self._typed

    def _reasons(self, table: dict[Any, int]) -> dict[Any, str]:
        return self._text_why if table is self._text else self._typed_why

    def _learn(self, table: dict[Any, int], values: list[Any]) -> None:
        """Encode the distinct values of ``values`` missing from ``table``, and remember them."""
        distinct = dict.fromkeys(values)
        new = [v for v in distinct if v not in table]
        why = self._reasons(table)
        if len(table) + len(new) > self._max:
            table.clear()
            why.clear()
            new = list(distinct)
        codes, reasons = self.column.encode(pd.Series(_object_array(new), dtype=object, copy=False))
        table.update(zip(new, codes.tolist()))
        for i, reason in reasons.items():
            why[new[i]] = reason

    def _finish(self, codes: np.ndarray, table: dict[Any, int], value_at: Any
                ) -> tuple[np.ndarray, dict[int, str]]:
        why = self._reasons(table)
        if not why:
            return codes, {}
        return codes, {i: why[value_at(i)] for i in np.flatnonzero(codes < 0).tolist()}

    def encode(self, values: Sequence[Any]) -> tuple[np.ndarray, dict[int, str]]:
        """Cell codes (int64) and ``{position: reason}``, exactly as ``Column.encode(values)``."""
        values = values.tolist() if isinstance(values, (pd.Series, np.ndarray)) else list(values)
        n = len(values)
        table = self._table_for(values)
        self.settled = False
        if table is None:
            return self.column.encode(pd.Series(_object_array(values), dtype=object, copy=False))
        try:
            codes = np.fromiter(map(table.__getitem__, values), dtype=np.int64, count=n)
            self.settled = table is self._text
        except KeyError:
            self._learn(table, values)
            codes = np.fromiter(map(table.__getitem__, values), dtype=np.int64, count=n)
        return self._finish(codes, table, values.__getitem__)

    def encode_records(self, records: Sequence[Any], field: str
                       ) -> tuple[np.ndarray, dict[int, str]] | None:
        """``encode([r[field] for r in records])`` when every value is already in the text table
        (one C loop over the records); ``None`` otherwise (a field missing, or a value not seen or
        not text: gather the column and call :meth:`encode`)."""
        get = operator.itemgetter(field)
        try:
            codes = np.fromiter(map(self._text.__getitem__, map(get, records)), dtype=np.int64,
                                count=len(records))
        except (KeyError, TypeError):
            self.settled = False
            return None
        self.settled = True
        return self._finish(codes, self._text, lambda i: records[i][field])


class SchemaMemo:
    """One :class:`ColumnMemo` per declared column of ``schema`` (create one per worker/DoFn)."""

    def __init__(self, schema: Schema, *, max_size: int = MAX_MEMO) -> None:
        if not isinstance(schema, Schema):
            raise TypeError(f"schema must be a Schema, got {type(schema).__name__} ({schema!r})")
        self.schema = schema
        self.columns = [ColumnMemo(c, max_size=max_size) for c in schema.columns]
        self._misses = self._skip = 0  # encode_rows: consecutive misses, calls left to skip

    def encode(self, j: int, values: Sequence[Any]) -> tuple[np.ndarray, dict[int, str]]:
        """Column ``j``'s codes and reasons for ``values`` (see :meth:`ColumnMemo.encode`)."""
        return self.columns[j].encode(values)

    def encode_records(self, j: int, records: Sequence[Any], field: str
                       ) -> tuple[np.ndarray, dict[int, str]] | None:
        """Column ``j`` straight from the records (see :meth:`ColumnMemo.encode_records`)."""
        return self.columns[j].encode_records(records, field)

    def encode_rows(self, records: Sequence[Any], fields: Sequence[str]
                    ) -> dict[int, tuple[np.ndarray, dict[int, str]]]:
        """``{j: encode_records(j, records, fields[j])}`` for the settled columns (those whose
        last :meth:`ColumnMemo.encode_records` found every value), in one C loop over the records:
        a record's fields are looked up in their text tables while it is in cache, instead of one
        pass over all the records per column. Empty when a field is missing or a value is not in
        its text table (then go column by column, which learns the new values and settles the
        columns again); after such a miss the next attempts are skipped (1, 2, 4, ... up to 32
        calls). Same codes and reasons as :meth:`encode_records`.
        """
        if len(fields) != len(self.columns):
            raise ValueError(f"fields ({list(fields)!r}) must name the {len(self.columns)} "
                             "declared columns")
        js = [j for j, c in enumerate(self.columns) if c.settled]
        if self._skip or len(js) < 2:
            self._skip = max(self._skip - 1, 0)
            return {}
        n, k = len(records), len(js)
        tables = [self.columns[j]._text for j in js]
        get = operator.itemgetter(*(fields[j] for j in js))
        try:
            flat = np.fromiter(chain.from_iterable(map(
                map, repeat(dict.__getitem__), repeat(tables), map(get, records))),
                dtype=np.int64, count=n * k)
        except (KeyError, TypeError):
            self._misses = min(self._misses * 2 + 1, 32)
            self._skip = self._misses
            return {}
        self._misses = 0
        codes = flat.reshape(n, k)
        out = {}
        for col, j in enumerate(js):
            c, field = self.columns[j], fields[j]
            out[j] = c._finish(codes[:, col], c._text, lambda i, f=field: records[i][f])
        return out
