"""CSV reader: one record per physical line by default (``max_record_lines=1``: an unbalanced
quote rejects its own line only); the header is the first non-blank line (docs/schema-format.md,
"Reading rules").
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from typing import Any

from beamsynth.pipelines.io.lines import (
    _BOM,
    _INVALID_UTF8,
    _LINE,
    _LINE_ENDS,
    _ODD_BREAKS,
    _SLOW_CHUNK,
    _SURROGATE,
    _block,
    _clean,
    _LineSource,
    _open_binary,
    _part_bounds,
)
from beamsynth.pipelines.io.records import FilePart, RawBlock, Rejected, _PartState

__all__: list[str] = []


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
    changes at most ``L`` used records (``L = 1``: only itself).
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
