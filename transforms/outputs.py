"""Schema'd ``beam.Row`` outputs that Beam's standard sinks take directly (post-processing only).

Every function here reads released (DP) values only: noisy counts, noisy marginals, CatHist
releases, released prefix trees and synthetic tables. Field names are the declared column names
made identifiers (:func:`~beamsynth.schemas.schema.avro_field_name`: ``education-num`` →
``education_num``), field types follow the schema (categorical/string/text/datetime → ``str``,
integer → ``int``, float → ``float``; ``Optional`` when the column is nullable).

* synthetic records: one field per declared column;
* a marginal: one row per declared cell, ``(labels..., noisy_count)`` (every cell, empty ones
  included, so the number of rows is public); binned numeric columns are labelled by the bin's
  lower edge;
* a histogram (CatHist): ``(value, noisy_count)`` per released cell;
* a count: ``(noisy_count,)``;
* prefix trees: released nodes ``(depth, prefix, noisy_count, leaf)`` and synthetic keys.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.typehints.row_type import RowTypeConstraint

from beamsynth.schemas.keys import KeyCodec, SpatialKeyCodec
from beamsynth.schemas.schema import Column, Schema, avro_field_name
from beamsynth.transforms.cathist import ReleasedHistogram
from beamsynth.transforms.measure import NoisyMarginal

__all__ = [
    "COUNT_FIELD",
    "COUNT_TYPE",
    "TREE_TYPE",
    "level_order",
    "table_order",
    "arrow_schema",
    "column_field",
    "count_row",
    "histogram_rows",
    "histogram_type",
    "key_rows",
    "key_type",
    "marginal_rows",
    "marginal_type",
    "record_type",
    "table_rows",
    "tree_rows",
]

COUNT_FIELD = "noisy_count"
COUNT_TYPE = RowTypeConstraint.from_fields([(COUNT_FIELD, int)])
TREE_TYPE = RowTypeConstraint.from_fields(
    [("depth", int), ("prefix", str), (COUNT_FIELD, Optional[int]), ("leaf", bool)])  # noqa: UP045
_PY = {"categorical": str, "string": str, "text": str, "datetime": str, "integer": int,
       "float": float}


def column_field(column: Column) -> tuple[str, Any]:
    """``(field name, Python type)`` of a column in output rows."""
    py = _PY[column.type]
    return avro_field_name(column.name), (Optional[py] if column.nullable else py)  # noqa: UP045


_ARROW = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def arrow_schema(rows: Schema | beam.PCollection | RowTypeConstraint) -> pa.Schema:
    """pyarrow schema of output rows as dicts (``r._asdict()``), for ``WriteToParquet``.

    Takes a declared :class:`Schema` (synthetic records) or any beamsynth output PCollection (or
    its row type): marginals, histograms, counts, prefix keys, trees, synthetic records and dead
    letters. Under declared windows every release row also carries ``window_start``, which only
    the PCollection's schema has: pass the PCollection (``bs.arrow_schema(synthetic)``), since
    ``WriteToParquet`` drops a key its schema lacks without a word (H87: 60 synthetic rows of
    three declared days written with ``bs.arrow_schema(schema)`` had no ``window_start``).
    """
    if isinstance(rows, Schema):
        rows = record_type(rows)
    if isinstance(rows, beam.PCollection):
        rows = rows.element_type
    if not isinstance(rows, RowTypeConstraint):
        way_out = ""
        if isinstance(rows, str):  # bs.arrow_schema("adult"): a schema's name or file
            way_out = f"; for a schema's records pass bs.arrow_schema(bs.load_schema({rows!r}))"
        elif hasattr(rows, "exact_batches"):  # job.private's output: no rows to write yet
            way_out = ("; a private collection is no output: pass a release of it "
                    "(bs.arrow_schema(synthetic), bs.arrow_schema(tables['age'])) or its schema")
        raise TypeError(f"arrow_schema takes a Schema or a PCollection of beamsynth rows, got "
                        f"{type(rows).__name__} ({rows!r}){way_out}")
    fields = []
    for name, hint in rows._fields:
        args = [a for a in getattr(hint, "__args__", ()) if a is not type(None)]
        py, nullable = (args[0], True) if args else (hint, False)
        fields.append(pa.field(name, _ARROW[py], nullable=nullable))
    return pa.schema(fields)


def record_type(schema: Schema) -> RowTypeConstraint:
    """Row type of synthetic records: one field per declared column."""
    return RowTypeConstraint.from_fields([column_field(c) for c in schema.columns])


def marginal_type(schema: Schema, names: Sequence[str]) -> RowTypeConstraint:
    """Row type of a marginal over columns ``names``: their fields, then ``noisy_count``."""
    return RowTypeConstraint.from_fields(
        [column_field(schema.column(n)) for n in names] + [(COUNT_FIELD, int)])


def histogram_type(column: Column) -> RowTypeConstraint:
    """Row type of a histogram of ``column``: ``(value field, noisy_count)``."""
    return RowTypeConstraint.from_fields([column_field(column), (COUNT_FIELD, int)])


def key_type(codec: KeyCodec) -> RowTypeConstraint:
    """Row type of synthetic keys: floats for spatial coordinates, strings otherwise."""
    py = float if isinstance(codec, SpatialKeyCodec) else str
    return RowTypeConstraint.from_fields([(avro_field_name(c), py) for c in codec.output_columns])


def _typed(column: Column, values: Iterable[Any]) -> list[Any]:
    py = _PY[column.type]
    return [None if v is None else py(v) for v in values]


def table_rows(table: pa.Table, schema: Schema) -> Iterable[beam.Row]:
    """Synthetic records of a pyarrow Table (columns named as the schema) as ``beam.Row``s."""
    fields = [avro_field_name(n) for n in schema.names]
    cols = [table.column(n).to_pylist() for n in schema.names]
    for values in zip(*cols):
        yield beam.Row(**dict(zip(fields, values)))


def table_order(table: pa.Table) -> _TableKey:
    """Order key of a released table among its release's tables (``release_rows(order=)``): the
    part label it carries (a plausible shard's; window and shard zero-padded), then its size, then
    its content (unlabelled tables, e.g. decoded prefix keys). Released values only.

    The content is read only to order two unlabelled tables of one size (H89: before, every
    table's content became one JSON text, ~all of a window's synthetic keys at once)."""
    from beamsynth.schemas.tables import part_label

    return _TableKey(part_label(table), table)


@functools.total_ordering
class _TableKey:
    """``(label, rows, content)`` compared in that order; ``content`` made when first needed."""

    __slots__ = ("_content", "_table", "label", "rows")

    def __init__(self, label: str, table: pa.Table) -> None:
        self.label, self.rows, self._table = label, table.num_rows, table
        self._content: str | None = "" if label else None

    def _key(self) -> tuple[str, int, str]:
        if self._content is None:
            self._content = _content_key(self._table)
        return self.label, self.rows, self._content

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _TableKey):
            return NotImplemented
        return (self.label, self.rows) == (other.label, other.rows) and self._key() == other._key()

    def __lt__(self, other: _TableKey) -> bool:
        if (self.label, self.rows) != (other.label, other.rows):
            return (self.label, self.rows) < (other.label, other.rows)
        return self._key() < other._key()

    __hash__ = None  # type: ignore[assignment]  # an order key, never a dict key


def level_order(release: Any) -> tuple[int, bytes]:
    """Order key of a released prefix-tree level (``LevelRelease``): depth, then its first node's
    prefix codes (levels split into parts hold disjoint prefixes)."""
    prefixes = np.asarray(release.prefixes)
    first = prefixes[:1].astype(np.int64).tobytes() if prefixes.size else b""
    return int(release.depth), first


def _content_key(table: pa.Table) -> str:
    import json

    return json.dumps(table.to_pydict(), sort_keys=True, default=str)


def count_row(noisy_count: Any) -> beam.Row:
    """A released :class:`~beamsynth.transforms.synthesis.NoisyCount` as ``(noisy_count,)``."""
    return beam.Row(**{COUNT_FIELD: int(noisy_count.value)})


def marginal_rows(marginal: NoisyMarginal, schema: Schema) -> Iterable[beam.Row]:
    """Every cell of a noisy marginal as ``(labels..., noisy_count)`` in cell order."""
    columns = [schema.column(n) for n in marginal.names]
    fields = [avro_field_name(c.name) for c in columns] + [COUNT_FIELD]
    labels = [_typed(c, c.decode(np.arange(c.cells, dtype=np.int64))) for c in columns]
    flat = marginal.values.reshape(-1).tolist()
    for values, count in zip(itertools.product(*labels), flat):
        yield beam.Row(**dict(zip(fields, (*values, int(count)))))


def histogram_rows(released: ReleasedHistogram, column: Column) -> Iterable[beam.Row]:
    """A CatHist release as ``(value, noisy_count)`` rows, largest counts first."""
    order = np.lexsort((released.cells, -released.counts))
    cells = released.cells[order]
    values = _typed(column, column.decode(cells)) if cells.size else []
    field = avro_field_name(column.name)
    for v, c in zip(values, released.counts[order].tolist()):
        yield beam.Row(**{field: v, COUNT_FIELD: int(c)})


def tree_rows(release: Any, codec: KeyCodec) -> Iterable[beam.Row]:
    """Released prefix-tree nodes as ``(depth, prefix, noisy_count, leaf)``; a withheld count is
    ``None``."""
    labels = codec.labels(release.prefixes)
    for label, count, leaf in zip(labels, release.counts.tolist(), release.leaf.tolist()):
        yield beam.Row(depth=int(release.depth), prefix=str(label),
                       **{COUNT_FIELD: None if count < 0 else int(count)}, leaf=bool(leaf))


def key_rows(table: pa.Table, codec: KeyCodec) -> Iterable[beam.Row]:
    """Synthetic keys (a pyarrow Table of the codec's output columns) as ``beam.Row``s."""
    py = float if isinstance(codec, SpatialKeyCodec) else str
    names = list(codec.output_columns)
    fields = [avro_field_name(n) for n in names]
    cols = [table.column(n).to_pylist() for n in names]
    for values in zip(*cols):
        yield beam.Row(**{f: (None if v is None else py(v)) for f, v in zip(fields, values)})
