"""Neighbour pairs through the full CLI, for every input format (issue 15, breach 1).

For a base file D of 1,000 records and D + r (one crafted record r: an unbalanced quote, a field
with a line break, bytes that are not UTF-8, a NUL byte, the header line repeated, a BOM, a key
present or absent, an extra key, a corrupt Avro block, a corrupt Parquet row group), ``beamsynth
synthesize ... --seed`` runs on both and the private manifest counts must say

    |rows_used(D + r) − rows_used(D)| ≤ 1   and   rows_read = rows_used + rows_rejected.

Each format keeps a broken variant — the reader before the fix, from
tests/audit/broken_readers.py — that the same check catches. The default suite runs a CSV and a
JSONL pair through the CLI and every pair (and every broken variant) through the Beam-free
reader; the slow tests run every pair and every broken variant through the CLI.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import beamsynth.pipelines.io.read as io_module
from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.io.encode import encode_block
from beamsynth.pipelines.io.read import iter_raw_blocks
from beamsynth.pipelines.io.read_avro import iter_avro_blocks, read_avro_header
from beamsynth.pipelines.io.records import Rejected
from beamsynth.schemas.schema import load_schema
from tests.audit.broken_readers import BROKEN_READERS

pytestmark = pytest.mark.audit

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"
N = 1000
COLUMNS = [
    {"name": "age", "type": "integer", "domain": {"kind": "integer", "low": 17, "high": 90, "bins": 8}},
    {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["Male", "Female"]}},
    {"name": "income", "type": "categorical", "domain": {"kind": "categorical", "values": ["<=50K", ">50K"]}},
    {"name": "note", "type": "categorical", "nullable": True,
     "domain": {"kind": "categorical", "values": ["p", "q"]}},
]
AVRO_SCHEMA = {"type": "record", "name": "r", "fields": [
    {"name": "age", "type": "long"}, {"name": "sex", "type": "string"},
    {"name": "income", "type": "string"}, {"name": "note", "type": ["null", "string"]}]}


def _base() -> list[dict[str, Any]]:
    rows = []
    with open(ADULT, encoding="utf-8", newline="") as fh:
        for i, r in enumerate(csv.DictReader(fh)):
            if i == N:
                break
            rows.append({"age": int(r["age"]), "sex": r["sex"], "income": r["income"],
                         "note": "pq"[i % 2] if i % 3 else None})
    return rows


# -- files -----------------------------------------------------------------------------------------
def _csv(rows: list[dict[str, Any]], extra: dict[int, bytes] | None = None) -> bytes:
    """CSV bytes of ``rows`` with raw lines ``extra[i]`` inserted before row ``i``."""
    out = [b"age,sex,income,note\n"]
    for i, r in enumerate(rows + [None]):
        if extra and i in extra:
            out.append(extra[i])
        if r is not None:
            out.append(f"{r['age']},{r['sex']},{r['income']},{r['note'] or ''}\n".encode())
    return b"".join(out)


def _jsonl(rows: list[dict[str, Any]], extra: dict[int, dict[str, Any]] | None = None,
           drop: tuple[str, ...] = ()) -> bytes:
    out = []
    for i, r in enumerate(rows + [None]):
        if extra and i in extra:
            out.append(json.dumps(extra[i]) + "\n")
        if r is not None:
            out.append(json.dumps({k: v for k, v in r.items() if k not in drop}) + "\n")
    return "".join(out).encode()


def _avro(rows: list[dict[str, Any]], alone: dict[str, Any] | None = None) -> bytes:
    """Two blocks of ``rows`` with, between them, a block holding only ``alone`` whose deflate
    stream is corrupt (the damaged block of the one record r)."""
    buf = io.BytesIO()
    w = fastavro.write.Writer(buf, fastavro.parse_schema(AVRO_SCHEMA), codec="deflate")
    for part in (rows[: N // 2], [alone] if alone else [], rows[N // 2:]):
        for rec in part:
            w.write(rec)
        w.flush()
    data = bytearray(buf.getvalue())
    if alone:
        blocks = list(iter_avro_blocks(io.BytesIO(bytes(data)), read_avro_header(io.BytesIO(bytes(data)))))
        mid = blocks[1]
        assert len(mid.records) == 1
        data[mid.stop - 24:mid.stop - 18] = b"\xff" * 6  # inside its deflate stream
    return bytes(data)


def _parquet(rows: list[dict[str, Any]], alone: dict[str, Any] | None = None) -> bytes:
    """Row groups of ``rows`` with, between them, a row group holding only ``alone`` whose page
    header is corrupt."""
    schema = pa.schema([("age", pa.int64()), ("sex", pa.string()), ("income", pa.string()),
                        ("note", pa.string())])
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, schema, write_page_checksum=True) as w:
        for part in (rows[: N // 2], [alone] if alone else [], rows[N // 2:]):
            if part:
                w.write_table(pa.Table.from_pylist(part, schema=schema))
    data = bytearray(buf.getvalue())
    if alone:
        col = pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(1).column(0)
        start = col.dictionary_page_offset or col.data_page_offset
        data[start:start + 8] = b"\xff" * 8  # its first page header no longer parses
    return bytes(data)


# -- the pairs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pair:
    """A neighbour pair: files D and D + r of one format, with the schema's extra_columns."""

    name: str
    fmt: str
    d: bytes
    d_r: bytes
    extra_columns: str = "ignore"


def _pairs() -> list[Pair]:
    rows = _base()
    rec = b"33,Male,<=50K,p\n"
    csv_d = _csv(rows)
    out = [
        Pair("csv unbalanced quote", "csv", csv_d, _csv(rows, {10: b'"33,Male,<=50K,p\n'})),
        Pair("csv quoted line break", "csv", csv_d, _csv(rows, {10: b'33,"Male\nFemale",<=50K,p\n'})),
        Pair("csv invalid UTF-8", "csv", csv_d, _csv(rows, {10: b"33,Ma\xffle,<=50K,p\n"})),
        Pair("csv NUL byte in the first record", "csv", csv_d, _csv(rows, {0: b"33,Male\x00,<=50K,p\n"})),
        Pair("csv header line repeated", "csv", csv_d, _csv(rows, {10: b"age,sex,income,note\n"})),
        Pair("csv BOM and blank line in the data", "csv", csv_d, _csv(rows, {0: b"\n\xef\xbb\xbf" + rec})),
        Pair("jsonl nullable key absent from D", "jsonl", _jsonl(rows, drop=("note",)),
             _jsonl(rows, {10: {"age": 33, "sex": "Male", "income": "<=50K", "note": "p"}}, drop=("note",))),
        Pair("jsonl extra key, extra_columns: reject", "jsonl", _jsonl(rows),
             _jsonl(rows, {10: {"age": 33, "sex": "Male", "income": "<=50K", "zz": 1}}), "reject"),
        Pair("jsonl required key missing", "jsonl", _jsonl(rows),
             _jsonl(rows, {10: {"sex": "Male", "income": "<=50K"}})),
        Pair("avro corrupt block of r", "avro", _avro(rows),
             _avro(rows, {"age": 33, "sex": "Male", "income": "<=50K", "note": "p"})),
        Pair("parquet corrupt row group of r", "parquet", _parquet(rows),
             _parquet(rows, {"age": 33, "sex": "Male", "income": "<=50K", "note": "p"})),
    ]
    return out


PAIRS = {p.name: p for p in _pairs()} if ADULT.exists() else {}
FAST = ["csv unbalanced quote", "jsonl nullable key absent from D"]  # the CLI runs of the default suite
BROKEN_PAIR = {"csv": "csv unbalanced quote", "jsonl": "jsonl extra key, extra_columns: reject",
               "avro": "avro corrupt block of r", "parquet": "parquet corrupt row group of r"}


def _need_data() -> None:
    if not PAIRS:
        pytest.skip(f"example data not found: {ADULT}")


def _schema_file(folder: Path, extra_columns: str) -> Path:
    path = folder / f"schema_{extra_columns}.yaml"
    path.write_text(yaml.safe_dump({"name": "neighbours", "extra_columns": extra_columns,
                                    "columns": COLUMNS}), encoding="utf-8")
    return path


# -- the check -------------------------------------------------------------------------------------
def cli_counts(data: bytes, fmt: str, extra_columns: str, folder: Path) -> tuple[int, int, int] | None:
    """(rows read, used, rejected) from the private manifest of ``beamsynth synthesize``, or None
    when the run releases nothing."""
    folder.mkdir(parents=True)
    src = folder / f"in.{fmt}"
    src.write_bytes(data)
    out = folder / "out.csv"
    code = main(["synthesize", str(src), "--schema", str(_schema_file(folder, extra_columns)),
                 "--epsilon", "1", "--method", "independent", "--rows", "20", "--seed", "7",
                 "--output", str(out), "--quiet"])
    if code != 0:
        return None
    op = json.loads(Path(f"{out}.manifest.json").read_text(encoding="utf-8"))["operational"]
    return op["rows_read"], op["rows_used"], op["rows_rejected"]


def reader_counts(data: bytes, fmt: str, extra_columns: str, folder: Path) -> tuple[int, int, int]:
    """The same counts from the Beam-free reader and encoder (what ReadRecords runs)."""
    folder.mkdir(parents=True)
    src = folder / f"in.{fmt}"
    src.write_bytes(data)
    schema = load_schema({"name": "neighbours", "extra_columns": extra_columns, "columns": COLUMNS})
    read = used = rejected = 0
    for item in iter_raw_blocks(str(src)):
        if isinstance(item, Rejected):
            read, rejected = read + 1, rejected + 1
            continue
        batch, bad = encode_block(schema, item)
        read, used, rejected = read + len(item), used + len(batch), rejected + len(bad)
    return read, used, rejected


def stable(before: tuple[int, int, int] | None, after: tuple[int, int, int] | None) -> bool:
    """The audit check: both runs release, counts add up, rows used differ by at most 1."""
    if before is None or after is None:
        return False
    return all(r == u + j for r, u, j in (before, after)) and abs(after[1] - before[1]) <= 1


def _counts(pair: Pair, folder: Path, counter: Any) -> tuple[Any, Any]:
    return (counter(pair.d, pair.fmt, pair.extra_columns, folder / "d"),
            counter(pair.d_r, pair.fmt, pair.extra_columns, folder / "d_r"))


# -- tests -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FAST)
def test_neighbour_pair_through_the_cli(name, tmp_path):
    _need_data()
    before, after = _counts(PAIRS[name], tmp_path, cli_counts)
    assert stable(before, after), (before, after)


@pytest.mark.parametrize("name", sorted(PAIRS) or ["none"])
def test_every_neighbour_pair_through_the_reader_and_its_broken_variant(name, tmp_path, monkeypatch):
    _need_data()
    pair = PAIRS[name]
    before, after = _counts(pair, tmp_path / "fixed", reader_counts)
    assert stable(before, after), (before, after)
    if BROKEN_PAIR[pair.fmt] == name:
        attr, broken, _ = BROKEN_READERS[pair.fmt]
        monkeypatch.setattr(io_module, attr, broken)
        before, after = _counts(pair, tmp_path / "broken", reader_counts)
        assert not stable(before, after), (before, after)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PAIRS) or ["none"])
def test_every_neighbour_pair_through_the_cli(name, tmp_path):
    _need_data()
    before, after = _counts(PAIRS[name], tmp_path, cli_counts)
    assert stable(before, after), (before, after)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(BROKEN_PAIR))
def test_broken_variants_are_caught_through_the_cli(fmt, tmp_path, monkeypatch):
    _need_data()
    attr, broken, _ = BROKEN_READERS[fmt]
    monkeypatch.setattr(io_module, attr, broken)
    before, after = _counts(PAIRS[BROKEN_PAIR[fmt]], tmp_path, cli_counts)
    assert not stable(before, after), (before, after)
