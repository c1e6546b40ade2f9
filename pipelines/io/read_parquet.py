"""Parquet reader: row group by row group; a corrupt row group is one dead letter.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from beamsynth.pipelines.io.records import FilePart, RawBlock, Rejected

__all__ = [
    "iter_parquet_row_groups",
    "parquet_group_offsets",
]


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
