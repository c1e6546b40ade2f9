"""A streaming single-file write of ``pyarrow.Table`` elements (``WriteTables(num_shards=1)``).

Beam's single-shard sinks (``WriteToText(num_shards=1)``, ``WriteToAvro``, ``WriteToParquetBatched``)
key every element with the same key and group them, so the whole output passes through one
``GroupByKey``, which the DirectRunner (FnApiRunner) holds in memory: the peak memory of a
``synthesize`` run grew with the number of synthetic rows. Here the rows never cross a shuffle:

1. ``WriteParts``: every table is written to its own part file in a temporary folder next to the
   output as soon as it arrives (fused with the step producing it), and only
   ``(label, digest, path)`` goes on;
2. ``GroupParts``: the part paths (plus one marker, so empty input still writes a file) are
   grouped under one key;
3. ``Concatenate``: one worker writes the output, streaming part by part (csv: header + part
   bytes, jsonl: part bytes, avro: the parts' blocks, parquet: the parts' row groups) under a
   temporary name, renames it to the output path and deletes the temporary folder.

Memory is one table per worker plus a copy buffer. Parts are ordered by the label that
:func:`label_part` put on their table (``SampleSynthetic``: window and sampling shard), then by a
digest of their bytes, so the row order of the file does not depend on the runner, the number
of workers or arrival order. Only Create/ParDo/Flatten/GroupByKey are used and nothing is
emitted from ``finish_bundle`` (Beam's DaskRunner, docs/runners.md).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beamsynth.pipelines.io import (
    FORMATS,
    _avro_records,
    _csv_escape,
    _table_to_jsonl,
    table_to_csv_text,
)

__all__ = ["PART_LABEL_KEY", "WriteSingleFile", "label_part", "part_label"]

PART_LABEL_KEY = b"beamsynth.part"
_COPY_BYTES = 1 << 20


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


class _PartCodec:
    """The bytes of one part file, and the concatenation of part files into the output file."""

    def __init__(self, fmt: str, names: Sequence[str], avro: dict | None,
                 arrow: pa.Schema | None) -> None:
        self.fmt, self._names, self._avro, self._arrow = fmt, list(names), avro, arrow

    def encode(self, table: pa.Table) -> bytes:
        table = table.replace_schema_metadata(None)
        if self.fmt == "csv":
            return table_to_csv_text(table).encode("utf-8")
        if self.fmt == "jsonl":
            return _table_to_jsonl(table).encode("utf-8")
        buf = io.BytesIO()
        if self.fmt == "avro":
            import fastavro

            fields = [f["name"] for f in self._avro["fields"]]
            fastavro.writer(buf, fastavro.parse_schema(self._avro), _avro_records(table, fields),
                            codec="deflate")
        else:
            import pyarrow.parquet as pq

            pq.write_table(table.cast(self._arrow), buf, compression="none")
        return buf.getvalue()

    def concatenate(self, part_paths: Iterable[str], out: Any) -> None:
        """Write the output file to the binary stream ``out``, one part at a time."""
        if self.fmt in ("csv", "jsonl"):
            if self.fmt == "csv":
                out.write((",".join(_csv_escape(n) for n in self._names) + "\n").encode("utf-8"))
            for part in part_paths:
                with _open_part(part) as f:
                    shutil.copyfileobj(f, out, _COPY_BYTES)
        elif self.fmt == "avro":
            import fastavro
            from fastavro.write import Writer

            writer = Writer(out, fastavro.parse_schema(self._avro), codec="deflate")
            for part in part_paths:
                with _open_part(part) as f:
                    for block in fastavro.block_reader(f):
                        writer.write_block(block)
            writer.flush()
        else:
            import pyarrow.parquet as pq

            with pq.ParquetWriter(out, self._arrow, compression="none") as writer:
                for part in part_paths:
                    with _open_part(part) as f:
                        pf = pq.ParquetFile(f)
                        for i in range(pf.num_row_groups):
                            writer.write_table(pf.read_row_group(i).cast(self._arrow))


def _open_part(path: str) -> Any:
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


class _WritePartFn(beam.DoFn):
    """pyarrow.Table → its own part file; emits ``(label, digest, path)``."""

    def __init__(self, codec: _PartCodec, parts_dir: str) -> None:
        self._codec, self._dir = codec, parts_dir

    def process(self, table: pa.Table):
        data = self._codec.encode(table)
        # a unique name (not a random draw of the output): the part of a retried bundle that
        # failed is never listed, so it is never concatenated
        path = FileSystems.join(self._dir, f"part-{uuid.uuid4().hex}")
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(data)
        yield part_label(table), hashlib.sha256(data).hexdigest(), path


class _ConcatPartsFn(beam.DoFn):
    """All part paths → the output file (written under a temporary name, then renamed)."""

    def __init__(self, codec: _PartCodec, parts_dir: str, path: str) -> None:
        self._codec, self._dir, self._path = codec, parts_dir, path

    def process(self, keyed: tuple[Any, Iterable[tuple[str, str, str] | None]]):
        parts = sorted(p for p in keyed[1] if p is not None)
        staged = FileSystems.join(self._dir, "output")
        compression = (CompressionTypes.detect_compression_type(self._path)
                       if self._codec.fmt in ("csv", "jsonl") else CompressionTypes.UNCOMPRESSED)
        with FileSystems.create(staged, compression_type=compression) as out:
            self._codec.concatenate((p[2] for p in parts), out)
        FileSystems.rename([staged], [self._path])
        try:
            FileSystems.delete([self._dir])
        except (OSError, BeamIOError):  # a leftover temporary folder does not fail the write
            pass
        yield self._path


def _key_part(part: tuple[str, str, str]) -> tuple[None, tuple[str, str, str]]:
    return None, part


class WriteSingleFile(beam.PTransform):
    """``PCollection[pyarrow.Table]`` → one ``fmt`` file at ``path``, streaming (module doc).

    Returns ``PCollection[str]`` holding the output path once it is written. ``avro_schema`` is
    needed for ``avro``, ``arrow_schema`` for ``parquet``. The temporary folder
    (``.beamsynth-temp-<name>-<id>`` next to ``path``) is named when the graph is built.
    """

    def __init__(self, path: str, *, fmt: str, column_names: Sequence[str],
                 avro_schema: dict | None = None, arrow_schema: pa.Schema | None = None,
                 label: str | None = None) -> None:
        super().__init__(label)
        if fmt not in FORMATS:
            raise ValueError(f"fmt ({fmt!r}) must be one of {FORMATS}")
        if fmt == "avro" and avro_schema is None:
            raise ValueError("writing avro needs avro_schema")
        if fmt == "parquet" and arrow_schema is None:
            raise ValueError("writing parquet needs arrow_schema")
        if "://" not in path:  # workers may run in another folder than the launcher
            path = os.path.abspath(path)
        self._path = path
        self._codec = _PartCodec(fmt, column_names, avro_schema, arrow_schema)
        folder, name = FileSystems.split(path)
        self._dir = FileSystems.join(folder, f".beamsynth-temp-{name}-{uuid.uuid4().hex}")

    def expand(self, tables):
        parts = (
            tables
            | "WriteParts" >> beam.ParDo(_WritePartFn(self._codec, self._dir))
            # (label, digest, part path)
            | "GlobalParts" >> beam.WindowInto(beam.window.GlobalWindows())
            | "KeyParts" >> beam.Map(_key_part)
            # (None, (label, digest, part path))
        )
        marker = tables.pipeline | "EvenIfEmpty" >> beam.Create([(None, None)])
        # (None, None): empty input still writes its (empty) file
        return (
            (parts, marker)
            | "JoinParts" >> beam.Flatten()
            | "GroupParts" >> beam.GroupByKey()
            # (None, Iterable[part | None]): paths only, never rows
            | "Concatenate" >> beam.ParDo(_ConcatPartsFn(self._codec, self._dir, self._path))
            # str: the output path
        )
