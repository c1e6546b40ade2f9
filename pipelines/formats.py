"""Encoding ``pyarrow`` tables as the bytes of the output formats (Beam-free).

Shared by :class:`~beamsynth.pipelines.io.WriteTables` and the single-file writers of
:mod:`beamsynth.pipelines.single_file` (which ``io`` uses), so that neither of those two modules
imports the other at module level and they form no import cycle.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa

__all__ = ["FORMATS", "avro_records", "csv_escape", "table_to_csv_text", "table_to_jsonl"]

FORMATS = ("csv", "jsonl", "avro", "parquet")


def table_to_csv_text(table: pa.Table) -> str:
    """CSV lines (no header) of a table, each ending in a newline."""
    df = table.to_pandas()
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
