"""The line reader under the CSV and JSONL readers: :class:`_LineSource` (decoded lines of a byte
range of a file, universal newlines, undecodable bytes kept as lone surrogates), and the
alignment of a file part to line starts (:func:`_part_bounds`).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from apache_beam.io.filesystems import FileSystems

from beamsynth.pipelines.io.records import FilePart, RawBlock

__all__: list[str] = []


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


def _part_bounds(path: str, part: FilePart, floor: int) -> tuple[int, int | None]:
    """Byte range ``[begin, end)`` of the records part ``part`` owns (``end=None``: EOF)."""
    with _open_binary(path) as fh:
        begin = 0 if part.index == 0 else _next_line_start(fh, part.start, floor)
        end = None if part.stop is None else _next_line_start(fh, part.stop, floor)
    return begin, end
