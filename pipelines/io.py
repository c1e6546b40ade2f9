"""Reading private records into columnar blocks (with a dead-letter output) and writing tables.

Formats by extension: ``.csv`` (and ``.csv.gz``), ``.jsonl``/``.ndjson``, ``.avro``, ``.parquet``.

Reading is split in two steps so that other transforms can reuse the raw form:

* :func:`iter_raw_blocks` / :class:`ReadRawBlocks`: a file → :class:`RawBlock` elements (up to
  ``block_rows`` rows of raw column values as pandas object Series) plus :class:`Rejected` rows
  that could not even be split into fields (ragged CSV lines, invalid JSON, unreadable files).
* :class:`EncodeBlocks`: RawBlock → :class:`~beamsynth.schemas.schema.EncodedBatch` (cell codes
  for the declared schema) and, on the ``rejected`` output, every row with a value outside the
  declared domain, an unparseable value or a null where none is allowed, each with its reason.

Nothing is dropped silently: rows read = rows encoded + rows rejected, and every rejected row
names its file, its row number (1-based, header excluded), its line where known, and the reason.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beamsynth.schemas.schema import EncodedBatch, Schema, SchemaError, avro_field_name

__all__ = [
    "EncodeBlocks",
    "RawBlock",
    "ReadRawBlocks",
    "ReadRecords",
    "Rejected",
    "WriteTables",
    "detect_format",
    "iter_raw_blocks",
    "rejected_path",
    "table_to_csv_text",
]

FORMATS = ("csv", "jsonl", "avro", "parquet")
DEFAULT_BLOCK_ROWS = 20_000
_RAW_LIMIT = 500  # characters of a rejected row kept in the dead-letter output
METRICS_NAMESPACE = "beamsynth"


def detect_format(path: str) -> str:
    """Format name from a file extension (``.csv``, ``.csv.gz``, ``.jsonl``, ``.avro``, ``.parquet``)."""
    p = path.lower()
    if p.endswith(".gz"):
        p = p[:-3]
    for ext, fmt in ((".csv", "csv"), (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"),
                     (".avro", "avro"), (".parquet", "parquet")):
        if p.endswith(ext):
            return fmt
    raise ValueError(
        f"cannot tell the format of {path!r} from its extension; use one of "
        ".csv, .csv.gz, .jsonl, .avro, .parquet"
    )


def rejected_path(output: str) -> str:
    """Where the dead-letter rows of a run writing ``output`` go."""
    return f"{output}.rejected.jsonl"


@dataclass
class Rejected:
    """One dead-letter row: where it came from and why it was not used."""

    source: str
    row: int | None
    reason: str
    raw: str = ""
    line: int | None = None

    def to_json(self) -> str:
        """One JSON line (valid UTF-8: lone surrogates from undecodable bytes or JSON ``\\ud800``
        escapes become ``\\udXXX`` escapes instead of failing the dead-letter write)."""
        text = json.dumps(
            {"source": self.source, "row": self.row, "line": self.line, "reason": self.reason,
             "raw": self.raw[:_RAW_LIMIT]},
            ensure_ascii=False,
        )
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class RawBlock:
    """Up to ``block_rows`` raw rows of one file, column-wise (pandas object Series).

    ``rows`` holds the 1-based row number of each row in its file (header excluded) and ``lines``
    the line number where known (CSV/JSONL).
    """

    source: str
    columns: dict[str, pd.Series]
    rows: np.ndarray
    lines: np.ndarray | None = None
    header_error: str | None = None
    raw_rows: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.rows.size)


def _open_text(path: str) -> io.TextIOBase:
    fh = FileSystems.open(path, compression_type="uncompressed")
    if path.lower().endswith(".gz"):
        fh = gzip.GzipFile(fileobj=fh)
    # surrogateescape keeps undecodable bytes visible in the dead-letter output instead of failing
    # utf-8-sig drops a byte-order mark before the header (spreadsheet exports write one)
    return io.TextIOWrapper(fh, encoding="utf-8-sig", errors="surrogateescape", newline="")


def _clean(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8", "replace") if any(
        0xDC80 <= ord(ch) <= 0xDCFF for ch in text
    ) else text


def _block(source: str, header: list[str], rows: list[list[Any]], nums: list[int],
           lines: list[int] | None) -> RawBlock:
    cols = {h: pd.Series([r[j] for r in rows], dtype=object) for j, h in enumerate(header)}
    return RawBlock(
        source=source,
        columns=cols,
        rows=np.asarray(nums, dtype=np.int64),
        lines=None if lines is None else np.asarray(lines, dtype=np.int64),
        raw_rows=[],
    )


def _iter_csv(path: str, block_rows: int) -> Iterator[RawBlock | Rejected]:
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield Rejected(path, None, f"unreadable CSV header: {exc}", line=1)
            return
        header = [_clean(h).strip() for h in header]
        rows: list[list[Any]] = []
        nums: list[int] = []
        lines: list[int] = []
        row_no = 0
        while True:
            try:
                rec = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                row_no += 1
                yield Rejected(path, row_no, f"malformed CSV line: {exc}", line=reader.line_num)
                continue
            if not rec:  # blank line: not a record
                continue
            row_no += 1
            if len(rec) != len(header):
                yield Rejected(
                    path, row_no,
                    f"row has {len(rec)} fields but the header has {len(header)}",
                    raw=_clean(",".join(rec)), line=reader.line_num,
                )
                continue
            rows.append([_clean(v) for v in rec])
            nums.append(row_no)
            lines.append(reader.line_num)
            if len(rows) >= block_rows:
                yield _block(path, header, rows, nums, lines)
                rows, nums, lines = [], [], []
        if rows:
            yield _block(path, header, rows, nums, lines)


def _iter_jsonl(path: str, block_rows: int) -> Iterator[RawBlock | Rejected]:
    keys: list[str] = []
    rows: list[dict[str, Any]] = []
    nums: list[int] = []
    lines: list[int] = []
    row_no = 0

    def flush() -> RawBlock:
        cols = {k: pd.Series([r.get(k) for r in rows], dtype=object) for k in keys}
        return RawBlock(path, cols, np.asarray(nums, np.int64), np.asarray(lines, np.int64))

    with _open_text(path) as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            row_no += 1
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeError, RecursionError) as exc:
                yield Rejected(path, row_no, f"invalid JSON: {exc}", raw=_clean(line), line=line_no)
                continue
            if not isinstance(obj, dict):
                yield Rejected(path, row_no, f"a JSON line must hold an object, got {type(obj).__name__}",
                               raw=_clean(line), line=line_no)
                continue
            for k in obj:
                if k not in keys:
                    keys.append(k)
            rows.append(obj)
            nums.append(row_no)
            lines.append(line_no)
            if len(rows) >= block_rows:
                yield flush()
                rows, nums, lines = [], [], []
    if rows:
        yield flush()


def _iter_avro(path: str, block_rows: int) -> Iterator[RawBlock | Rejected]:
    import fastavro

    with FileSystems.open(path, compression_type="uncompressed") as fh:
        try:
            reader = fastavro.reader(fh)
        except Exception as exc:  # fastavro raises several types for a bad header
            yield Rejected(path, None, f"unreadable Avro file: {exc}")
            return
        names = [f["name"] for f in reader.writer_schema.get("fields", [])]
        rows: list[dict[str, Any]] = []
        nums: list[int] = []
        row_no = 0
        it = iter(reader)
        while True:
            try:
                rec = next(it)
            except StopIteration:
                break
            except Exception as exc:  # a corrupt block ends what can be read
                yield Rejected(path, row_no + 1, f"corrupt Avro data after row {row_no}: {exc}")
                break
            row_no += 1
            rows.append(rec)
            nums.append(row_no)
            if len(rows) >= block_rows:
                yield RawBlock(path, {k: pd.Series([r.get(k) for r in rows], dtype=object) for k in names},
                               np.asarray(nums, np.int64))
                rows, nums = [], []
        if rows:
            yield RawBlock(path, {k: pd.Series([r.get(k) for r in rows], dtype=object) for k in names},
                           np.asarray(nums, np.int64))


def _iter_parquet(path: str, block_rows: int) -> Iterator[RawBlock | Rejected]:
    import pyarrow.parquet as pq

    with FileSystems.open(path, compression_type="uncompressed") as fh:
        try:
            pf = pq.ParquetFile(pa.BufferReader(fh.read()))
        except (pa.ArrowInvalid, OSError) as exc:
            yield Rejected(path, None, f"unreadable Parquet file: {exc}")
            return
        row_no = 0
        for batch in pf.iter_batches(batch_size=block_rows):
            n = batch.num_rows
            cols = {
                name: pd.Series(batch.column(i).to_pylist(), dtype=object)
                for i, name in enumerate(batch.schema.names)
            }
            yield RawBlock(path, cols, np.arange(row_no + 1, row_no + n + 1, dtype=np.int64))
            row_no += n


def iter_raw_blocks(path: str, *, block_rows: int = DEFAULT_BLOCK_ROWS) -> Iterator[RawBlock | Rejected]:
    """Raw blocks and unsplittable rows of one file (Beam-free)."""
    fmt = detect_format(path)
    reader = {"csv": _iter_csv, "jsonl": _iter_jsonl, "avro": _iter_avro, "parquet": _iter_parquet}[fmt]
    try:
        yield from reader(path, block_rows)
    except (OSError, UnicodeError, EOFError) as exc:
        yield Rejected(path, None, f"cannot read {fmt} file: {exc}")


class _ReadFileFn(beam.DoFn):
    def __init__(self, block_rows: int, tagged: bool = True) -> None:
        self._block_rows = block_rows
        self._tagged = tagged
        self._read = Metrics.counter(METRICS_NAMESPACE, "rows_read")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rows_rejected_unparseable")

    def process(self, path: str):
        for item in iter_raw_blocks(path, block_rows=self._block_rows):
            if isinstance(item, Rejected):
                self._read.inc()
                self._rejected.inc()
                yield beam.pvalue.TaggedOutput("rejected", item) if self._tagged else item
            else:
                self._read.inc(len(item))
                yield item


def _is_rejected(item: Any) -> bool:
    return isinstance(item, Rejected)


def _is_not_rejected(item: Any) -> bool:
    return not isinstance(item, Rejected)


def _apply_with_dead_letters(pcoll: beam.PCollection, fn_cls: type, args: tuple, *, main: str,
                             single_output: bool, label: str) -> tuple[Any, Any]:
    """``(main, rejected)`` outputs of a DoFn whose dead letters are :class:`Rejected` rows.

    By default a tagged multi-output ParDo. With ``single_output`` the DoFn emits both kinds on
    one output and two ``Filter`` steps split them by type: Beam's DaskRunner (2.77) sends every
    output of a multi-output ParDo to every consumer (see docs/runners.md).
    """
    if not single_output:
        out = pcoll | label >> beam.ParDo(fn_cls(*args)).with_outputs("rejected", main=main)
        return out[main], out.rejected
    mixed = pcoll | label >> beam.ParDo(fn_cls(*args, tagged=False))
    # RawBlock/EncodedBatch | Rejected
    return (mixed | f"{label}Main" >> beam.Filter(_is_not_rejected),
            mixed | f"{label}Rejected" >> beam.Filter(_is_rejected))


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} ({value!r}) must be a bool")
    return value


def _expand_paths(pattern: str) -> list[str]:
    matches = FileSystems.match([pattern])[0].metadata_list
    paths = sorted(m.path for m in matches)
    if not paths:
        raise FileNotFoundError(f"no input file matches {pattern!r}")
    return paths


class ReadRawBlocks(beam.PTransform):
    """Files (a path or glob) → ``RawBlock`` (main) and ``Rejected`` (tag ``rejected``).

    The file list is resolved when the pipeline is built (file names are not private data);
    files are read in parallel, one reader per file, and blocks are redistributed.
    """

    def __init__(self, pattern: str | Sequence[str], *, block_rows: int = DEFAULT_BLOCK_ROWS,
                 single_output: bool = False, label: str | None = None) -> None:
        super().__init__(label)
        self._single_output = _check_flag("single_output", single_output)
        patterns = [pattern] if isinstance(pattern, str) else list(pattern)
        self._paths = [p for pat in patterns for p in _expand_paths(pat)]
        for p in self._paths:
            detect_format(p)
        if not isinstance(block_rows, int) or block_rows < 1:
            raise ValueError(f"block_rows ({block_rows!r}) must be an int >= 1")
        self._block_rows = block_rows

    @property
    def paths(self) -> list[str]:
        """The input files."""
        return list(self._paths)

    def expand(self, pbegin):
        paths = pbegin | "Files" >> beam.Create(self._paths)
        # str path
        blocks, rejected = _apply_with_dead_letters(
            paths, _ReadFileFn, (self._block_rows,), main="blocks",
            single_output=self._single_output, label="ReadFiles")
        # blocks: RawBlock, rejected: Rejected
        blocks = blocks | "Redistribute" >> beam.Reshuffle()
        return {"blocks": blocks, "rejected": rejected}


def _row_text(block: RawBlock, i: int) -> str:
    return json.dumps({k: (None if v is None else str(v)) for k, v in
                       ((k, s.iat[i]) for k, s in block.columns.items())}, ensure_ascii=False)


def _align_columns(schema: Schema, columns: dict[str, pd.Series]) -> dict[str, pd.Series]:
    """Accept Avro-sanitized field names (``education_num``) for declared ``education-num``."""
    wanted = schema.names + ([schema.privacy_id] if schema.privacy_id else [])
    out = dict(columns)
    for name in wanted:
        alias = avro_field_name(name)
        if name not in out and alias != name and alias in out:
            out[name] = out.pop(alias)
    return out


def encode_block(schema: Schema, block: RawBlock) -> tuple[EncodedBatch, list[Rejected]]:
    """Encode one raw block; every row that cannot be encoded becomes a :class:`Rejected`."""
    n = len(block)
    block.columns = _align_columns(schema, block.columns)
    try:
        schema.check_header(list(block.columns))
    except SchemaError as exc:
        rejected = [
            Rejected(block.source, int(block.rows[i]), f"file header: {exc}", raw=_row_text(block, i),
                     line=None if block.lines is None else int(block.lines[i]))
            for i in range(n)
        ]
        return EncodedBatch(np.zeros((0, len(schema.columns)), np.int32),
                            None if schema.privacy_id is None else np.zeros(0, dtype=object)), rejected
    cols = dict(block.columns)
    batch, bad = schema.encode_columns(cols, n)
    rejected = [
        Rejected(block.source, int(block.rows[i]), reason, raw=_row_text(block, i),
                 line=None if block.lines is None else int(block.lines[i]))
        for i, reason in bad
    ]
    return batch, rejected


class _EncodeFn(beam.DoFn):
    def __init__(self, schema: Schema, tagged: bool = True) -> None:
        self._schema = schema
        self._tagged = tagged
        self._used = Metrics.counter(METRICS_NAMESPACE, "rows_encoded")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rows_rejected_domain")

    def process(self, block: RawBlock):
        batch, rejected = encode_block(self._schema, block)
        self._used.inc(len(batch))
        self._rejected.inc(len(rejected))
        for r in rejected:
            yield beam.pvalue.TaggedOutput("rejected", r) if self._tagged else r
        if len(batch):
            yield batch


class EncodeBlocks(beam.PTransform):
    """``RawBlock`` → ``EncodedBatch`` (main) and ``Rejected`` (tag ``rejected``) for a schema."""

    def __init__(self, schema: Schema, *, single_output: bool = False,
                 label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(schema, Schema):
            raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
        self._schema = schema
        self._single_output = _check_flag("single_output", single_output)

    def expand(self, blocks):
        batches, rejected = _apply_with_dead_letters(
            blocks, _EncodeFn, (self._schema,), main="batches",
            single_output=self._single_output, label="Encode")
        return {"batches": batches, "rejected": rejected}


class ReadRecords(beam.PTransform):
    """Files → encoded batches and one merged dead-letter output.

    Returns ``{"batches": PCollection[EncodedBatch], "rejected": PCollection[Rejected]}``.
    ``single_output=True`` avoids multi-output ParDos (needed on Beam's DaskRunner).
    """

    def __init__(self, pattern: str | Sequence[str], schema: Schema, *,
                 block_rows: int = DEFAULT_BLOCK_ROWS, single_output: bool = False,
                 label: str | None = None) -> None:
        super().__init__(label)
        self._read = ReadRawBlocks(pattern, block_rows=block_rows, single_output=single_output)
        self._schema = schema
        self._single_output = single_output

    @property
    def paths(self) -> list[str]:
        """The input files."""
        return self._read.paths

    def expand(self, pbegin):
        raw = pbegin | "ReadRaw" >> self._read
        enc = raw["blocks"] | "EncodeRows" >> EncodeBlocks(self._schema, single_output=self._single_output)
        rejected = (raw["rejected"], enc["rejected"]) | "MergeRejected" >> beam.Flatten()
        return {"batches": enc["batches"], "rejected": rejected}


# -- writing --------------------------------------------------------------------------------------
def table_to_csv_text(table: pa.Table) -> str:
    """CSV lines (no header) of a table, each ending in a newline."""
    df = table.to_pandas()
    buf = io.StringIO()
    df.to_csv(buf, header=False, index=False, lineterminator="\n")
    return buf.getvalue()


def _table_to_jsonl(table: pa.Table) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in table.to_pylist())


class WriteTables(beam.PTransform):
    """Write ``PCollection[pyarrow.Table]`` to one file (format from the extension).

    ``avro_schema`` is needed for ``.avro`` output. One output file is produced
    (``num_shards=1``), which is what local runs expect; pass ``num_shards`` for clusters.
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

    def expand(self, tables):
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


def _avro_records(table: pa.Table, field_names: list[str]) -> list[dict[str, Any]]:
    """Rows of a table keyed by Avro field names (same order as the table's columns)."""
    return table.rename_columns(field_names).to_pylist()


def _csv_escape(value: str) -> str:
    if any(ch in value for ch in ',"\n\r'):
        return '"' + value.replace('"', '""') + '"'
    return value


def write_rejected(rejected: beam.PCollection, output: str) -> Any:
    """Write dead-letter rows as JSON lines to ``rejected_path(output)`` (one file)."""
    return (
        rejected
        | "RejectedToJson" >> beam.Map(lambda r: r.to_json())
        | "WriteRejected" >> beam.io.WriteToText(rejected_path(output), num_shards=1, shard_name_template="")
    )


def ensure_parent(path: str) -> None:
    """Create the folder of a local output path."""
    parent = os.path.dirname(os.path.abspath(path))
    if "://" not in path:
        os.makedirs(parent, exist_ok=True)


def arrow_schema_for(schema: Schema) -> pa.Schema:
    """Arrow schema of synthetic output tables."""
    types = {"categorical": pa.string(), "string": pa.string(), "text": pa.string(),
             "datetime": pa.string(), "integer": pa.int64(), "float": pa.float64()}
    return pa.schema([pa.field(c.name, types[c.type], nullable=c.nullable) for c in schema.columns])


