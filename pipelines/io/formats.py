"""Encoding ``pyarrow`` tables as the bytes of the output formats (Beam-free).

Shared by :class:`~beamsynth.pipelines.io.write.WriteTables` and the single-file writers of
:mod:`beamsynth.pipelines.io.single_file` (which ``io`` uses), so that neither of those two modules
imports the other at module level and they form no import cycle.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from beamsynth.schemas.tables import null_token

__all__ = ["FORMATS", "avro_records", "csv_escape", "table_to_csv_text", "table_to_jsonl"]

FORMATS = ("csv", "jsonl", "avro", "parquet")


def _csv_column(column: pa.ChunkedArray, field: pa.Field) -> Any:
    """One column as CSV-ready values: integers stay integers (never ``501.0``), floats keep
    their shortest exact form, nulls become the field's declared null token
    (:func:`~beamsynth.schemas.tables.null_token`)."""
    if column.null_count == 0:
        return column.to_pandas()
    if pa.types.is_integer(column.type):
        text = pc.cast(column, pa.string())
    elif pa.types.is_floating(column.type):
        text = pa.array([None if v is None else repr(float(v)) for v in column.to_pylist()],
                        type=pa.string())
    else:
        text = column if pa.types.is_string(column.type) else pc.cast(column, pa.string())
    return pc.fill_null(text, null_token(field)).to_pandas()


def table_to_csv_text(table: pa.Table) -> str:
    """CSV lines (no header) of a table, each ending in a newline.

    Values are written so that the schema that produced the table reads them back unchanged:
    integers as integers, nulls as the column's first declared null token (see
    :func:`~beamsynth.schemas.tables.arrow_schema_for`), labels exactly.
    """
    df = pd.DataFrame({f.name: _csv_column(table.column(i), f)
                       for i, f in enumerate(table.schema)}, columns=table.schema.names)
    buf = io.StringIO()
    df.to_csv(buf, header=False, index=False, lineterminator="\n")
    return buf.getvalue()


def table_to_jsonl(table: pa.Table) -> str:
    """One JSON object per row, each line ending in a newline (non-ASCII kept as is)."""
    return "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in table.to_pylist())


def avro_records(table: pa.Table, field_names: list[str]) -> list[dict[str, Any]]:
    """Rows of a table keyed by Avro field names (same order as the table's columns)."""
    return table.rename_columns(field_names).to_pylist()


def csv_escape(value: str) -> str:
    """``value`` as one CSV field: quoted (inner quotes doubled) if it holds a comma, a quote or
    a line break."""
    if any(ch in value for ch in ',"\n\r'):
        return '"' + value.replace('"', '""') + '"'
    return value
