"""Broken variants of the readers: the reading rules before issue 15, kept so that the stability
audits (test_stability.py, test_neighbour_formats.py) can show they catch them.

Each function has the signature of the reader it replaces in ``beamsynth.pipelines.io.read``
(``_iter_csv``, ``_iter_jsonl``, ``_iter_avro``, ``_iter_parquet``), so a test can monkeypatch it
in and run the real CLI. :data:`BROKEN_READERS` names what each one breaks.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from apache_beam.io.filesystems import FileSystems

from beamsynth.pipelines.io.records import RawBlock, Rejected

__all__ = ["BROKEN_READERS", "avro_stops_at_corrupt_block", "csv_quote_swallows_lines",
           "jsonl_union_of_keys", "parquet_stops_at_corrupt_page"]


def _read_text(path: str) -> str:
    with FileSystems.open(path, compression_type="uncompressed") as fh:
        return fh.read().decode("utf-8-sig", "surrogateescape")


def csv_quote_swallows_lines(path: str, block_rows: int, part: Any = None, state: Any = None,
                             max_lines: int = 1) -> Iterator[RawBlock | Rejected]:
    """Old CSV rule: ``csv.reader`` over the whole file, so a quoted field continues over any
    number of lines and one unbalanced quote swallows the rest of the file."""
    reader = csv.reader(io.StringIO(_read_text(path), newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except (StopIteration, csv.Error):
        return
    rows, nums, row_no = [], [], 0
    while True:
        try:
            rec = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            row_no += 1
            yield Rejected(path, row_no, f"malformed CSV line: {exc}")
            continue
        if not rec:
            continue
        row_no += 1
        if len(rec) != len(header):
            yield Rejected(path, row_no, "ragged row")
            continue
        rows.append(rec)
        nums.append(row_no)
    if rows:
        table = np.array(rows, dtype=object).reshape(len(rows), len(header))
        yield RawBlock(path, {h: pd.Series(table[:, j], dtype=object) for j, h in enumerate(header)},
                       np.asarray(nums, np.int64))


def jsonl_union_of_keys(path: str, block_rows: int, part: Any = None,
                        state: Any = None) -> Iterator[RawBlock | Rejected]:
    """Old JSONL rule: a block's columns are the union of its records' keys, checked as a file
    header (no per-record key sets), so one record's keys decide for the whole block."""
    rows, nums = [], []
    for row_no, line in enumerate((x for x in _read_text(path).splitlines() if x.strip()), 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield Rejected(path, row_no, f"invalid JSON: {exc}")
            continue
        if not isinstance(obj, dict):
            yield Rejected(path, row_no, "not an object")
            continue
        rows.append(obj)
        nums.append(row_no)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    if rows:
        yield RawBlock(path, {k: pd.Series([r.get(k) for r in rows], dtype=object) for k in keys},
                       np.asarray(nums, np.int64))


def avro_stops_at_corrupt_block(path: str, block_rows: int, *_: Any) -> Iterator[RawBlock | Rejected]:
    """Old Avro rule: ``fastavro.reader`` to the first corrupt block, which ends the file."""
    import fastavro

    with FileSystems.open(path, compression_type="uncompressed") as fh:
        reader = fastavro.reader(fh)
        names = [f["name"] for f in reader.writer_schema["fields"]]
        rows = []
        try:
            for rec in reader:
                rows.append(rec)
        except Exception as exc:  # the rest of the file is lost
            yield Rejected(path, len(rows) + 1, f"corrupt Avro data: {exc}")
    if rows:
        yield RawBlock(path, {k: pd.Series([r.get(k) for r in rows], dtype=object) for k in names},
                       np.arange(1, len(rows) + 1, dtype=np.int64))


def parquet_stops_at_corrupt_page(path: str, block_rows: int, *_: Any) -> Iterator[RawBlock | Rejected]:
    """Old Parquet rule: batches over the whole file; a corrupt page ends the read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with FileSystems.open(path, compression_type="uncompressed") as fh:
        pf = pq.ParquetFile(pa.BufferReader(fh.read()))
    row_no = 0
    try:
        for batch in pf.iter_batches(batch_size=block_rows):
            n = batch.num_rows
            yield RawBlock(path, {name: pd.Series(batch.column(i).to_pylist(), dtype=object)
                                  for i, name in enumerate(batch.schema.names)},
                           np.arange(row_no + 1, row_no + n + 1, dtype=np.int64))
            row_no += n
    except Exception as exc:  # the rest of the file is lost
        yield Rejected(path, None, f"cannot read parquet file: {exc}")


BROKEN_READERS = {
    "csv": ("_iter_csv", csv_quote_swallows_lines,
            "a quoted field continues on the next lines: one unbalanced quote swallows the rest"),
    "jsonl": ("_iter_jsonl", jsonl_union_of_keys,
              "the union of the keys seen is checked as a header: one record decides for all"),
    "avro": ("_iter_avro", avro_stops_at_corrupt_block,
             "a corrupt block ends the read: the blocks after it are lost"),
    "parquet": ("_iter_parquet", parquet_stops_at_corrupt_page,
                "a corrupt page ends the read: the row groups after it are lost"),
}
