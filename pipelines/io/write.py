"""Writing tables: :class:`WriteTables` (``PCollection[pyarrow.Table]`` → one csv/jsonl/avro/parquet
file, streamed through :mod:`beamsynth.pipelines.io.single_file`, or Beam's sharded sinks).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa

from beamsynth.pipelines.io.formats import avro_records as _avro_records
from beamsynth.pipelines.io.formats import csv_escape as _csv_escape
from beamsynth.pipelines.io.formats import table_to_csv_text
from beamsynth.pipelines.io.formats import table_to_jsonl as _table_to_jsonl
from beamsynth.pipelines.io.records import detect_format
from beamsynth.transforms.conventions import display_items, element_types

__all__ = [
    "WriteTables",
]


# -- writing --------------------------------------------------------------------------------------
@element_types(input=pa.Table, output=str)
class WriteTables(beam.PTransform):
    """Write ``PCollection[pyarrow.Table]`` to one file (format from the extension).

    ``avro_schema`` is needed for ``.avro`` output, ``arrow_schema`` for ``.parquet``.

    With ``num_shards=1`` (the default) the write streams
    (:class:`~beamsynth.pipelines.io.single_file.WriteSingleFile`): each table goes to its own part
    file where it is produced, only part paths are grouped, and one worker concatenates the parts
    into the output file; memory stays flat in the number of rows (Beam's single-shard sinks
    group every row under one key, which the DirectRunner holds in memory). Parts are ordered by
    their :func:`~beamsynth.pipelines.io.single_file.label_part` label (sampling window and shard),
    then by content, so the row order does not depend on the runner. Empty input writes an empty
    file (csv: the header).

    ``num_shards`` other than 1 uses Beam's sharded sinks (``-SSSSS-of-NNNNN`` file names).
    """

    def __init__(self, path: str, *, column_names: Sequence[str], avro_schema: dict | None = None,
                 arrow_schema: pa.Schema | None = None, num_shards: int = 1,
                 label: str | None = None) -> None:
        super().__init__(label)
        self._path = path
        self._fmt = detect_format(path)
        self._names = list(column_names)
        self._avro = avro_schema
        self._arrow = arrow_schema
        self._shards = num_shards
        if self._fmt == "avro" and avro_schema is None:
            raise ValueError("writing .avro needs avro_schema")
        if self._fmt == "parquet" and arrow_schema is None:
            raise ValueError("writing .parquet needs arrow_schema")

    def _template(self) -> str:
        return "" if self._shards == 1 else "-SSSSS-of-NNNNN"

    def display_data(self) -> dict[str, Any]:
        """Output path, format and sharding (no data values)."""
        return display_items(step="write tables", path=self._path, format=self._fmt,
                             columns=len(self._names), num_shards=self._shards)

    def expand(self, tables):
        if self._shards == 1:
            return self._expand_single_file(tables)
        if self._fmt == "csv":
            header = ",".join(_csv_escape(n) for n in self._names) + "\n"
            return (
                tables
                | "ToCsv" >> beam.Map(table_to_csv_text)
                | "WriteCsv" >> beam.io.WriteToText(
                    self._path, num_shards=self._shards, shard_name_template=self._template(),
                    header=header, append_trailing_newlines=False)
            )
        if self._fmt == "jsonl":
            return (
                tables
                | "ToJsonl" >> beam.Map(_table_to_jsonl)
                | "WriteJsonl" >> beam.io.WriteToText(
                    self._path, num_shards=self._shards, shard_name_template=self._template(),
                    append_trailing_newlines=False)
            )
        if self._fmt == "avro":
            renamed = [f["name"] for f in self._avro["fields"]]
            return (
                tables
                | "ToRecords" >> beam.FlatMap(_avro_records, renamed)
                | "WriteAvro" >> beam.io.WriteToAvro(
                    self._path, schema=self._avro, num_shards=self._shards,
                    shard_name_template=self._template())
            )
        return tables | "WriteParquet" >> beam.io.WriteToParquetBatched(
            self._path, schema=self._arrow, num_shards=self._shards,
            shard_name_template=self._template())

    def _expand_single_file(self, tables):
        from beamsynth.pipelines.io.single_file import WriteSingleFile

        return tables | "SingleFile" >> WriteSingleFile(
            self._path, fmt=self._fmt, column_names=self._names, avro_schema=self._avro,
            arrow_schema=self._arrow)


def ensure_parent(path: str) -> None:
    """Create the folder of a local output path."""
    parent = os.path.dirname(os.path.abspath(path))
    if "://" not in path:
        os.makedirs(parent, exist_ok=True)
