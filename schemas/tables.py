"""Arrow shapes of beamsynth's output tables (Beam-free).

* :func:`arrow_schema_for`: the ``pyarrow`` schema of the synthetic tables of a
  :class:`~beamsynth.schemas.schema.Schema` (column types and nullability from the declared
  schema, never from data).
* :func:`label_part` / :func:`part_label`: a stable identity (window and sampling shard) stored in
  a table's schema metadata, which orders the table in a single-file write
  (:mod:`beamsynth.pipelines.io.single_file`).

They live here, below both ``transforms/`` (sampling labels its tables) and ``pipelines/``
(writers read the labels), so neither layer imports the other.
"""

from __future__ import annotations

import pyarrow as pa

from beamsynth.schemas.schema import Schema

__all__ = ["NULL_TOKEN_KEY", "PART_LABEL_KEY", "arrow_schema_for", "label_part", "null_token",
           "part_label"]

PART_LABEL_KEY = b"beamsynth.part"
NULL_TOKEN_KEY = b"beamsynth.null"


def arrow_schema_for(schema: Schema) -> pa.Schema:
    """Arrow schema of synthetic output tables.

    Integers are ``int64`` (nullable ones too: Arrow keeps the nulls beside the integers, never
    as ``501.0``), floats ``float64``, everything else ``string`` (datetimes in the declared
    granularity's ISO form). A nullable column's field carries its first declared null token
    (:data:`NULL_TOKEN_KEY` metadata, ``""`` if none is declared): text formats write nulls as that
    token so the same schema reads them back as nulls; typed formats write real nulls.
    """
    types = {"categorical": pa.string(), "string": pa.string(), "text": pa.string(),
             "datetime": pa.string(), "integer": pa.int64(), "float": pa.float64()}
    fields = []
    for c in schema.columns:
        meta = None
        if c.nullable:
            token = c.null_values[0] if c.null_values else ""
            meta = {NULL_TOKEN_KEY: token.encode("utf-8")}
        fields.append(pa.field(c.name, types[c.type], nullable=c.nullable, metadata=meta))
    return pa.schema(fields)


def null_token(field: pa.Field) -> str:
    """The token a text format writes for a null in ``field`` (``""`` unless declared)."""
    meta = field.metadata or {}
    return meta.get(NULL_TOKEN_KEY, b"").decode("utf-8")


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
