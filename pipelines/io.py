"""Reading private records into columnar blocks (with a dead-letter output) and writing tables.

Formats by extension: ``.csv`` (and ``.csv.gz``), ``.jsonl``/``.ndjson``, ``.avro``, ``.parquet``.

Reading is split in two steps so that other transforms can reuse the raw form:

* :func:`iter_raw_blocks` / :class:`ReadRawBlocks`: a file → :class:`RawBlock` elements (up to
  ``block_rows`` rows of raw column values as pandas object Series) plus :class:`Rejected` rows
  that could not even be split into fields (ragged or malformed CSV lines, invalid JSON, bytes
  that are not UTF-8, corrupt Avro blocks and Parquet row groups, unreadable files).
* :class:`EncodeBlocks`: RawBlock → :class:`~beamsynth.schemas.schema.EncodedBatch` (cell codes
  for the declared schema) and, on the ``rejected`` output, every row with a value outside the
  declared domain, an unparseable value, a null where none is allowed or (JSONL) keys the
  schema does not allow, each with its reason.

Stability (privacy rule 6; docs/schema-format.md, "Reading rules"): every record is read and
judged alone, so adding or removing one record changes the used records by at most that
record. A CSV record is one physical line by default (``max_record_lines=1``: an unbalanced
quote rejects its own line, never the lines after it); the header (the first non-blank line) is
public structure and only it is a header. A JSONL record's keys are checked against the schema,
never against other records. A corrupt Avro block or Parquet row group is one dead letter and
reading goes on (after the next sync marker / with the next row group).

Nothing is dropped silently: rows read = rows encoded + rows rejected, and every rejected row
names its file, its row number (1-based, header excluded), its line where known (or its Avro
byte range / Parquet row group as ``block``), and the reason.

Parallel reading: :class:`ReadRecords` cuts uncompressed CSV/JSONL/Avro/Parquet files larger
than ``split_bytes`` into byte ranges (:func:`plan_parts`) read and encoded by different
workers; CSV/JSONL records are aligned to line starts, Avro parts own the blocks that begin in
their range (after a sync marker) and Parquet parts the row groups whose first page does. A
part's dead letters are renumbered file-wide (:class:`NumberRejected`; Parquet rows are
file-wide already, from the footer), and the result equals a sequential read byte for byte
(records never span lines there; a CSV file read with ``max_record_lines > 1`` is not split).
Avro and Parquet files are read block by block / row group by row group from a seekable
stream, so memory does not grow with the file size.
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
from beamsynth.transforms.coders import register_columnar
from beamsynth.transforms.conventions import display_items, element_types

__all__ = [
    "DEFAULT_SPLIT_BYTES",
    "MAX_RECORD_LINES_LIMIT",
    "AvroHeader",
    "check_max_record_lines",
    "iter_avro_blocks",
    "iter_parquet_row_groups",
    "parquet_group_offsets",
    "read_avro_header",
    "record_lines_note",
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
    "shift_rejected",
    "table_to_csv_text",
]

DEFAULT_BLOCK_ROWS = 20_000
DEFAULT_SPLIT_BYTES = 16 << 20  # uncompressed files larger than this are read in parts
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
    block: str | None = None  # Avro byte range / Parquet row group of a rejected block
    after: int | None = None  # a corrupt Avro block: rows read before it (sort position only)

    def to_json(self) -> str:
        """One JSON line (valid UTF-8: lone surrogates from undecodable bytes or JSON ``\\ud800``
        escapes become ``\\udXXX`` escapes instead of failing the dead-letter write); the key
        ``block`` only for a rejected Avro block or Parquet row group."""
        obj = {"source": self.source, "row": self.row, "line": self.line, "reason": self.reason,
               "raw": self.raw[:_RAW_LIMIT]}
        if self.block is not None:
            obj["block"] = self.block
        text = json.dumps(obj, ensure_ascii=False)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class RawBlock:
    """Up to ``block_rows`` raw rows of one file, column-wise (pandas object Series).

    ``rows`` holds the 1-based row number of each row in its file (header excluded) and ``lines``
    the line number where known (CSV/JSONL); in a block of file part ``part > 0`` (see
    :class:`FilePart`) both count from the start of the part.

    JSONL blocks have no header: ``key_sets`` lists the distinct key sets of their records and
    ``row_keys`` the index of each row's key set, so that each record is judged against the
    schema alone (a key it lacks is a null or a missing value, a key it adds concerns only it).
    Other formats (``key_sets=None``) have one header for the whole file: public structure.
    """

    source: str
    columns: dict[str, pd.Series]
    rows: np.ndarray
    lines: np.ndarray | None = None
    header_error: str | None = None
    raw_rows: list[str] = field(default_factory=list)
    part: int = 0
    key_sets: list[tuple[str, ...]] | None = None
    row_keys: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.rows.size)


register_columnar(RawBlock)  # size estimates without pickling (transforms/coders.py)

_CHUNK_BYTES = 1 << 22  # bytes read at a time by the line reader
_BOM = b"\xef\xbb\xbf"
# one line with its ending, universal newlines (\r\n, \r, \n) as io.TextIOWrapper(newline="")
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
_SURROGATE = re.compile("[\udc80-\udcff]")
# characters other than \r and \n that str.splitlines() also breaks on: a chunk without them (and
# without quotes or undecodable bytes) takes the fast path of the CSV reader
_SLOW_CHUNK = re.compile('["\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\udc80-\udcff]')
_LINE_ENDS = "\r\n"
_ODD_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_INVALID_UTF8 = "invalid UTF-8: the line holds undecodable bytes"
MAX_RECORD_LINES_LIMIT = 1_000  # largest allowed max_record_lines


def _open_binary(path: str) -> Any:
    fh = FileSystems.open(path, compression_type="uncompressed")
    if path.lower().endswith(".gz"):
        fh = gzip.GzipFile(fileobj=fh)
    return fh


class _LineSource:
    """Decoded lines of bytes ``[start, stop)`` of a file (``stop=None``: to the end).

    Lines split on universal newlines with their endings kept, decoded as UTF-8 with
    ``surrogateescape`` (undecodable bytes become lone surrogates ``\\udc80``-``\\udcff``, so a
    reader can reject exactly the lines that hold them), a byte-order mark dropped at offset 0:
    the same lines as ``io.TextIOWrapper(encoding="utf-8-sig", errors="surrogateescape",
    newline="")``. Line endings are ASCII and never inside a UTF-8 sequence, so how one line
    decodes never depends on another. :meth:`texts` hands out whole decoded chunks (each ends
    at a line end); iterating hands out lines. ``pulled`` counts the lines handed out.
    """

    def __init__(self, fh: Any, start: int = 0, stop: int | None = None, *,
                 chunk: int = _CHUNK_BYTES) -> None:
        self._fh, self._start, self._stop, self._chunk = fh, start, stop, chunk
        self.bom = False
        self.pulled = 0
        self._gen = self._chunks()
        self._pending: list[str] = []  # lines of the current chunk not handed out yet (reversed)

    def __iter__(self) -> Iterator[str]:
        while True:
            if not self._pending:
                text = next(self._texts(), None)
                if text is None:
                    return
                self._pending = _LINE.findall(text)[::-1]
                continue
            self.pulled += 1
            yield self._pending.pop()

    def texts(self) -> Iterator[str]:
        """Decoded chunks, each a run of whole lines (the last one may lack its ending), starting
        where line iteration stopped; the consumer adds the lines it takes to ``pulled``."""
        if self._pending:
            rest, self._pending = "".join(reversed(self._pending)), []
            yield rest
        yield from self._texts()

    def _texts(self) -> Iterator[str]:
        for chunk in self._gen:
            yield chunk.decode("utf-8", "surrogateescape")

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


# -- CSV: one record per line by default -----------------------------------------------------------
# RFC 4180 fields: quoted (quotes doubled inside, may hold line breaks) or unquoted (no quote,
# comma or line break). Used to classify lines when a record may span lines (max_record_lines > 1).
_QUOTED = r'"[^"]*(?:""[^"]*)*"'
_STRICT_RECORD = re.compile(rf'(?:{_QUOTED}|[^",\r\n]*)(?:,(?:{_QUOTED}|[^",\r\n]*))*')


def _csv_line_fields(body: str) -> list[str] | str:
    """Fields of one physical line (its ending removed), or the reason it is malformed.

    A line without quotes is split on commas. A line with quotes is read by Python's ``csv``
    module in strict mode, alone: a quoted field left open at the end of the line (an unbalanced
    quote) or text after a closing quote makes the line malformed; it is never continued on the
    next line, so one bad line affects only itself. A quote inside an unquoted field is kept as
    text (``5'11"``), as ``csv`` does.
    """
    if '"' not in body:
        return body.split(",")
    try:
        return next(csv.reader((body,), strict=True))
    except csv.Error as exc:
        if "unexpected end of data" in str(exc):
            return "malformed CSV line: a quoted field is not closed on its line (unbalanced quote)"
        return f"malformed CSV line: {exc}"


_STRICT_FIELD = re.compile(r'"([^"]*(?:""[^"]*)*)"|([^",\r\n]*)')


def _strict(text: str) -> bool:
    return _STRICT_RECORD.fullmatch(text) is not None


def _strict_fields(text: str) -> list[str]:
    """Fields of a record that :func:`_strict` accepts (quoted fields unquoted, ``""`` → ``"``)."""
    fields, pos = [], 0
    while True:
        m = _STRICT_FIELD.match(text, pos)
        quoted, plain = m.group(1), m.group(2)
        fields.append(plain if quoted is None else quoted.replace('""', '"'))
        pos = m.end() + 1  # past the comma
        if pos > len(text):
            return fields


def _line_role(body: str) -> str:
    """Role of a line when records may span lines (RFC 4180, decided from the line alone).

    ``complete``: a whole record; ``opener``: opens a quoted field it does not close, and cannot
    close one (a line that could do both is never an opener); ``closer``: closes a quoted field
    open at its start, then ends the record; ``inner``: stays inside a quoted field (possibly
    closing it and opening another); ``bad``: none of these (or undecodable bytes).
    """
    if _SURROGATE.search(body) is not None:
        return "bad"
    if _strict(body):
        return "complete"
    closer = _strict('"' + body)
    if closer:
        return "closer"
    if _strict(body + '"'):
        return "opener"
    if _strict('"' + body + '"'):
        return "inner"
    return "bad"


def _continues(body: str) -> str:
    """How a line reads inside an open quoted field: ``closer``, ``inner`` or ``bad``."""
    if _SURROGATE.search(body) is not None:
        return "bad"
    if _strict('"' + body):
        return "closer"
    if _strict('"' + body + '"'):
        return "inner"
    return "bad"


# One CSV record found by a line reader: (first line number, fields or the reason the record is
# malformed, raw text of a malformed record); a plain tuple, made once per input line.
_CsvItem = tuple[int, "list[str] | str", str]


def _iter_csv_records(src: _LineSource, line_no: int, max_lines: int) -> Iterator[_CsvItem | int]:
    """Records of the lines of ``src`` after the header (``line_no`` lines already consumed).

    Yields :class:`_CsvItem` per record, or an ``int`` (a line number) per blank line. With
    ``max_lines == 1`` every non-blank line is one record. With ``max_lines = L > 1`` a record may
    span up to ``L`` lines: an *opener* line (see :func:`_line_role`) followed by *inner* lines and
    a *closer* within ``L`` lines is one record; otherwise the opener alone is malformed and
    reading resumes at the next line. See docs/schema-format.md for why one added line then
    changes at most ``L - 1`` records (``L = 1``: only itself).
    """
    if max_lines == 1:
        yield from _iter_csv_single(src, line_no)
        return
    window: list[str] = []
    it = iter(src)
    exhausted = False

    def fill(n: int) -> None:
        nonlocal exhausted
        while len(window) < n and not exhausted:
            try:
                window.append(next(it))
            except StopIteration:
                exhausted = True

    while True:
        fill(1)
        if not window:
            return
        line = window[0]
        body = line.rstrip(_LINE_ENDS)
        if not body:
            window.pop(0)
            line_no += 1
            yield line_no
            continue
        role = _line_role(body)
        take = 1
        item: _CsvItem
        if role == "complete":
            item = (line_no + 1, _strict_fields(body), "")
        elif role == "opener":
            fill(max_lines)
            take = 0
            for j in range(1, len(window)):
                cont = _continues(window[j].rstrip(_LINE_ENDS))
                if cont == "closer":
                    take = j + 1
                    break
                if cont == "bad":
                    break
            if take:
                text = "".join(window[:take]).rstrip(_LINE_ENDS)
                item = (line_no + 1, _strict_fields(text), "")
            else:
                take = 1
                item = (line_no + 1, f"malformed CSV line: a quoted field is not closed within "
                                     f"{max_lines} lines (max_record_lines)", body)
        elif role == "bad" and _SURROGATE.search(body) is not None:
            item = (line_no + 1, _INVALID_UTF8, body)
        else:
            item = (line_no + 1, f"malformed CSV line (RFC 4180, {role} line outside a record)"
                    if role == "closer" else "malformed CSV line (RFC 4180)", body)
        del window[:take]
        line_no += take
        yield item


def _iter_csv_single(src: _LineSource, line_no: int) -> Iterator[_CsvItem | int]:
    """:func:`_iter_csv_records` with one line per record; chunks without quotes, undecodable
    bytes or unusual line breaks are split in bulk (``str.splitlines``, ``str.split``), others
    through one ``csv.reader`` pass (:func:`_csv_lines_fields`)."""
    for text in src.texts():
        if _SLOW_CHUNK.search(text) is None:
            bodies = text.splitlines()
            src.pulled += len(bodies)
            for body in bodies:
                line_no += 1
                yield (line_no, body.split(","), "") if body else line_no
            continue
        if _ODD_BREAKS.search(text) is None:  # only \r, \n, \r\n end lines: splitlines is exact
            bodies = text.splitlines()
        else:
            bodies = [line.rstrip(_LINE_ENDS) for line in _LINE.findall(text)]
        src.pulled += len(bodies)
        dirty = _SURROGATE.search(text) is not None
        good = [k for k, body in enumerate(bodies)
                if body and not (dirty and _SURROGATE.search(body) is not None)]
        parsed: list[Any] = [None] * len(bodies)
        for k, fields in zip(good, _csv_lines_fields([bodies[k] for k in good]), strict=True):
            parsed[k] = fields
        for body, fields in zip(bodies, parsed, strict=True):
            line_no += 1
            if not body:
                yield line_no
            elif fields is None:
                yield line_no, _INVALID_UTF8, body
            else:
                yield line_no, fields, body


def _csv_lines_fields(bodies: list[str]) -> list[list[str] | str]:
    """:func:`_csv_line_fields` of every line, in one ``csv.reader`` pass where it agrees: the
    reader's ``line_num`` shows when a record took more than one line (an unbalanced quote) or a
    line raised; those lines are then read one by one, so the result is the per-line one."""
    out: list[list[str] | str] = []
    pos = 0
    while pos < len(bodies):
        reader = csv.reader(bodies[pos:] if pos else bodies, strict=True)
        base = pos
        try:
            for rec in reader:
                end = base + reader.line_num
                if end - pos == 1:
                    out.append(rec)
                else:
                    out.extend(_csv_line_fields(bodies[k]) for k in range(pos, end))
                pos = end
        except csv.Error:
            end = max(base + reader.line_num, pos + 1)
            out.extend(_csv_line_fields(bodies[k]) for k in range(pos, end))
            pos = end
    return out


def _read_csv_header(src: _LineSource) -> tuple[list[str] | None, str | None, int, int]:
    """(header fields, error, lines consumed, bytes consumed after a BOM) of a CSV line source.

    The header is the first non-blank line (blank lines before it are skipped), read as one
    line: it is public structure, decided before any record. ``(None, None, ...)``: no header
    (an empty or blank file).
    """
    used = lines = 0
    for line in src:
        lines += 1
        used += len(line.encode("utf-8", "surrogateescape"))
        body = line.rstrip(_LINE_ENDS)
        if not body:
            continue
        fields = _csv_line_fields(body)
        if isinstance(fields, str):
            return None, f"unreadable CSV header: {fields}", lines, used
        return [_clean(h).strip() for h in fields], None, lines, used
    return None, None, lines, used


def _csv_header(path: str) -> tuple[list[str] | None, int]:
    """(header fields, byte offset where the records begin) of a CSV file; ``(None, 0)`` when
    the file is empty or its header unreadable (the reader of part 0 reports that)."""
    with _open_binary(path) as fh:
        src = _LineSource(fh, chunk=1 << 16)
        header, _, _, size = _read_csv_header(src)
        if header is None:
            return None, 0
        return header, size + (len(_BOM) if src.bom else 0)


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
              state: _PartState | None = None, max_lines: int = 1) -> Iterator[RawBlock | Rejected]:
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
        line_no = 0
        if header is None:
            header, error, line_no, _ = _read_csv_header(src)
            if error is not None:
                yield Rejected(path, None, error, line=line_no)
                return
            if header is None:
                return
        width = len(header)
        rows: list[list[Any]] = []
        nums: list[int] = []
        lines: list[int] = []
        row_no = 0
        try:
            items = (_iter_csv_single(src, line_no) if max_lines == 1
                     else _iter_csv_records(src, line_no, max_lines))
            for item in items:
                if isinstance(item, int):  # a blank line: not a record
                    continue
                row_no += 1
                line, rec, raw = item
                if isinstance(rec, str):  # the reason the record is malformed
                    yield Rejected(path, row_no, rec, raw=_clean(raw), line=line, part=idx)
                    continue
                if len(rec) != width:
                    yield Rejected(path, row_no, f"row has {len(rec)} fields but the header has {width}",
                                   raw=_clean(",".join(rec)), line=line, part=idx)
                    continue
                rows.append(rec)
                nums.append(row_no)
                lines.append(line)
                if len(rows) >= block_rows:
                    yield _block(path, header, rows, nums, lines, idx)
                    rows, nums, lines = [], [], []
            if rows:
                yield _block(path, header, rows, nums, lines, idx)
        finally:
            if state is not None:
                state.records, state.lines = row_no, src.pulled


# -- JSONL: every line is one record, judged alone --------------------------------------------------
def _iter_jsonl(path: str, block_rows: int, part: FilePart | None = None,
                state: _PartState | None = None) -> Iterator[RawBlock | Rejected]:
    """Records of a JSON-lines file. Each record keeps its own key set (``RawBlock.key_sets``):
    which keys it lacks or adds is judged against the schema for that record alone
    (:func:`encode_block`), never against the other records of its block or file."""
    rows: list[dict[str, Any]] = []
    nums: list[int] = []
    lines: list[int] = []
    row_no = 0
    idx = 0 if part is None else part.index

    def flush() -> RawBlock:
        sets: dict[tuple[str, ...], int] = {}
        which = np.fromiter((sets.setdefault(tuple(r), len(sets)) for r in rows), np.int32, len(rows))
        keys = list(dict.fromkeys(k for ks in sets for k in ks))
        cols = {k: pd.Series([r.get(k) for r in rows], dtype=object) for k in keys}
        return RawBlock(path, cols, np.asarray(nums, np.int64), np.asarray(lines, np.int64), part=idx,
                        key_sets=list(sets), row_keys=which)

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
                if _SURROGATE.search(line) is not None:
                    yield Rejected(path, row_no, "invalid UTF-8: the line holds undecodable bytes",
                                   raw=_clean(line), line=line_no, part=idx)
                    continue
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


# -- Avro: blocks between sync markers; a corrupt block is one dead letter --------------------------
_AVRO_MAGIC = b"Obj\x01"
_SYNC = 16


@dataclass(frozen=True)
class AvroHeader:
    """An Avro container file's header: its bytes (magic, metadata, sync marker), the writer
    schema's field names, the sync marker and the offset of the first data block."""

    raw: bytes
    fields: list[str]
    sync: bytes
    data_start: int


class _ByteReader:
    """Forward reads of a seekable binary stream with a refillable buffer (tracks the offset)."""

    def __init__(self, fh: Any, offset: int = 0, chunk: int = 1 << 20) -> None:
        self._fh, self._chunk = fh, chunk
        fh.seek(offset)
        self.offset = offset  # file offset of self._buf[self._pos]
        self._buf, self._pos = b"", 0

    def _fill(self, n: int) -> bool:
        while len(self._buf) - self._pos < n:
            data = self._fh.read(max(self._chunk, n))
            if not data:
                return False
            self._buf = self._buf[self._pos:] + data
            self._pos = 0
        return True

    def at_end(self) -> bool:
        """True when no byte is left."""
        return not self._fill(1)

    def read(self, n: int) -> bytes:
        """Exactly ``n`` bytes, or fewer at the end of the file."""
        self._fill(n)
        out = self._buf[self._pos:self._pos + n]
        self._pos += len(out)
        self.offset += len(out)
        return out

    def long(self) -> int:
        """An Avro zig-zag varint; ``ValueError`` when malformed or cut off."""
        shift = acc = 0
        for _ in range(10):
            b = self.read(1)
            if not b:
                raise ValueError("the file ends inside a block header")
            acc |= (b[0] & 0x7F) << shift
            if not b[0] & 0x80:
                return (acc >> 1) ^ -(acc & 1)
            shift += 7
        raise ValueError("a block header holds a varint longer than 10 bytes")

    def seek_past(self, marker: bytes) -> bool:
        """Move just past the next occurrence of ``marker``; False (at EOF) when there is none."""
        while True:
            i = self._buf.find(marker, self._pos)
            if i >= 0:
                self.offset += i + len(marker) - self._pos
                self._pos = i + len(marker)
                return True
            keep = max(self._pos, len(self._buf) - len(marker) + 1)
            self.offset += keep - self._pos
            self._buf, self._pos = self._buf[keep:], 0
            data = self._fh.read(self._chunk)
            if not data:
                self.offset += len(self._buf)
                self._buf = b""
                return False
            self._buf += data


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        if n & ~0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        else:
            out.append(n)
            return bytes(out)


def read_avro_header(fh: Any) -> AvroHeader:
    """The header of an Avro container file at the start of ``fh`` (``ValueError`` if invalid)."""
    import fastavro

    fh.seek(0)
    src = _ByteReader(fh)
    if src.read(4) != _AVRO_MAGIC:
        raise ValueError("not an Avro container file (bad magic bytes)")
    meta: dict[str, bytes] = {}
    while True:
        count = src.long()
        if count == 0:
            break
        if count < 0:
            count = -count
            src.long()  # the byte size of the map block
        for _ in range(count):
            key = src.read(src.long()).decode("utf-8")
            meta[key] = src.read(src.long())
    sync = src.read(_SYNC)
    if len(sync) != _SYNC:
        raise ValueError("the file ends inside its header")
    schema = fastavro.parse_schema(json.loads(meta["avro.schema"]))
    end = src.offset
    fh.seek(0)
    raw = fh.read(end)
    return AvroHeader(raw, [f["name"] for f in schema.get("fields", [])], sync, end)


def _decode_avro_block(header: AvroHeader, count: int, payload: bytes) -> list[dict[str, Any]]:
    """The records of one block (decompressed by its codec), checked against its count."""
    from io import BytesIO

    import fastavro

    container = header.raw + _zigzag(count) + _zigzag(len(payload)) + payload + header.sync
    records = list(fastavro.reader(BytesIO(container)))
    if len(records) != count:
        raise ValueError(f"the block declares {count} records but holds {len(records)}")
    return records


@dataclass
class _AvroBlock:
    """One data block of an Avro file: byte range, its records or the reason it is unreadable."""

    start: int
    stop: int
    records: list[dict[str, Any]] | None
    error: str = ""


def iter_avro_blocks(fh: Any, header: AvroHeader, start: int | None = None,
                     stop: int | None = None) -> Iterator[_AvroBlock]:
    """Data blocks of an Avro file that begin in bytes ``[start, stop)`` (default: all).

    ``start`` inside the data is moved just past the next sync marker, so disjoint byte ranges
    read every block exactly once. A block whose framing (count, size, sync marker) or content
    does not decode is reported with its byte range and the reader resumes after the next sync
    marker: one corrupt block never hides the blocks after it.
    """
    src = _ByteReader(fh, header.data_start)
    if start is not None and start > header.data_start:
        src = _ByteReader(fh, start - _SYNC)
        if not src.seek_past(header.sync):
            return
    while stop is None or src.offset < stop:
        begin = src.offset
        if src.at_end():
            return
        try:
            count, size = src.long(), src.long()
            if count < 0 or size < 0:
                raise ValueError(f"negative block count or size ({count}, {size})")
            payload = src.read(size)
            if len(payload) != size:
                raise ValueError("the file ends inside a block")
            if src.read(_SYNC) != header.sync:
                raise ValueError("the block does not end with the file's sync marker")
            records = _decode_avro_block(header, count, payload)
        except Exception as exc:  # fastavro and codecs raise many types for corrupt data
            src = _ByteReader(fh, begin + 1)
            src.seek_past(header.sync)
            yield _AvroBlock(begin, src.offset, None, f"{type(exc).__name__}: {exc}")
            continue
        yield _AvroBlock(begin, src.offset, records)


def _iter_avro(path: str, block_rows: int, part: FilePart | None = None,
               state: _PartState | None = None) -> Iterator[RawBlock | Rejected]:
    """Records of an Avro file, block by block (or of the blocks beginning in ``part``'s byte
    range: rows counted from the part's start, renumbered file-wide from ``state.records``)."""
    idx = 0 if part is None else part.index
    start, stop = (None, None) if part is None else (part.start, part.stop)
    with FileSystems.open(path, compression_type="uncompressed") as fh:
        try:
            header = read_avro_header(fh)
        except Exception as exc:  # a bad header: bad magic, metadata, schema
            if idx == 0:  # reported once, by the first part
                yield Rejected(path, None, f"unreadable Avro file: {exc}")
            return
        names = header.fields
        rows: list[dict[str, Any]] = []
        nums: list[int] = []
        row_no = 0
        for blk in iter_avro_blocks(fh, header, start, stop):
            if blk.records is None:
                yield Rejected(path, None, f"corrupt Avro block at bytes {blk.start}-{blk.stop} (after "
                               f"row {row_no}; skipped to the next sync marker): {blk.error}",
                               block=f"bytes {blk.start}-{blk.stop}", part=idx, after=row_no)
                continue
            for rec in blk.records:
                row_no += 1
                rows.append(rec)
                nums.append(row_no)
                if len(rows) >= block_rows:
                    yield RawBlock(path, {k: pd.Series([r.get(k) for r in rows], dtype=object)
                                          for k in names}, np.asarray(nums, np.int64), part=idx)
                    rows, nums = [], []
        if rows:
            yield RawBlock(path, {k: pd.Series([r.get(k) for r in rows], dtype=object) for k in names},
                           np.asarray(nums, np.int64), part=idx)
        if state is not None:
            state.records = row_no


# -- Parquet: row groups; a corrupt row group is one dead letter ------------------------------------
def iter_parquet_row_groups(pf: Any, groups: Iterable[int] | None = None) -> Iterator[tuple[int, int, Any]]:
    """``(group, first row (0-based), pyarrow.Table or the exception)`` per row group of a
    ``pyarrow.parquet.ParquetFile`` (``groups``: which ones, default all). A group is read whole
    before any of its rows is used, so a corrupt page rejects its group and nothing else."""
    meta = pf.metadata
    starts = np.concatenate([[0], np.cumsum([meta.row_group(g).num_rows
                                             for g in range(meta.num_row_groups)])]).astype(np.int64)
    for g in range(meta.num_row_groups) if groups is None else groups:
        try:
            table: Any = pf.read_row_group(g)
            if table.num_rows != meta.row_group(g).num_rows:
                raise ValueError(f"row group holds {table.num_rows} rows, its metadata says "
                                 f"{meta.row_group(g).num_rows}")
        except Exception as exc:  # pyarrow raises several types for corrupt pages
            table = exc
        yield g, int(starts[g]), table


def parquet_group_offsets(meta: Any) -> list[int]:
    """Byte offset of each row group's first page (its dictionary page if any) from a Parquet
    footer (``pyarrow.parquet.FileMetaData``); negative offsets read as 0."""
    out = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        firsts = []
        for c in range(rg.num_columns):
            col = rg.column(c)
            dict_at = col.dictionary_page_offset if col.has_dictionary_page else None
            firsts.append(dict_at if dict_at else col.data_page_offset)
        out.append(max(0, min(firsts, default=0)))
    return out


def _part_groups(meta: Any, part: FilePart | None) -> list[int] | None:
    """Row groups whose first page begins in ``part``'s byte range (``None``: the whole file)."""
    if part is None:
        return None
    return [g for g, at in enumerate(parquet_group_offsets(meta))
            if (part.index == 0 or at >= part.start) and (part.stop is None or at < part.stop)]


def _iter_parquet(path: str, block_rows: int, part: FilePart | None = None) -> Iterator[RawBlock | Rejected]:
    """Rows of a Parquet file row group by row group through a seekable stream (memory: one row
    group), or of the row groups ``part`` owns; row numbers are file-wide (from the footer)."""
    import pyarrow.parquet as pq

    with FileSystems.open(path, compression_type="uncompressed") as fh:
        try:
            pf = pq.ParquetFile(fh, page_checksum_verification=True)
        except (pa.ArrowInvalid, OSError) as exc:
            if part is None or part.index == 0:  # reported once, by the first part
                yield Rejected(path, None, f"unreadable Parquet file: {exc}")
            return
        for g, first, table in iter_parquet_row_groups(pf, _part_groups(pf.metadata, part)):
            n = pf.metadata.row_group(g).num_rows
            if isinstance(table, Exception):
                where = f"row group {g}, rows {first + 1}-{first + n}"
                yield Rejected(path, first + 1 if n else None,
                               f"corrupt Parquet {where}: {type(table).__name__}: {table}",
                               block=where)
                continue
            for off in range(0, table.num_rows, block_rows):
                part = table.slice(off, block_rows)
                cols = {name: pd.Series(part.column(i).to_pylist(), dtype=object)
                        for i, name in enumerate(part.schema.names)}
                yield RawBlock(path, cols, np.arange(first + off + 1, first + off + part.num_rows + 1,
                                                     dtype=np.int64))


def check_max_record_lines(value: Any) -> int:
    """``max_record_lines`` validated: an int in ``[1, MAX_RECORD_LINES_LIMIT]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RECORD_LINES_LIMIT:
        raise ValueError(f"max_record_lines ({value!r}) must be an int in [1, {MAX_RECORD_LINES_LIMIT}] "
                         "(physical lines one CSV record may span; 1: no line breaks inside fields)")
    return value


def record_lines_note(max_record_lines: int) -> dict[str, Any]:
    """What ``max_record_lines`` means for the guarantee, for the manifest's ``privacy_unit``:
    nothing for 1 (exactly stable); for ``L > 1`` the bound, and for ``L >= 3`` the group of
    ``L - 1`` records one added or removed record may change (docs/schema-format.md)."""
    lines = check_max_record_lines(max_record_lines)
    if lines == 1:
        return {}
    note = {"csv_max_record_lines": lines}
    if lines >= 3:
        note["csv_records_one_record_may_change"] = lines - 1
    return note


def iter_raw_blocks(path: str, *, block_rows: int = DEFAULT_BLOCK_ROWS, part: FilePart | None = None,
                    counts: _PartState | None = None,
                    max_record_lines: int = 1) -> Iterator[RawBlock | Rejected]:
    """Raw blocks and unsplittable rows of one file, or of one :class:`FilePart` of a CSV/JSONL
    file (Beam-free). ``counts`` (if given) receives the part's records and lines when done.

    ``max_record_lines``: physical lines one CSV record may span (a quoted field holding line
    breaks); 1 (default) reads every line as one record, which makes the used records exactly
    stable (docs/schema-format.md, "Reading rules"). Files read in parts need 1.
    """
    fmt = detect_format(path)
    max_lines = check_max_record_lines(max_record_lines)
    if part is not None and (part.index > 0 or part.stop is not None) and not _splittable(path, max_lines):
        raise ValueError(f"{path!r} cannot be read in parts ({fmt}{', gzip' if path.lower().endswith('.gz') else ''}"
                         f"{', max_record_lines > 1' if max_lines > 1 else ''})")
    try:
        if fmt == "csv":
            yield from _iter_csv(path, block_rows, part, counts, max_lines)
        elif fmt == "jsonl":
            yield from _iter_jsonl(path, block_rows, part, counts)
        elif part is None:  # whole file (the audit's broken readers replace these two)
            yield from (_iter_avro if fmt == "avro" else _iter_parquet)(path, block_rows)
        elif fmt == "avro":
            yield from _iter_avro(path, block_rows, part, counts)
        else:
            yield from _iter_parquet(path, block_rows, part)
    except (OSError, UnicodeError, EOFError) as exc:
        yield Rejected(path, None, f"cannot read {fmt} file: {exc}", part=0 if part is None else part.index)


def _splittable(path: str, max_record_lines: int = 1) -> bool:
    fmt = detect_format(path)
    return ((fmt in ("jsonl", "avro", "parquet") or (fmt == "csv" and max_record_lines == 1))
            and not path.lower().endswith(".gz"))


def plan_parts(paths_sizes: Sequence[tuple[str, int | None]], split_bytes: int, *,
               max_record_lines: int = 1) -> list[FilePart]:
    """File parts for parallel reading: uncompressed CSV/JSONL/Avro/Parquet files larger than
    ``split_bytes`` are cut into ``ceil(size / split_bytes)`` equal byte ranges (the readers then
    align records to line starts, Avro blocks to sync markers, Parquet row groups to their first
    page); other files (and ``split_bytes=0``) are one part each, and so is a
    CSV file when records may span lines (``max_record_lines > 1``). Sizes are file metadata,
    known before any record is read; the plan is the same on every runner."""
    parts = []
    for path, size in paths_sizes:
        if not split_bytes or size is None or size <= split_bytes or not _splittable(path, max_record_lines):
            parts.append(FilePart(path, 0, 0, None))
            continue
        n = -(-size // split_bytes)
        cuts = [size * i // n for i in range(n)]
        parts.extend(FilePart(path, i, cuts[i], cuts[i + 1] if i + 1 < n else None) for i in range(n))
    return parts


class _ReadFileFn(beam.DoFn):
    """``FilePart`` → ``RawBlock`` (main), ``Rejected`` (tag ``rejected``), one ``PartCount``
    (tag ``parts``; only for files read in several parts)."""

    def __init__(self, block_rows: int, max_record_lines: int = 1, tagged: bool = True) -> None:
        self._block_rows = block_rows
        self._max_lines = max_record_lines
        self._tagged = tagged
        self._read = Metrics.counter(METRICS_NAMESPACE, "rows_read")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rows_rejected_unparseable")

    def process(self, part: FilePart | str):
        if isinstance(part, str):
            part = FilePart(part, 0, 0, None)
        whole = part.index == 0 and part.stop is None
        counts = _PartState()
        for item in iter_raw_blocks(part.path, block_rows=self._block_rows,
                                    part=None if whole else part, counts=counts,
                                    max_record_lines=self._max_lines):
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
                             single_output: bool, label: str, parts: bool = False,
                             main_type: type | None = None) -> tuple[Any, ...]:
    """``(main, rejected)`` outputs of a DoFn whose dead letters are :class:`Rejected` rows
    (``(main, rejected, parts)`` with ``parts``: its :class:`PartCount` output too).

    By default a tagged multi-output ParDo. With ``single_output`` the DoFn emits every kind on
    one output and ``Filter`` steps split them by type: Beam's DaskRunner (2.77) sends every
    output of a multi-output ParDo to every consumer (see docs/runners.md). ``main_type``: the
    main output's element type (its registered coder, e.g. transforms/coders.py's).
    """
    tags = ("rejected", "parts") if parts else ("rejected",)
    if not single_output:
        fn = beam.ParDo(fn_cls(*args))
        if main_type is not None:
            fn = fn.with_output_types(main_type)
        out = pcoll | label >> fn.with_outputs(*tags, main=main)
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
            r = shift_rejected(r, row_off[r.part], line_off[r.part])
        out.append(r)
    return out


_AFTER_ROW = re.compile(r"\(after row (\d+);")


def shift_rejected(r: Rejected, row_off: int, line_off: int) -> Rejected:
    """``r`` numbered file-wide (part 0): row, line and a corrupt Avro block's ``after row N``
    moved by the rows and lines of the parts before its own (its ``block`` kept)."""
    reason = r.reason
    if r.block is not None and row_off:
        reason = _AFTER_ROW.sub(lambda m: f"(after row {int(m.group(1)) + row_off};", reason, count=1)
    return Rejected(r.source, None if r.row is None else r.row + row_off, reason, r.raw,
                    None if r.line is None else r.line + line_off, block=r.block,
                    after=None if r.after is None else r.after + row_off)


def _first_part(r: Rejected) -> bool:
    return r.part == 0


def _later_part(r: Rejected) -> bool:
    return r.part != 0


@element_types(inputs={0: Rejected, 1: PartCount}, output=Rejected)
class NumberRejected(beam.PTransform):
    """``(rejected, part counts)`` → dead letters with file-wide row and line numbers.

    Only needed when files are read in parts (:class:`ReadRawBlocks` with ``split_bytes``).
    Dead letters of part 0 (and of unsplit files) are already numbered and pass straight through;
    those of later parts are grouped by file with the part counts (a ``GroupByKey``, safe on every
    runner), so they are held until every part of their file has been read.
    """

    def display_data(self) -> dict[str, Any]:
        """What the step does (no parameters, no data values)."""
        return display_items(step="number dead letters file-wide from the part counts")

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


@element_types(outputs={"blocks": RawBlock, "rejected": Rejected, "parts": PartCount})
class ReadRawBlocks(beam.PTransform):
    """Files (a path or glob) → ``RawBlock`` (main) and ``Rejected`` (tag ``rejected``).

    The file list (and file sizes) are resolved when the pipeline is built (file names and sizes
    are not private data). With ``split_bytes=0`` (default) each file is one reader and its blocks
    are redistributed over the workers. With ``split_bytes > 0`` every uncompressed CSV/JSONL
    file larger than that is read in byte-range parts in parallel (:func:`plan_parts`), blocks
    are not redistributed (the parts are), and the output has a third key ``parts``
    (:class:`PartCount` per part) for :class:`NumberRejected`; until numbered, blocks and dead
    letters of a part ``> 0`` count rows and lines from the part's start.

    ``max_record_lines`` (default 1): physical lines one CSV record may span. With 1 a quoted
    field never continues on the next line (an unbalanced quote rejects its own line only), so
    split reads equal one reader byte for byte; CSV files with ``max_record_lines > 1`` are read
    by one reader each. See docs/schema-format.md, "Reading rules".
    """

    def __init__(self, pattern: str | Sequence[str], *, block_rows: int = DEFAULT_BLOCK_ROWS,
                 single_output: bool = False, split_bytes: int = 0, max_record_lines: int = 1,
                 label: str | None = None) -> None:
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
        self._max_lines = check_max_record_lines(max_record_lines)
        self._parts = plan_parts(found, split_bytes, max_record_lines=self._max_lines)

    @property
    def paths(self) -> list[str]:
        """The input files."""
        return list(self._paths)

    @property
    def parts(self) -> list[FilePart]:
        """The file parts read in parallel."""
        return list(self._parts)

    def display_data(self) -> dict[str, Any]:
        """Files and parts read (names and sizes are not private; no data values)."""
        return display_items(step="read files into raw blocks (dead letters tagged 'rejected')",
                             files=len(self._paths), parts=len(self._parts),
                             block_rows=self._block_rows, split_bytes=self._split)

    def expand(self, pbegin):
        if not self._split:
            paths = pbegin | "Files" >> beam.Create(self._paths)
            # str path
            blocks, rejected = _apply_with_dead_letters(
                paths, _ReadFileFn, (self._block_rows, self._max_lines), main="blocks",
                single_output=self._single_output, label="ReadFiles", main_type=RawBlock)
            # blocks: RawBlock, rejected: Rejected
            blocks = blocks | "Redistribute" >> beam.Reshuffle()
            return {"blocks": blocks, "rejected": rejected}
        parts = pbegin | "Parts" >> beam.Create(self._parts)
        # FilePart, spread over the workers by Create's reshuffle
        blocks, rejected, counts = _apply_with_dead_letters(
            parts, _ReadFileFn, (self._block_rows, self._max_lines), main="blocks",
            single_output=self._single_output, label="ReadParts", parts=True, main_type=RawBlock)
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


def _record_key_checks(schema: Schema, block: RawBlock) -> tuple[dict[int, str], dict[str, pd.Series]]:
    """Per-record checks of a JSONL block: ``({row: reason}, declared columns)``.

    Each key set is checked against the schema alone: a declared nullable key it lacks is a
    null, a lacking non-nullable key (or privacy id) or, under ``extra_columns: reject``, an
    undeclared key rejects the records with that key set; an Avro-safe alias
    (``education_num``) stands for its declared name in the records that lack the name.
    """
    wanted = schema.names + ([schema.privacy_id] if schema.privacy_id else [])
    nullable = {c.name for c in schema.columns if c.nullable}
    n = len(block)
    absent = pd.Series([None] * n, dtype=object)
    cols = {name: block.columns.get(name, absent) for name in wanted}
    which = block.row_keys if block.row_keys is not None else np.zeros(n, np.int32)
    reasons: dict[int, str] = {}
    for k, keys in enumerate(block.key_sets or [()]):
        rows = np.flatnonzero(which == k)
        have = list(keys)
        for name in wanted:
            alias = avro_field_name(name)
            if name not in keys and alias != name and alias in keys:
                have[have.index(alias)] = name
                values = cols[name].copy() if cols[name] is not absent else absent.copy()
                values.iloc[rows] = block.columns[alias].iloc[rows].to_numpy()
                cols[name] = values
        try:
            schema.check_header(have + [c for c in wanted if c in nullable and c not in have])
        except SchemaError as exc:
            text = str(exc).replace("input header lacks", "record lacks").replace("; header is", "; its keys are")
            for i in rows:
                reasons[int(i)] = f"record keys: {text}"
    return reasons, cols


def _no_rows(schema: Schema) -> EncodedBatch:
    return EncodedBatch(np.zeros((0, len(schema.columns)), np.int32),
                        None if schema.privacy_id is None else np.zeros(0, dtype=object))


def encode_block(schema: Schema, block: RawBlock) -> tuple[EncodedBatch, list[Rejected]]:
    """Encode one raw block; every row that cannot be encoded becomes a :class:`Rejected`.

    A file header (CSV, Avro, Parquet) is public structure checked once for the block; JSONL
    records are checked one by one (:func:`_record_key_checks`)."""
    n = len(block)

    def dead(i: int, reason: str) -> Rejected:
        return Rejected(block.source, int(block.rows[i]), reason, raw=_row_text(block, i),
                        line=None if block.lines is None else int(block.lines[i]), part=block.part)

    if block.key_sets is None:
        block.columns = _align_columns(schema, block.columns)
        try:
            schema.check_header(list(block.columns))
        except SchemaError as exc:
            return _no_rows(schema), [dead(i, f"file header: {exc}") for i in range(n)]
        batch, bad = schema.encode_columns(dict(block.columns), n)
        return batch, [dead(i, reason) for i, reason in bad]
    key_bad, cols = _record_key_checks(schema, block)
    keep = np.ones(n, dtype=bool)
    keep[list(key_bad)] = False
    idx = np.flatnonzero(keep)
    if idx.size < n:
        cols = {k: v.iloc[idx].reset_index(drop=True) for k, v in cols.items()}
    batch, bad = schema.encode_columns(cols, int(idx.size)) if idx.size else (_no_rows(schema), [])
    reasons = {**key_bad, **{int(idx[i]): reason for i, reason in bad}}
    return batch, [dead(i, reasons[i]) for i in sorted(reasons)]


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


@element_types(input=RawBlock, outputs={"batches": EncodedBatch, "rejected": Rejected})
class EncodeBlocks(beam.PTransform):
    """``RawBlock`` → ``EncodedBatch`` (main) and ``Rejected`` (tag ``rejected``) for a schema."""

    def __init__(self, schema: Schema, *, single_output: bool = False,
                 label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(schema, Schema):
            raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
        self._schema = schema
        self._single_output = _check_flag("single_output", single_output)

    def display_data(self) -> dict[str, Any]:
        """The declared schema's size (no data values)."""
        return display_items(step="encode raw blocks to declared cells (dead letters tagged "
                                  "'rejected')", schema=self._schema.name,
                             columns=len(self._schema.columns),
                             declared_cells=sum(c.domain.size for c in self._schema.columns))

    def expand(self, blocks):
        batches, rejected = _apply_with_dead_letters(
            blocks, _EncodeFn, (self._schema,), main="batches",
            single_output=self._single_output, label="Encode", main_type=EncodedBatch)
        return {"batches": batches, "rejected": rejected}


@element_types(outputs={"batches": EncodedBatch, "rejected": Rejected, "parts": PartCount})
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

    Every record is judged alone (docs/schema-format.md, "Reading rules"): adding or removing
    one record changes the used records by at most that record. ``max_record_lines`` is
    :class:`ReadRawBlocks`'.
    """

    def __init__(self, pattern: str | Sequence[str], schema: Schema, *,
                 block_rows: int = DEFAULT_BLOCK_ROWS, single_output: bool = False,
                 split_bytes: int = DEFAULT_SPLIT_BYTES, number_rejected: bool = True,
                 max_record_lines: int = 1, label: str | None = None) -> None:
        super().__init__(label)
        self._read = ReadRawBlocks(pattern, block_rows=block_rows, single_output=single_output,
                                   split_bytes=split_bytes, max_record_lines=max_record_lines)
        self._schema = schema
        self._single_output = single_output
        self._split = split_bytes
        self._number = _check_flag("number_rejected", number_rejected)

    @property
    def paths(self) -> list[str]:
        """The input files."""
        return self._read.paths

    def display_data(self) -> dict[str, Any]:
        """Files, schema and split size (no data values)."""
        return display_items(step="read and encode records (dead letters tagged 'rejected')",
                             files=len(self._read.paths), schema=self._schema.name,
                             columns=len(self._schema.columns), split_bytes=self._split)

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
@element_types(input=pa.Table, output=str)
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
        from beamsynth.pipelines.single_file import WriteSingleFile

        return tables | "SingleFile" >> WriteSingleFile(
            self._path, fmt=self._fmt, column_names=self._names, avro_schema=self._avro,
            arrow_schema=self._arrow)


def _rejected_sort_key(r: Rejected) -> bytes:
    """Bytes ordering dead letters by (source file, file part, row, line): the source as ASCII
    JSON (no JSON string is a prefix of another), numbers zero-padded, ``-`` for unknown. A
    corrupt Avro block (no row) sorts by the rows read before it, so a file read in parts
    orders its dead letters as a sequential read does."""
    def num(v: int | None) -> bytes:
        return b"-" if v is None else b"%020d" % v
    row = r.row if r.row is not None or r.after is None else r.after
    return b" ".join((json.dumps(r.source).encode("ascii"), b"%010d" % r.part, num(row), num(r.line)))


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
        fixed = shift_rejected(Rejected(r["source"], r["row"], r["reason"], r["raw"], r["line"],
                                        block=r.get("block")), row_off, line_off)
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
