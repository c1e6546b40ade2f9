"""A streaming single-file write of ``pyarrow.Table`` elements (``WriteTables(num_shards=1)``).

Beam's single-shard sinks (``WriteToText(num_shards=1)``, ``WriteToAvro``, ``WriteToParquetBatched``)
key every element with the same key and group them, so the whole output passes through one
``GroupByKey``, which the DirectRunner (FnApiRunner) holds in memory: the peak memory of a
``synthesize`` run grew with the number of synthetic rows. Here the rows never cross a shuffle:

1. ``WriteParts``: every table is written to its own part file in a temporary folder next to the
   output as soon as it arrives (fused with the step producing it), and only
   ``(label, digest, path, rows)`` goes on;
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

:class:`WriteSortedLines` does the same for many small elements (one dead-letter JSON line per
rejected row): each worker writes **sorted runs** of at most ``run_bytes`` bytes (a run's path is
emitted with its first line, the run is written when full or when the bundle ends), and the join
step merges the runs (``heapq.merge``, at most ``_MAX_FAN_IN`` open at a time), so the lines come
out ordered by their sort key whatever the runner, and memory is one run per worker.

Robustness: the join step writes under a unique temporary name, then renames; a retry of a join
step that already completed (its parts are gone, the output exists) re-emits the path instead of
failing. A failed pipeline leaves its temporary folders behind unless the launcher removes them:
:func:`remove_temp_folders_on_failure` (used by ``run_synthesis``) does.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import io
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beamsynth.pipelines.io.formats import FORMATS, table_to_csv_text
from beamsynth.pipelines.io.formats import avro_records as _avro_records
from beamsynth.pipelines.io.formats import csv_escape as _csv_escape
from beamsynth.pipelines.io.formats import table_to_jsonl as _table_to_jsonl
from beamsynth.schemas.tables import PART_LABEL_KEY, label_part, part_label
from beamsynth.transforms.conventions import display_items, element_types

__all__ = [
    "PART_LABEL_KEY",
    "WriteSingleFile",
    "WriteSortedLines",
    "csv_header",
    "label_part",
    "join_part_files",
    "merge_runs",
    "part_label",
    "remove_temp_folders",
    "remove_temp_folders_on_failure",
    "temp_folder_for",
]

TEMP_PREFIX = ".beamsynth-temp-"
_COPY_BYTES = 1 << 20
DEFAULT_RUN_BYTES = 8 << 20  # bytes of one sorted run of WriteSortedLines (its memory per worker)
_MAX_FAN_IN = 128  # runs merged at once (open files); more runs are merged in several passes


def csv_header(names: Sequence[str]) -> str:
    """The CSV header line of ``names`` (CSV-escaped: commas, quotes, line breaks), with ``\\n``."""
    return ",".join(_csv_escape(str(n)) for n in names) + "\n"


def temp_folder_for(path: str) -> str:
    """A new temporary folder name next to ``path``: ``.beamsynth-temp-<name>-<random id>``."""
    folder, name = FileSystems.split(path)
    return FileSystems.join(folder, f"{TEMP_PREFIX}{name}-{uuid.uuid4().hex}")


def _absolute(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)  # workers may run elsewhere


def _delete_quietly(paths: Sequence[str]) -> None:
    """Delete files or folders; a leftover never fails a write."""
    try:
        FileSystems.delete(list(paths))
    except (OSError, BeamIOError):
        pass


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
                out.write(csv_header(self._names).encode("utf-8"))
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


def _create(path: str) -> Any:
    return FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)


class _WritePartFn(beam.DoFn):
    """pyarrow.Table → its own part file; emits ``(label, digest, path, rows)``."""

    def __init__(self, codec: _PartCodec, parts_dir: str) -> None:
        self._codec, self._dir = codec, parts_dir

    def _folder(self, window: Any) -> str:
        """The folder of this window's parts (one folder for every window here)."""
        return self._dir

    def process(self, table: pa.Table, window=beam.DoFn.WindowParam):
        data = self._codec.encode(table)
        # a unique name (not a random draw of the output): the part of a retried bundle that
        # failed is never listed, so it is never concatenated
        path = FileSystems.join(self._folder(window), f"part-{uuid.uuid4().hex}")
        with _create(path) as f:
            f.write(data)
        yield part_label(table), hashlib.sha256(data).hexdigest(), path, table.num_rows


def join_part_files(part_paths: Sequence[str], parts_dir: str, path: str, write: Any, *,
                    compression: str = CompressionTypes.UNCOMPRESSED) -> bool:
    """Write ``path`` from its part files with ``write(part_paths, out)``, under a unique temporary
    name in ``parts_dir``, then rename it and delete ``parts_dir``.

    Returns False (and writes nothing) for a retry of a join that already completed: the output
    exists and a part is gone (parts are deleted only after the rename). Beam-free.
    """
    if part_paths and FileSystems.exists(path) and not all(FileSystems.exists(p) for p in part_paths):
        return False
    staged = FileSystems.join(parts_dir, f"output-{uuid.uuid4().hex}")  # one per attempt
    with FileSystems.create(staged, compression_type=compression) as out:
        write(part_paths, out)
    FileSystems.rename([staged], [path])
    _delete_quietly([parts_dir])
    return True


class _ConcatPartsFn(beam.DoFn):
    """All part entries → the output file (:func:`join_part_files`)."""

    def __init__(self, codec: _PartCodec, parts_dir: str, path: str) -> None:
        self._codec, self._dir, self._path = codec, parts_dir, path

    def process(self, keyed: tuple[Any, Iterable[tuple[str, str, str, int] | None]]):
        parts = sorted(p for p in keyed[1] if p is not None)  # by label, then digest
        compression = (CompressionTypes.detect_compression_type(self._path)
                       if self._codec.fmt in ("csv", "jsonl") else CompressionTypes.UNCOMPRESSED)
        join_part_files([p[2] for p in parts], self._dir, self._path, self._codec.concatenate,
                        compression=compression)
        yield self._path


def _key_part(part: Any) -> tuple[None, Any]:
    return None, part


def _gather_and_join(parts: beam.PCollection, join_fn: beam.DoFn) -> beam.PCollection:
    """Part entries (any window) → one ``join_fn`` call on all of them (+ ``None`` marker)."""
    keyed = (
        parts
        | "GlobalParts" >> beam.WindowInto(beam.window.GlobalWindows())
        | "KeyParts" >> beam.Map(_key_part)
        # (None, part entry)
    )
    marker = parts.pipeline | "EvenIfEmpty" >> beam.Create([(None, None)])
    # (None, None): empty input still writes its (empty) file
    return (
        (keyed, marker)
        | "JoinParts" >> beam.Flatten()
        | "GroupParts" >> beam.GroupByKey()
        # (None, Iterable[part entry | None]): paths only, never rows
        | "Concatenate" >> beam.ParDo(join_fn)
        # str: the output path
    )


class _TempFolders:
    """A writer whose temporary folder :func:`remove_temp_folders` deletes after a failed run."""

    _dir: str

    @property
    def temp_folder(self) -> str:
        """The temporary folder of the parts (exists only while the pipeline writes)."""
        return self._dir

    def remove_temp_folders(self) -> list[str]:
        """Delete the temporary folder if it exists; returns what was deleted."""
        if not FileSystems.exists(self._dir):
            return []
        _delete_quietly([self._dir])
        return [self._dir]


@element_types(input=pa.Table, output=str)
class WriteSingleFile(_TempFolders, beam.PTransform):
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
        self._path = _absolute(path)
        self._codec = _PartCodec(fmt, column_names, avro_schema, arrow_schema)
        self._dir = temp_folder_for(self._path)

    def display_data(self) -> dict[str, Any]:
        """Output path and format (no data values)."""
        return display_items(step="write one file, streaming (part files joined in label order)",
                             path=self._path, format=self._codec.fmt)

    def expand(self, tables):
        parts = tables | "WriteParts" >> beam.ParDo(_WritePartFn(self._codec, self._dir))
        # (label, digest, part path, rows)
        return _gather_and_join(parts, _ConcatPartsFn(self._codec, self._dir, self._path))
        # str: the output path


# -- sorted lines (dead letters) ------------------------------------------------------------------
class _Run:
    """The records of one sorted run being filled, and its (already emitted) path."""

    def __init__(self, path: str) -> None:
        self.path, self.records, self.size = path, [], 0


class _WriteRunsFn(beam.DoFn):
    """``(key, line)`` → sorted run files of ``key + b"\\t" + line`` records; emits each run's
    path with its first record (the run is written when it is full or when the bundle ends)."""

    def __init__(self, parts_dir: str, run_bytes: int) -> None:
        self._dir, self._run_bytes = parts_dir, run_bytes
        # the run of each thread's bundle: one DoFn object may serve bundles of several threads
        # at once (Beam's DaskRunner shares it between partitions)
        self._runs: dict[int, _Run | None] = {}

    def start_bundle(self) -> None:
        self._runs[threading.get_ident()] = None

    def process(self, item: tuple[bytes, str]) -> Iterator[str]:
        key, line = item
        if b"\t" in key or b"\n" in key or "\n" in line:
            raise ValueError(f"sort keys ({key!r}) must hold no tab or line break and lines "
                             f"({line[:80]!r}) no line break")
        thread = threading.get_ident()
        run = self._runs.get(thread)
        if run is None:
            # named and emitted now (nothing is emitted from finish_bundle); a failed bundle's
            # path is discarded with its output, so its run is never merged
            run = self._runs[thread] = _Run(FileSystems.join(self._dir, f"run-{uuid.uuid4().hex}"))
            yield run.path
        record = key + b"\t" + line.encode("utf-8") + b"\n"
        run.records.append(record)
        run.size += len(record)
        if run.size >= self._run_bytes:
            self._flush(thread)

    def finish_bundle(self) -> None:
        self._flush(threading.get_ident())

    def _flush(self, thread: int) -> None:
        run = self._runs.pop(thread, None)
        if run is None:
            return
        run.records.sort()
        with _create(run.path) as f:
            f.write(b"".join(run.records))


def _merge_into(paths: Sequence[str], out: Any, *, strip_keys: bool,
                rewrite: Callable[[bytes, bytes], bytes] | None = None) -> None:
    """Merge sorted run files into ``out`` (``strip_keys``: write only the lines, each through
    ``rewrite(key, line)`` if given)."""
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(_open_part(p)) for p in paths]
        buf: list[bytes] = []
        size = 0
        for record in heapq.merge(*files):
            if strip_keys and rewrite is not None:
                key, _, line = record.partition(b"\t")
                record = rewrite(key, line)
            elif strip_keys:
                record = record[record.index(b"\t") + 1:]
            buf.append(record)
            size += len(record)
            if size >= _COPY_BYTES:
                out.write(b"".join(buf))
                buf, size = [], 0
        out.write(b"".join(buf))


def merge_runs(run_paths: Sequence[str], out: Any, parts_dir: str, *,
               rewrite: Callable[[bytes, bytes], bytes] | None = None) -> None:
    """Write the lines of sorted runs to ``out`` in key order, at most ``_MAX_FAN_IN`` runs open
    at a time (intermediate runs go to ``parts_dir``); ``rewrite(key, line)`` → the line written
    (newline included). Beam-free."""
    runs = list(run_paths)
    while len(runs) > _MAX_FAN_IN:
        merged = []
        for i in range(0, len(runs), _MAX_FAN_IN):
            path = FileSystems.join(parts_dir, f"merge-{uuid.uuid4().hex}")
            with _create(path) as f:
                _merge_into(runs[i:i + _MAX_FAN_IN], f, strip_keys=False)
            merged.append(path)
        runs = merged
    _merge_into(runs, out, strip_keys=True, rewrite=rewrite)


class _MergeRunsFn(beam.DoFn):
    """All run paths (and context elements) → the output file (:func:`join_part_files` with
    :func:`merge_runs`)."""

    def __init__(self, parts_dir: str, path: str,
                 rewriter: Callable[[list[Any]], Any] | None = None) -> None:
        self._dir, self._path, self._rewriter = parts_dir, path, rewriter

    def process(self, keyed: tuple[Any, Iterable[str | tuple[str, Any] | None]]):
        runs, context = [], []
        for entry in keyed[1]:
            if isinstance(entry, str):
                runs.append(entry)
            elif entry is not None:
                context.append(entry[1])
        rewrite = None if self._rewriter is None else self._rewriter(context)
        join_part_files(sorted(runs), self._dir, self._path,
                        lambda paths, out: merge_runs(paths, out, self._dir, rewrite=rewrite))
        yield self._path


def _tag_context(item: Any) -> tuple[str, Any]:
    return "context", item


@element_types(input=tuple[bytes, str], output=str)
class WriteSortedLines(_TempFolders, beam.PTransform):
    """``PCollection[tuple[bytes, str]]`` of ``(sort key, line)`` (or a tuple of them) → one
    uncompressed text file at ``path`` holding every line once, ordered by ``key + b"\\t" + line``
    (bytewise), streaming.

    For many small elements (e.g. one dead-letter JSON line per rejected row): no element crosses
    a shuffle; each worker writes sorted runs of at most ``run_bytes`` bytes (its memory) to the
    temporary folder, only run paths are grouped, and one worker merges the runs (module doc).
    Keys must hold no tab or line break, lines no line break (``ValueError``). Empty input writes
    an empty file. Returns ``PCollection[str]`` holding the path once it is written.

    Input ``{"lines": ..., "context": PCollection}`` with ``rewriter``: the (few) context elements
    reach the merge, which writes ``rewriter(context)(key, line)`` (newline included) for every
    line, in key order (e.g. dead letters renumbered file-wide from part counts).
    """

    def __init__(self, path: str, *, run_bytes: int = DEFAULT_RUN_BYTES,
                 rewriter: Callable[[list[Any]], Callable[[bytes, bytes], bytes]] | None = None,
                 label: str | None = None) -> None:
        super().__init__(label)
        if isinstance(run_bytes, bool) or not isinstance(run_bytes, int) or run_bytes < 1:
            raise ValueError(f"run_bytes ({run_bytes!r}) must be an int >= 1")
        self._path = _absolute(path)
        self._run_bytes = run_bytes
        self._rewriter = rewriter
        self._dir = temp_folder_for(self._path)

    def display_data(self) -> dict[str, Any]:
        """Output path and run size (no data values)."""
        return display_items(step="write sorted lines (sorted runs, k-way merge)", path=self._path,
                             run_bytes=self._run_bytes, rewriter=self._rewriter is not None)

    def expand(self, keyed_lines):
        context = None
        if isinstance(keyed_lines, dict):
            keyed_lines, context = keyed_lines["lines"], keyed_lines.get("context")
        if isinstance(keyed_lines, beam.PCollection):
            keyed_lines = (keyed_lines,)
        # each input writes its own runs, and only run paths are flattened: a Flatten of inputs
        # from different stages is materialized by the DirectRunner (FnApiRunner)
        runs = [pc | f"WriteRuns{'' if i == 0 else i}" >> beam.ParDo(
                    _WriteRunsFn(self._dir, self._run_bytes))
                for i, pc in enumerate(keyed_lines)]
        # str: path of a sorted run (written by the end of its bundle)
        if context is not None:
            runs.append(context | "TagContext" >> beam.Map(_tag_context))
            # ("context", element): small, goes to the merge with the run paths
        runs = tuple(runs) | "FlattenRuns" >> beam.Flatten() if len(runs) > 1 else runs[0]
        return _gather_and_join(runs, _MergeRunsFn(self._dir, self._path, self._rewriter))
        # str: the output path


# -- cleanup after a failed run -------------------------------------------------------------------
def _writers(pipeline: beam.Pipeline) -> list[Any]:
    found: list[Any] = []

    class _Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node: Any) -> None:
            self.visit_transform(node)

        def visit_transform(self, node: Any) -> None:
            if callable(getattr(node.transform, "remove_temp_folders", None)):
                found.append(node.transform)

    pipeline.visit(_Visitor())
    return found


def remove_temp_folders(pipeline: beam.Pipeline) -> list[str]:
    """Delete the temporary part folders of every streaming writer in ``pipeline`` (those with a
    ``remove_temp_folders()`` method); returns the folders deleted. For a run that failed."""
    return [f for w in _writers(pipeline) for f in w.remove_temp_folders()]


@contextlib.contextmanager
def remove_temp_folders_on_failure(pipeline: beam.Pipeline) -> Iterator[None]:
    """Around ``pipeline.run()`` / ``wait_until_finish()`` (graph already built): if they raise,
    delete the writers' temporary folders, then re-raise."""
    writers = _writers(pipeline)  # before run(): a runner may rewrite the graph
    try:
        yield
    except BaseException:
        for w in writers:
            w.remove_temp_folders()
        raise
