"""Avro container reader: blocks between sync markers, read from a seekable stream; a corrupt
block is one dead letter and reading goes on after the next sync marker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from apache_beam.io.filesystems import FileSystems

from beamsynth.pipelines.io.records import FilePart, RawBlock, Rejected, _PartState

__all__ = [
    "AvroHeader",
    "iter_avro_blocks",
    "read_avro_header",
]


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


def _block_records(header: AvroHeader, count: int, payload: bytes) -> Iterator[dict[str, Any]]:
    """A lazy reader of one block's records (decompressed by its codec)."""
    from io import BytesIO

    import fastavro

    return iter(fastavro.reader(BytesIO(header.raw + _zigzag(count) + _zigzag(len(payload)) + payload
                                        + header.sync)))


def _decode_avro_block(header: AvroHeader, count: int, payload: bytes,
                       max_records: int | None = None) -> list[dict[str, Any]] | Iterator[dict[str, Any]]:
    """The records of one block, checked against its count: a list, or for a block of more than
    ``max_records`` records (a writer's large sync interval) an iterator that decodes the block
    again, after a first decoding pass that only counts: memory is then the block's bytes and
    the records being used, not every record of the block as a dict, and a corrupt block is
    still found before any of its records is used."""
    if max_records is None or count <= max_records:
        records = list(_block_records(header, count, payload))
        held = len(records)
    else:
        records, held = None, sum(1 for _ in _block_records(header, count, payload))
    if held != count:
        raise ValueError(f"the block declares {count} records but holds {held}")
    return records if records is not None else _block_records(header, count, payload)


@dataclass
class _AvroBlock:
    """One data block of an Avro file: byte range, its records or the reason it is unreadable."""

    start: int
    stop: int
    records: list[dict[str, Any]] | Iterator[dict[str, Any]] | None
    error: str = ""


def iter_avro_blocks(fh: Any, header: AvroHeader, start: int | None = None,
                     stop: int | None = None, *, max_records: int | None = None) -> Iterator[_AvroBlock]:
    """Data blocks of an Avro file that begin in bytes ``[start, stop)`` (default: all); the
    records of a block of more than ``max_records`` come as an iterator (:func:`_decode_avro_block`).

    ``start`` inside the data is moved just past the next sync marker, so disjoint byte ranges
    read every block exactly once. A block whose framing (count, size, sync marker) or content
    does not decode is reported with its byte range and the reader resumes after the next sync
    marker: one corrupt block never hides the blocks after it. A block size larger than the
    bytes left in the file is corrupt at once (memory: one block, never the rest of the file).
    """
    fh.seek(0, 2)
    size_of_file = fh.tell()
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
            if size > size_of_file - src.offset:  # never buffer the rest of the file for a bad size
                raise ValueError("the file ends inside a block")
            payload = src.read(size)
            if len(payload) != size:
                raise ValueError("the file ends inside a block")
            if src.read(_SYNC) != header.sync:
                raise ValueError("the block does not end with the file's sync marker")
            records = _decode_avro_block(header, count, payload, max_records)
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
        for blk in iter_avro_blocks(fh, header, start, stop, max_records=block_rows):
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
