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

Parallel reading: :class:`ReadRecords` cuts uncompressed CSV/JSONL files larger than
``split_bytes`` into byte ranges (:func:`plan_parts`) read and encoded by different workers;
records are aligned to line starts, a part's dead letters are renumbered file-wide
(:class:`NumberRejected`), and the result equals a sequential read (a CSV quoted field with a
line break across a split point is detected and raises instead).
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beamsynth.pipelines.formats import FORMATS, table_to_csv_text
from beamsynth.pipelines.formats import avro_records as _avro_records
from beamsynth.pipelines.formats import csv_escape as _csv_escape
from beamsynth.pipelines.formats import table_to_jsonl as _table_to_jsonl
from beamsynth.schemas.schema import EncodedBatch, Schema, SchemaError, avro_field_name
from beamsynth.schemas.tables import arrow_schema_for

__all__ = [
    "DEFAULT_SPLIT_BYTES",
    "FORMATS",
    "EncodeBlocks",
    "FilePart",
    "NumberRejected",
    "PartCount",
    "RawBlock",
    "ReadRawBlocks",
    "ReadRecords",
    "Rejected",
    "WriteTables",
    "arrow_schema_for",
    "detect_format",
    "iter_raw_blocks",
    "number_rejected",
    "plan_parts",
    "rejected_path",
    "table_to_csv_text",
]

DEFAULT_BLOCK_ROWS = 20_000
DEFAULT_SPLIT_BYTES = 16 << 20  # CSV/JSONL files larger than this are read in parts
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
    part: int = 0  # the file part whose reader found it (row/line counted from the part's start)

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
    the line number where known (CSV/JSONL); in a block of file part ``part > 0`` (see
    :class:`FilePart`) both count from the start of the part.
    """

    source: str
    columns: dict[str, pd.Series]
    rows: np.ndarray
    lines: np.ndarray | None = None
    header_error: str | None = None
    raw_rows: list[str] = field(default_factory=list)
    part: int = 0

    def __len__(self) -> int:
        return int(self.rows.size)


_CHUNK_BYTES = 1 << 22  # bytes read at a time by the line reader
_BOM = b"\xef\xbb\xbf"
# one line with its ending, universal newlines (\r\n, \r, \n) as io.TextIOWrapper(newline="")
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
_SURROGATE = re.compile("[\udc80-\udcff]")


def _open_binary(path: str) -> Any:
    fh = FileSystems.open(path, compression_type="uncompressed")
    if path.lower().endswith(".gz"):
        fh = gzip.GzipFile(fileobj=fh)
    return fh


class _LineSource:
    """Decoded lines of bytes ``[start, stop)`` of a file (``stop=None``: to the end).

    Lines split on universal newlines with their endings kept, decoded as UTF-8 with
    ``surrogateescape`` (undecodable bytes stay visible in the dead-letter output), a byte-order
    mark dropped at offset 0: the same lines as ``io.TextIOWrapper(encoding="utf-8-sig",
    errors="surrogateescape", newline="")``. ``dirty`` becomes True when a line from a chunk
    holding undecodable bytes is handed out (the consumer resets it); ``exhausted`` when the
    range has no more lines; ``pulled`` counts the lines handed out.
    """

    def __init__(self, fh: Any, start: int = 0, stop: int | None = None, *,
                 chunk: int = _CHUNK_BYTES) -> None:
        self._fh, self._start, self._stop, self._chunk = fh, start, stop, chunk
        self.bom = False
        self.dirty = False
        self.exhausted = False
        self.pulled = 0
        self._it = self._lines()

    def __iter__(self) -> _LineSource:
        return self

    def __next__(self) -> str:
        line = next(self._it)
        self.pulled += 1
        return line

    def _chunks(self) -> Iterator[bytes]:
        if self._start:
            self._fh.seek(self._start)
        left = None if self._stop is None else self._stop - self._start
        carry = b""
        bom_checked = self._start != 0
        while True:
            n = self._chunk if left is None else min(self._chunk, left)
            data = self._fh.read(n) if n > 0 else b""
            if left is not None:
                left -= len(data)
            buf = carry + data
            if not bom_checked and (len(buf) >= len(_BOM) or not data):
                if buf.startswith(_BOM):
                    buf = buf[len(_BOM):]
                    self.bom = True
                bom_checked = True
            if not data:
                if buf:
                    yield buf
                return
            # cut after the last line ending that cannot be the \r of a \r\n split across reads
            cut = max(buf.rfind(b"\n") + 1, buf.rfind(b"\r", 0, len(buf) - 1) + 1)
            if cut:
                yield buf[:cut]
            carry = buf[cut:]

    def _lines(self) -> Iterator[str]:
        for chunk in self._chunks():
            text = chunk.decode("utf-8", "surrogateescape")
            lines = _LINE.findall(text)
            if _SURROGATE.search(text) is None:
                yield from lines
            else:
                for line in lines:
                    self.dirty = True
                    yield line
        self.exhausted = True


def _clean(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8", "replace") if (
        _SURROGATE.search(text) is not None) else text


def _block(source: str, header: list[str], rows: list[list[Any]], nums: list[int],
           lines: list[int] | None, part: int = 0) -> RawBlock:
    table = np.array(rows, dtype=object).reshape(len(rows), len(header))  # rows all have len(header) fields
    cols = {h: pd.Series(np.ascontiguousarray(table[:, j]), dtype=object) for j, h in enumerate(header)}
    return RawBlock(
        source=source,
        columns=cols,
        rows=np.asarray(nums, dtype=np.int64),
        lines=None if lines is None else np.asarray(lines, dtype=np.int64),
        raw_rows=[],
        part=part,
    )


@dataclass(frozen=True)
class FilePart:
    """Bytes ``[start, stop)`` of an input file read by one reader (``stop=None``: to the end).

    Part ``i > 0`` owns the records that begin after the first newline at or after ``start - 1``
    (and after the header); part ``i`` ends where part ``i + 1`` begins. Row and line numbers
    inside a part are counted from the part's start and made file-wide by
    :class:`NumberRejected` from every part's :class:`PartCount`.
    """

    path: str
    index: int
    start: int
    stop: int | None


@dataclass(frozen=True)
class PartCount:
    """Records (header excluded) and physical lines (header included in part 0) of a part."""

    path: str
    index: int
    records: int
    lines: int


def _next_line_start(fh: Any, pos: int, floor: int) -> int:
    """Offset just after the first ``\\n`` at or after ``pos - 1`` (at least ``floor``), or EOF."""
    if pos <= floor:
        return floor
    fh.seek(pos - 1)
    off = pos - 1
    while True:
        data = fh.read(1 << 16)
        if not data:
            return off
        i = data.find(b"\n")
        if i >= 0:
            return off + i + 1
        off += len(data)


def _csv_header(path: str) -> tuple[list[str] | None, int]:
    """(header fields, byte offset where the records begin) of a CSV file; ``(None, 0)`` when
    the file is empty or its header unreadable (the reader of part 0 reports that)."""
    with _open_binary(path) as fh:
        src = _LineSource(fh, chunk=1 << 16)
        seen: list[str] = []

        def pulled() -> Iterator[str]:
            for line in src:
                seen.append(line)
                yield line

        try:
            header = next(csv.reader(pulled()))
        except (StopIteration, csv.Error):
            return None, 0
        size = sum(len(x.encode("utf-8", "surrogateescape")) for x in seen)
        return [_clean(h).strip() for h in header], size + (len(_BOM) if src.bom else 0)


def _part_bounds(path: str, part: FilePart, floor: int) -> tuple[int, int | None]:
    """Byte range ``[begin, end)`` of the records part ``part`` owns (``end=None``: EOF)."""
    with _open_binary(path) as fh:
        begin = 0 if part.index == 0 else _next_line_start(fh, part.start, floor)
        end = None if part.stop is None else _next_line_start(fh, part.stop, floor)
    return begin, end


class _PartState:
    """Counts a part reader reports when done (records, lines)."""

    def __init__(self) -> None:
        self.records = 0
        self.lines = 0


def _iter_csv(path: str, block_rows: int, part: FilePart | None = None,
              state: _PartState | None = None) -> Iterator[RawBlock | Rejected]:
    idx = 0 if part is None else part.index
    fh_range: tuple[int, int | None] = (0, None)
    header = None
    if part is not None and not (idx == 0 and part.stop is None):
        known, floor = _csv_header(path)
        if known is None and idx > 0:  # empty file or bad header: part 0 reports it
            return
        fh_range = _part_bounds(path, part, floor)
        if fh_range[1] is not None and fh_range[0] >= fh_range[1]:
            return
        header = known if idx > 0 else None
    with _open_binary(path) as fh:
        src = _LineSource(fh, *fh_range)
        reader = csv.reader(src)
        if header is None:
            try:
                first = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield Rejected(path, None, f"unreadable CSV header: {exc}", line=1)
                return
            header = [_clean(h).strip() for h in first]
        last = part is None or part.stop is None
        rows: list[list[Any]] = []
        nums: list[int] = []
        lines: list[int] = []
        row_no = 0
        try:
            while True:
                src.dirty = False
                try:
                    rec = next(reader)
                except StopIteration:
                    break
                except csv.Error as exc:
                    row_no += 1
                    yield Rejected(path, row_no, f"malformed CSV line: {exc}", line=reader.line_num,
                                   part=idx)
                    continue
                if src.exhausted and not last:
                    raise ValueError(
                        f"cannot split {path!r} at byte {fh_range[1]}: a quoted CSV field with a line "
                        "break spans that point, so the parallel readers of this file would not see "
                        "the records a sequential read sees; read it unsplit (--split-bytes 0, or "
                        "split_bytes=0 in SynthesisConfig/ReadRecords/ReadRawBlocks) or compress "
                        "it (.csv.gz is read by one reader)")
                if not rec:  # blank line: not a record
                    continue
                row_no += 1
                if src.dirty:
                    rec = [_clean(v) for v in rec]
                if len(rec) != len(header):
                    yield Rejected(
                        path, row_no,
                        f"row has {len(rec)} fields but the header has {len(header)}",
                        raw=",".join(rec), line=reader.line_num, part=idx,
                    )
                    continue
                rows.append(rec)
                nums.append(row_no)
                lines.append(reader.line_num)
                if len(rows) >= block_rows:
                    yield _block(path, header, rows, nums, lines, idx)
                    rows, nums, lines = [], [], []
            if rows:
                yield _block(path, header, rows, nums, lines, idx)
        finally:
            if state is not None:
                state.records, state.lines = row_no, src.pulled


def _iter_jsonl(path: str, block_rows: int, part: FilePart | None = None,
                state: _PartState | None = None) -> Iterator[RawBlock | Rejected]:
    keys: list[str] = []
    rows: list[dict[str, Any]] = []
    nums: list[int] = []
    lines: list[int] = []
    row_no = 0
    idx = 0 if part is None else part.index

    def flush() -> RawBlock:
        cols = {k: pd.Series([r.get(k) for r in rows], dtype=object) for k in keys}
        return RawBlock(path, cols, np.asarray(nums, np.int64), np.asarray(lines, np.int64), part=idx)

    fh_range: tuple[int, int | None] = (0, None)
    if part is not None and not (idx == 0 and part.stop is None):
        fh_range = _part_bounds(path, part, 0)
        if fh_range[1] is not None and fh_range[0] >= fh_range[1]:
            return
    with _open_binary(path) as fh:
        src = _LineSource(fh, *fh_range)
        line_no = 0
        try:
            for line in src:
                line_no += 1
                if not line.strip():
                    continue
                row_no += 1
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, UnicodeError, RecursionError) as exc:
                    yield Rejected(path, row_no, f"invalid JSON: {exc}", raw=_clean(line), line=line_no,
                                   part=idx)
                    continue
                if not isinstance(obj, dict):
                    yield Rejected(path, row_no,
                                   f"a JSON line must hold an object, got {type(obj).__name__}",
                                   raw=_clean(line), line=line_no, part=idx)
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
        finally:
            if state is not None:
                state.records, state.lines = row_no, line_no
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


def iter_raw_blocks(path: str, *, block_rows: int = DEFAULT_BLOCK_ROWS, part: FilePart | None = None,
                    counts: _PartState | None = None) -> Iterator[RawBlock | Rejected]:
    """Raw blocks and unsplittable rows of one file, or of one :class:`FilePart` of a CSV/JSONL
    file (Beam-free). ``counts`` (if given) receives the part's records and lines when done."""
    fmt = detect_format(path)
    if part is not None and (part.index > 0 or part.stop is not None) and not _splittable(path):
        raise ValueError(f"{path!r} cannot be read in parts ({fmt}{', gzip' if path.lower().endswith('.gz') else ''})")
    try:
        if fmt in ("csv", "jsonl"):
            yield from (_iter_csv if fmt == "csv" else _iter_jsonl)(path, block_rows, part, counts)
        else:
            yield from (_iter_avro if fmt == "avro" else _iter_parquet)(path, block_rows)
    except (OSError, UnicodeError, EOFError) as exc:
        yield Rejected(path, None, f"cannot read {fmt} file: {exc}", part=0 if part is None else part.index)


def _splittable(path: str) -> bool:
    return detect_format(path) in ("csv", "jsonl") and not path.lower().endswith(".gz")


def plan_parts(paths_sizes: Sequence[tuple[str, int | None]], split_bytes: int) -> list[FilePart]:
    """File parts for parallel reading: uncompressed CSV/JSONL files larger than ``split_bytes``
    are cut into ``ceil(size / split_bytes)`` equal byte ranges (records are then aligned to line
    starts by the readers); other files (and ``split_bytes=0``) are one part each. Sizes are file
    metadata, known before any record is read; the plan is the same on every runner."""
    parts = []
    for path, size in paths_sizes:
        if not split_bytes or size is None or size <= split_bytes or not _splittable(path):
            parts.append(FilePart(path, 0, 0, None))
            continue
        n = -(-size // split_bytes)
        cuts = [size * i // n for i in range(n)]
        parts.extend(FilePart(path, i, cuts[i], cuts[i + 1] if i + 1 < n else None) for i in range(n))
    return parts


class _ReadFileFn(beam.DoFn):
    """``FilePart`` → ``RawBlock`` (main), ``Rejected`` (tag ``rejected``), one ``PartCount``
    (tag ``parts``; only for files read in several parts)."""

    def __init__(self, block_rows: int, tagged: bool = True) -> None:
        self._block_rows = block_rows
        self._tagged = tagged
        self._read = Metrics.counter(METRICS_NAMESPACE, "rows_read")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rows_rejected_unparseable")

    def process(self, part: FilePart | str):
        if isinstance(part, str):
            part = FilePart(part, 0, 0, None)
        whole = part.index == 0 and part.stop is None
        counts = _PartState()
        for item in iter_raw_blocks(part.path, block_rows=self._block_rows,
                                    part=None if whole else part, counts=counts):
            if isinstance(item, Rejected):
                self._read.inc()
                self._rejected.inc()
                yield beam.pvalue.TaggedOutput("rejected", item) if self._tagged else item
            else:
                self._read.inc(len(item))
                yield item
        if not whole:
            out = PartCount(part.path, part.index, counts.records, counts.lines)
            yield beam.pvalue.TaggedOutput("parts", out) if self._tagged else out


def _is_rejected(item: Any) -> bool:
    return isinstance(item, Rejected)


def _is_part_count(item: Any) -> bool:
    return isinstance(item, PartCount)


def _is_main(item: Any) -> bool:
    return not isinstance(item, (Rejected, PartCount))


def _apply_with_dead_letters(pcoll: beam.PCollection, fn_cls: type, args: tuple, *, main: str,
                             single_output: bool, label: str, parts: bool = False) -> tuple[Any, ...]:
    """``(main, rejected)`` outputs of a DoFn whose dead letters are :class:`Rejected` rows
    (``(main, rejected, parts)`` with ``parts``: its :class:`PartCount` output too).

    By default a tagged multi-output ParDo. With ``single_output`` the DoFn emits every kind on
    one output and ``Filter`` steps split them by type: Beam's DaskRunner (2.77) sends every
    output of a multi-output ParDo to every consumer (see docs/runners.md).
    """
    tags = ("rejected", "parts") if parts else ("rejected",)
    if not single_output:
        out = pcoll | label >> beam.ParDo(fn_cls(*args)).with_outputs(*tags, main=main)
        return (out[main], *(out[t] for t in tags))
    mixed = pcoll | label >> beam.ParDo(fn_cls(*args, tagged=False))
    # RawBlock/EncodedBatch | Rejected | PartCount
    outs = (mixed | f"{label}Main" >> beam.Filter(_is_main),
            mixed | f"{label}Rejected" >> beam.Filter(_is_rejected))
    if parts:
        outs += (mixed | f"{label}Parts" >> beam.Filter(_is_part_count),)
    return outs


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} ({value!r}) must be a bool")
    return value


def _expand_paths(pattern: str) -> list[tuple[str, int | None]]:
    matches = FileSystems.match([pattern])[0].metadata_list
    found = sorted((m.path, m.size_in_bytes) for m in matches)
    if not found:
        raise FileNotFoundError(f"no input file matches {pattern!r}")
    return found


def _key_by_path(item: Rejected | PartCount) -> tuple[str, Rejected | PartCount]:
    return (item.source if isinstance(item, Rejected) else item.path), item


def number_rejected(keyed: tuple[str, Iterable[Rejected | PartCount]]) -> list[Rejected]:
    """File-wide row and line numbers for the dead letters of one file read in parts.

    Part ``i``'s numbers are offset by the records and lines of parts ``0..i-1`` (part 0's lines
    include the header), so every dead letter names the row and line a sequential read names.
    """
    path, items = keyed
    counts: dict[int, PartCount] = {}
    rejected: list[Rejected] = []
    for item in items:
        if isinstance(item, PartCount):
            counts[item.index] = item
        else:
            rejected.append(item)
    if any(r.part for r in rejected) and sorted(counts) != list(range(len(counts))):
        raise ValueError(f"part counts of {path!r} are incomplete: got parts {sorted(counts)}")
    row_off, line_off = [0], [0]
    for i in range(len(counts)):
        row_off.append(row_off[-1] + counts[i].records)
        line_off.append(line_off[-1] + counts[i].lines)
    out = []
    for r in rejected:
        if r.part:
            r = Rejected(r.source, None if r.row is None else r.row + row_off[r.part], r.reason, r.raw,
                         None if r.line is None else r.line + line_off[r.part])
        out.append(r)
    return out


def _first_part(r: Rejected) -> bool:
    return r.part == 0


def _later_part(r: Rejected) -> bool:
    return r.part != 0


class NumberRejected(beam.PTransform):
    """``(rejected, part counts)`` → dead letters with file-wide row and line numbers.

    Only needed when files are read in parts (:class:`ReadRawBlocks` with ``split_bytes``).
    Dead letters of part 0 (and of unsplit files) are already numbered and pass straight through;
    those of later parts are grouped by file with the part counts (a ``GroupByKey``, safe on every
    runner), so they are held until every part of their file has been read.
    """

    def expand(self, pcolls):
        rejected, parts = pcolls
        first = rejected | "FirstParts" >> beam.Filter(_first_part)
        # Rejected, file-wide numbers already
        later = (
            (rejected | "LaterParts" >> beam.Filter(_later_part), parts)
            | "Flatten" >> beam.Flatten()
            # Rejected | PartCount
            | "ByFile" >> beam.Map(_key_by_path)
            | "Group" >> beam.GroupByKey()
            # (path, Iterable[Rejected | PartCount])
            | "Number" >> beam.FlatMap(number_rejected)
            # Rejected, file-wide row/line
        )
        return (first, later) | "Join" >> beam.Flatten()


class ReadRawBlocks(beam.PTransform):
    """Files (a path or glob) → ``RawBlock`` (main) and ``Rejected`` (tag ``rejected``).

    The file list (and file sizes) are resolved when the pipeline is built (file names and sizes
    are not private data). With ``split_bytes=0`` (default) each file is one reader and its blocks
    are redistributed over the workers. With ``split_bytes > 0`` every uncompressed CSV/JSONL
    file larger than that is read in byte-range parts in parallel (:func:`plan_parts`), blocks
    are not redistributed (the parts are), and the output has a third key ``parts``
    (:class:`PartCount` per part) for :class:`NumberRejected`; until numbered, blocks and dead
    letters of a part ``> 0`` count rows and lines from the part's start.

    A CSV file whose quoted field holds a line break across a split point cannot be split at that
    point: its reader raises ``ValueError`` (nothing is released) asking for ``split_bytes=0``.
    """

    def __init__(self, pattern: str | Sequence[str], *, block_rows: int = DEFAULT_BLOCK_ROWS,
                 single_output: bool = False, split_bytes: int = 0, label: str | None = None) -> None:
        super().__init__(label)
        self._single_output = _check_flag("single_output", single_output)
        patterns = [pattern] if isinstance(pattern, str) else list(pattern)
        found = [f for pat in patterns for f in _expand_paths(pat)]
        self._paths = [p for p, _ in found]
        for p in self._paths:
            detect_format(p)
        if not isinstance(block_rows, int) or block_rows < 1:
            raise ValueError(f"block_rows ({block_rows!r}) must be an int >= 1")
        if isinstance(split_bytes, bool) or not isinstance(split_bytes, int) or split_bytes < 0:
            raise ValueError(f"split_bytes ({split_bytes!r}) must be an int >= 0 (0: one reader per file)")
        self._block_rows = block_rows
        self._split = split_bytes
        self._parts = plan_parts(found, split_bytes)

    @property
    def paths(self) -> list[str]:
        """The input files."""
        return list(self._paths)

    @property
    def parts(self) -> list[FilePart]:
        """The file parts read in parallel."""
        return list(self._parts)

    def expand(self, pbegin):
        if not self._split:
            paths = pbegin | "Files" >> beam.Create(self._paths)
            # str path
            blocks, rejected = _apply_with_dead_letters(
                paths, _ReadFileFn, (self._block_rows,), main="blocks",
                single_output=self._single_output, label="ReadFiles")
            # blocks: RawBlock, rejected: Rejected
            blocks = blocks | "Redistribute" >> beam.Reshuffle()
            return {"blocks": blocks, "rejected": rejected}
        parts = pbegin | "Parts" >> beam.Create(self._parts)
        # FilePart, spread over the workers by Create's reshuffle
        blocks, rejected, counts = _apply_with_dead_letters(
            parts, _ReadFileFn, (self._block_rows,), main="blocks",
            single_output=self._single_output, label="ReadParts", parts=True)
        # blocks: RawBlock, rejected: Rejected, counts: PartCount (row/line numbers part-local)
        return {"blocks": blocks, "rejected": rejected, "parts": counts}


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
                     line=None if block.lines is None else int(block.lines[i]), part=block.part)
            for i in range(n)
        ]
        return EncodedBatch(np.zeros((0, len(schema.columns)), np.int32),
                            None if schema.privacy_id is None else np.zeros(0, dtype=object)), rejected
    cols = dict(block.columns)
    batch, bad = schema.encode_columns(cols, n)
    rejected = [
        Rejected(block.source, int(block.rows[i]), reason, raw=_row_text(block, i),
                 line=None if block.lines is None else int(block.lines[i]), part=block.part)
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

    Uncompressed CSV/JSONL files larger than ``split_bytes`` (default 16 MiB; 0: one reader per
    file) are read in byte-range parts in parallel and each part is encoded where it was read, so
    only encoded cell codes leave the reading worker; dead letters get file-wide row and line
    numbers (:class:`NumberRejected`). Blocks depend only on the files and ``split_bytes``, so
    seeded output is the same on every runner and worker count.

    ``number_rejected=False`` skips that renumbering (whose ``GroupByKey``, like the ``Flatten`` of
    the read and encode dead letters, holds dead letters in memory until every part is read):
    ``rejected`` is then a list of two ``PCollection[Rejected]`` (read, encode) whose rows of file
    parts ``> 0`` count from their part's start, and ``parts`` the ``PartCount`` output (``None``
    when nothing is split), for ``write_rejected(rejected, out, part_counts=parts)``, which
    renumbers while it merges.
    """

    def __init__(self, pattern: str | Sequence[str], schema: Schema, *,
                 block_rows: int = DEFAULT_BLOCK_ROWS, single_output: bool = False,
                 split_bytes: int = DEFAULT_SPLIT_BYTES, number_rejected: bool = True,
                 label: str | None = None) -> None:
        super().__init__(label)
        self._read = ReadRawBlocks(pattern, block_rows=block_rows, single_output=single_output,
                                   split_bytes=split_bytes)
        self._schema = schema
        self._single_output = single_output
        self._split = split_bytes
        self._number = _check_flag("number_rejected", number_rejected)

    @property
    def paths(self) -> list[str]:
        """The input files."""
        return self._read.paths

    def expand(self, pbegin):
        raw = pbegin | "ReadRaw" >> self._read
        # blocks: RawBlock, rejected: Rejected (+ parts: PartCount when split)
        enc = raw["blocks"] | "EncodeRows" >> EncodeBlocks(self._schema, single_output=self._single_output)
        # batches: EncodedBatch, rejected: Rejected
        if not self._number:  # the caller renumbers, e.g. write_rejected(..., part_counts=parts)
            return {"batches": enc["batches"], "rejected": [raw["rejected"], enc["rejected"]],
                    "parts": raw.get("parts")}
        rejected = (raw["rejected"], enc["rejected"]) | "MergeRejected" >> beam.Flatten()
        if self._split:
            rejected = (rejected, raw["parts"]) | "NumberRejected" >> NumberRejected()
        # Rejected with file-wide row/line numbers
        return {"batches": enc["batches"], "rejected": rejected}


# -- writing --------------------------------------------------------------------------------------
class WriteTables(beam.PTransform):
    """Write ``PCollection[pyarrow.Table]`` to one file (format from the extension).

    ``avro_schema`` is needed for ``.avro`` output, ``arrow_schema`` for ``.parquet``.

    With ``num_shards=1`` (the default) the write streams
    (:class:`~beamsynth.pipelines.single_file.WriteSingleFile`): each table goes to its own part
    file where it is produced, only part paths are grouped, and one worker concatenates the parts
    into the output file; memory stays flat in the number of rows (Beam's single-shard sinks
    group every row under one key, which the DirectRunner holds in memory). Parts are ordered by
    their :func:`~beamsynth.pipelines.single_file.label_part` label (sampling window and shard),
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
        from beamsynth.pipelines.single_file import WriteSingleFile

        return tables | "SingleFile" >> WriteSingleFile(
            self._path, fmt=self._fmt, column_names=self._names, avro_schema=self._avro,
            arrow_schema=self._arrow)


def _rejected_sort_key(r: Rejected) -> bytes:
    """Bytes ordering dead letters by (source file, file part, row, line): the source as ASCII
    JSON (no JSON string is a prefix of another), numbers zero-padded, ``-`` for unknown."""
    def num(v: int | None) -> bytes:
        return b"-" if v is None else b"%020d" % v
    return b" ".join((json.dumps(r.source).encode("ascii"), b"%010d" % r.part, num(r.row), num(r.line)))


def _keyed_json(r: Rejected) -> tuple[bytes, str]:
    return _rejected_sort_key(r), r.to_json()


def _renumber_lines(counts: list[PartCount]) -> Any:
    """``rewrite(key, line)`` for the dead-letter merge: lines of file parts ``> 0`` get file-wide
    row and line numbers (part ``i`` offset by the records and lines of parts ``0..i-1``, as
    :func:`number_rejected`), others pass unchanged."""
    by_path: dict[str, dict[int, PartCount]] = {}
    for c in counts:
        by_path.setdefault(c.path, {})[c.index] = c
    offsets: dict[tuple[str, int], tuple[int, int]] = {}
    for path, parts in by_path.items():
        rows = lines = 0
        for i in range(len(parts)):
            if i not in parts:
                break  # incomplete: later parts get no offset (their dead letters raise)
            offsets[(path, i)] = (rows, lines)
            rows, lines = rows + parts[i].records, lines + parts[i].lines

    def rewrite(key: bytes, line: bytes) -> bytes:
        source, part = key.rsplit(b" ", 3)[:2]
        if part == b"0" * 10:
            return line
        r = json.loads(line)
        where = (json.loads(source), int(part))
        if where not in offsets:
            raise ValueError(f"part counts of {where[0]!r} are incomplete: no offset for part {where[1]}")
        row_off, line_off = offsets[where]
        fixed = Rejected(r["source"], None if r["row"] is None else r["row"] + row_off, r["reason"],
                         r["raw"], None if r["line"] is None else r["line"] + line_off)
        return (fixed.to_json() + "\n").encode("utf-8")
    return rewrite


def write_rejected(rejected: beam.PCollection | Sequence[beam.PCollection], output: str, *,
                   part_counts: beam.PCollection | None = None) -> Any:
    """Write dead-letter rows as JSON lines to ``rejected_path(output)`` (one file), streaming.

    ``rejected``: ``PCollection[Rejected]``, or several (written separately and merged: better
    than a ``Flatten`` of dead-letter outputs of different stages, which the DirectRunner holds
    in memory). ``part_counts``: the ``PartCount`` output of a read in file parts
    (:class:`ReadRawBlocks` with ``split_bytes``): dead letters may then still count rows and
    lines from their part's start, and are renumbered file-wide while merging (the work of
    :class:`NumberRejected`, without grouping the rows).

    Lines are ordered by (source file, row, line), then by content, on every runner. Rows never
    cross a shuffle here: each worker writes sorted runs where the rows are rejected and one
    worker merges them (:class:`~beamsynth.pipelines.single_file.WriteSortedLines`), so the write
    holds one run (8 MiB) per worker, whatever the number of rejected rows (Beam's
    ``WriteToText(num_shards=1)`` grouped every row under one key, which the DirectRunner holds
    in memory). What feeds it may still hold rows: ``ReadRecords``' merged ``rejected`` output is
    a ``Flatten`` of the read and encode stages, and ``NumberRejected`` groups a split file's
    dead letters. No rejected row: an empty file.
    """
    from beamsynth.pipelines.single_file import WriteSortedLines

    inputs = [rejected] if isinstance(rejected, beam.PCollection) else list(rejected)
    keyed = tuple(pc | f"RejectedToJson{'' if i == 0 else i}" >> beam.Map(_keyed_json)
                  for i, pc in enumerate(inputs))
    # (sort key bytes, JSON line) per input
    if part_counts is None:
        return keyed | "WriteRejected" >> WriteSortedLines(rejected_path(output))
    return {"lines": keyed, "context": part_counts} | "WriteRejected" >> WriteSortedLines(
        rejected_path(output), rewriter=_renumber_lines)
    # str: the dead-letter file path


def ensure_parent(path: str) -> None:
    """Create the folder of a local output path."""
    parent = os.path.dirname(os.path.abspath(path))
    if "://" not in path:
        os.makedirs(parent, exist_ok=True)
