"""Parquet reader: row group by row group, large groups in batches; a corrupt row group is one
dead letter.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from beamsynth.pipelines.io.records import DEFAULT_BLOCK_ROWS, FilePart, RawBlock, Rejected

__all__ = [
    "iter_parquet_row_groups",
    "parquet_group_offsets",
]


# -- Parquet: row groups; a corrupt row group is one dead letter ------------------------------------
_READ_BUFFER = 1 << 20  # bytes of a column chunk fetched per read (never a whole chunk)


def _group_starts(meta: Any) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([meta.row_group(g).num_rows
                                           for g in range(meta.num_row_groups)])]).astype(np.int64)


def _check_rows(got: int, meta: Any, g: int) -> None:
    if got != meta.row_group(g).num_rows:
        raise ValueError(f"row group holds {got} rows, its metadata says {meta.row_group(g).num_rows}")


def _slices(batches: Iterable[Any], rows: int) -> Iterator[Any]:
    """``pyarrow.Table`` slices of exactly ``rows`` rows (the last one shorter) cut from record
    batches, whatever sizes the batches have: blocks do not depend on how pyarrow batches."""
    held: list[Any] = []
    n = 0
    for batch in batches:
        held.append(batch)
        n += batch.num_rows
        if n >= rows:
            table = pa.Table.from_batches(held)
            off = 0
            while n - off >= rows:
                yield table.slice(off, rows)
                off += rows
            rest = table.slice(off)
            held, n = rest.to_batches(), rest.num_rows
    if n:
        yield pa.Table.from_batches(held)


def _group_blocks(pf: Any, g: int, block_rows: int) -> Iterator[Any] | Exception:
    """Row group ``g`` as tables of ``block_rows`` rows, or the exception that makes it corrupt.

    A group of at most ``block_rows`` rows is decoded in one read. A larger one (pandas and
    pyarrow write up to 1,048,576 rows per group, so a big file may be a few huge groups, or one)
    is first decoded batch by batch and thrown away, to find out whether every page of it
    decodes, then decoded again batch by batch for use: memory is one batch, not the group
    (decoded strings take many times their dictionary-encoded size, so the footer's byte sizes
    say little about it), and a corrupt page still rejects its whole group and nothing else
    (the used records never depend on where in a group the damage is). Blocks are the same
    either way."""
    meta = pf.metadata
    try:
        if meta.row_group(g).num_rows <= block_rows:
            table = pf.read_row_group(g)
            _check_rows(table.num_rows, meta, g)
            return (table.slice(off, block_rows) for off in range(0, table.num_rows, block_rows))
        got = 0
        for batch in pf.iter_batches(batch_size=block_rows, row_groups=[g], use_threads=False):
            got += batch.num_rows
        _check_rows(got, meta, g)
    except Exception as exc:  # pyarrow raises several types for corrupt pages
        return exc
    return _slices(pf.iter_batches(batch_size=block_rows, row_groups=[g], use_threads=False), block_rows)


def iter_parquet_row_groups(pf: Any, groups: Iterable[int] | None = None, *,
                            block_rows: int = DEFAULT_BLOCK_ROWS) -> Iterator[tuple[int, int, Any]]:
    """``(group, first row (0-based), blocks or the exception)`` per row group of a
    ``pyarrow.parquet.ParquetFile`` (``groups``: which ones, default all); ``blocks`` iterates
    ``pyarrow.Table`` slices of ``block_rows`` rows. Every page of a group is decoded before any
    of its rows is used, so a corrupt page rejects its group and nothing else; a group of more
    than ``block_rows`` rows is checked and then read in batches, so memory stays one batch
    however large the group (:func:`_group_blocks`)."""
    meta = pf.metadata
    starts = _group_starts(meta)
    for g in range(meta.num_row_groups) if groups is None else groups:
        yield g, int(starts[g]), _group_blocks(pf, g, block_rows)


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
    """Rows of a Parquet file row group by row group through a seekable stream (memory: one
    block of ``block_rows`` rows, whatever the row groups' sizes), or of the row groups ``part``
    owns; row numbers are file-wide (from the footer)."""
    import pyarrow.parquet as pq

    with FileSystems.open(path, compression_type="uncompressed") as fh:
        try:
            pf = pq.ParquetFile(fh, page_checksum_verification=True, buffer_size=_READ_BUFFER)
        except (pa.ArrowInvalid, OSError) as exc:
            if part is None or part.index == 0:  # reported once, by the first part
                yield Rejected(path, None, f"unreadable Parquet file: {exc}")
            return
        groups = _part_groups(pf.metadata, part)
        for g, first, blocks in iter_parquet_row_groups(pf, groups, block_rows=block_rows):
            n = pf.metadata.row_group(g).num_rows
            if isinstance(blocks, Exception):
                where = f"row group {g}, rows {first + 1}-{first + n}"
                yield Rejected(path, first + 1 if n else None,
                               f"corrupt Parquet {where}: {type(blocks).__name__}: {blocks}",
                               block=where)
                continue
            off = first
            for block in blocks:
                cols = {name: pd.Series(block.column(i).to_pylist(), dtype=object)
                        for i, name in enumerate(block.schema.names)}
                yield RawBlock(path, cols, np.arange(off + 1, off + block.num_rows + 1, dtype=np.int64))
                off += block.num_rows
