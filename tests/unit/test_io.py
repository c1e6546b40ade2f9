"""Readers: every input row ends up used or rejected with a reason."""

import json

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beamsynth.pipelines.io.encode import encode_block
from beamsynth.pipelines.io.read import iter_raw_blocks
from beamsynth.pipelines.io.records import Rejected, detect_format
from beamsynth.schemas.schema import load_schema

SCHEMA = {"columns": [
    {"name": "a", "type": "categorical", "domain": {"kind": "categorical", "values": ["x", "y"]}},
    {"name": "n", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 9}},
]}


def _run(path, schema=None, block_rows=2):
    schema = schema or load_schema(SCHEMA)
    used, rejected = 0, []
    for item in iter_raw_blocks(str(path), block_rows=block_rows):
        if isinstance(item, Rejected):
            rejected.append(item)
        else:
            batch, bad = encode_block(schema, item)
            used += len(batch)
            rejected.extend(bad)
    return used, rejected


def test_csv_malformed_and_out_of_domain(tmp_path):
    p = tmp_path / "in.csv"
    p.write_text('a,n\nx,1\ny,2,extra\nz,3\n"x",\ny,abc\nx,9\n\nx,"5"\n', encoding="utf-8")
    used, rej = _run(p)
    assert used == 3
    reasons = sorted((r.row, r.reason) for r in rej)
    assert reasons == [
        (2, "row has 3 fields but the header has 2"),
        (3, "column 'a': value 'z' is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)"),
        (4, "column 'n': null in a non-nullable column"),
        (5, "column 'n': value 'abc' is not a valid integer"),
    ]
    assert all(r.source == str(p) and r.line is not None for r in rej)


def test_csv_invalid_utf8_is_rejected_not_crashing(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_bytes(b"a,n\nx,1\n\xff\xfe,2\n")
    used, rej = _run(p)
    assert used == 1 and len(rej) == 1 and "invalid UTF-8" in rej[0].reason and rej[0].line == 3
    json.loads(rej[0].to_json())


def test_missing_declared_column_rejects_rows_with_header_reason(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text("a,m\nx,1\ny,2\n", encoding="utf-8")
    used, rej = _run(p)
    assert used == 0 and len(rej) == 2 and "header" in rej[0].reason


def test_jsonl(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text('{"a": "x", "n": 1}\nnot json\n[1,2]\n{"a": "y", "n": 2}\n{"a": "y"}\n', encoding="utf-8")
    used, rej = _run(p)
    assert used == 2 and len(rej) == 3
    assert {r.row for r in rej} == {2, 3, 5}


def test_avro_and_parquet(tmp_path):
    schema = {"type": "record", "name": "r", "fields": [{"name": "a", "type": "string"},
                                                       {"name": "n", "type": "long"}]}
    p = tmp_path / "in.avro"
    with open(p, "wb") as fh:
        fastavro.writer(fh, fastavro.parse_schema(schema), [{"a": "x", "n": 1}, {"a": "q", "n": 2}])
    used, rej = _run(p)
    assert used == 1 and len(rej) == 1
    q = tmp_path / "in.parquet"
    pq.write_table(pa.table({"a": ["x", "y", None], "n": [1, 20, 3]}), q)
    used, rej = _run(q)
    assert used == 1 and len(rej) == 2


def test_empty_and_corrupt_files(tmp_path):
    e = tmp_path / "empty.csv"
    e.write_text("", encoding="utf-8")
    assert _run(e) == (0, [])
    c = tmp_path / "c.avro"
    c.write_bytes(b"not avro at all")
    used, rej = _run(c)
    assert used == 0 and len(rej) == 1 and "Avro" in rej[0].reason


def test_detect_format():
    assert detect_format("x.csv.gz") == "csv" and detect_format("x.parquet") == "parquet"
    with pytest.raises(ValueError, match="cannot tell the format"):
        detect_format("x.xlsx")


def test_csv_and_jsonl_with_byte_order_mark(tmp_path):
    p = tmp_path / "bom.csv"
    p.write_bytes("\ufeffa,n\nx,1\ny,2\n".encode())
    assert _run(p) == (2, [])
    j = tmp_path / "bom.jsonl"
    j.write_bytes('\ufeff{"a": "x", "n": 1}\n'.encode())
    assert _run(j) == (1, [])
