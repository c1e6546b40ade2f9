"""Arrow shapes of beamsynth's output tables (Beam-free).

* :func:`arrow_schema_for`: the ``pyarrow`` schema of the synthetic tables of a
  :class:`~beamsynth.schemas.schema.Schema` (column types and nullability from the declared
  schema, never from data).
* :func:`label_part` / :func:`part_label`: a stable identity (window and sampling shard) stored in
  a table's schema metadata, which orders the table in a single-file write
  (:mod:`beamsynth.pipelines.single_file`).

They live here, below both ``transforms/`` (sampling labels its tables) and ``pipelines/``
(writers read the labels), so neither layer imports the other.
"""

from __future__ import annotations

import pyarrow as pa

from beamsynth.schemas.schema import Schema

__all__ = ["PART_LABEL_KEY", "arrow_schema_for", "label_part", "part_label"]

PART_LABEL_KEY = b"beamsynth.part"


def arrow_schema_for(schema: Schema) -> pa.Schema:
    """Arrow schema of synthetic output tables."""
    types = {"categorical": pa.string(), "string": pa.string(), "text": pa.string(),
             "datetime": pa.string(), "integer": pa.int64(), "float": pa.float64()}
    return pa.schema([pa.field(c.name, types[c.type], nullable=c.nullable) for c in schema.columns])


def label_part(table: pa.Table, label: str) -> pa.Table:
    """``table`` tagged with a stable identity (e.g. window + sampling shard) that orders it in a
    single-file write (labels compare as strings: zero-pad numbers)."""
    meta = dict(table.schema.metadata or {})
    meta[PART_LABEL_KEY] = label.encode("utf-8")
    return table.replace_schema_metadata(meta)


def part_label(table: pa.Table) -> str:
    """The label :func:`label_part` put on ``table`` (``""`` if none)."""
    meta = table.schema.metadata or {}
    return meta.get(PART_LABEL_KEY, b"").decode("utf-8")
