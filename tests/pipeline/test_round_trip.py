"""Round trip of every output format × every column type (issue 19, item 2).

Random cell codes → ``codes_to_table`` → ``WriteTables`` (one small pipeline per format) → read
back with the *same* schema (``iter_raw_blocks`` + ``encode_block``): zero dead letters and the
same cells, hence the same values. Nulls are written as the first declared null token in text
formats and as real nulls in typed ones; nullable integers stay integers.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.io.encode import encode_block
from beamsynth.pipelines.io.read import iter_raw_blocks
from beamsynth.pipelines.io.write import WriteTables
from beamsynth.schemas.schema import load_schema
from beamsynth.schemas.tables import arrow_schema_for
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.synthesis import codes_to_table

SPEC = {
    "name": "round trip",
    "columns": [
        {"name": "cat", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["a", "b,c", 'q"uote', "Ünï"],
                    "other": "OTHER"},
         "on_out_of_domain": "other"},
        {"name": "cat_null", "type": "categorical", "nullable": True, "null_values": ["N", ""],
         "domain": {"kind": "categorical", "values": ["x", "y", "0", "12"]}},
        {"name": "int", "type": "integer", "domain": {"kind": "integer", "low": -5, "high": 60}},
        {"name": "int_null", "type": "integer", "nullable": True, "null_values": ["N"],
         "domain": {"kind": "integer", "low": 0, "high": 100000, "bins": 7}},
        {"name": "float", "type": "float",
         "domain": {"kind": "float", "low": -1.5, "high": 2.5, "bins": 9}},
        {"name": "float_null", "type": "float", "nullable": True, "null_values": ["NA"],
         "domain": {"kind": "float", "low": 0, "high": 1, "edges": [0, 0.1, 0.5, 1]}},
        {"name": "day", "type": "datetime",
         "domain": {"kind": "datetime", "start": "2020-01-01", "end": "2020-02-29"}},
        {"name": "second_null", "type": "datetime", "nullable": True, "null_values": ["?"],
         "domain": {"kind": "datetime", "start": "2021-03-04T05:00:00",
                    "end": "2021-03-04T05:00:40", "granularity": "second"}},
        {"name": "month", "type": "datetime",
         "domain": {"kind": "datetime", "start": "2019-01", "end": "2020-12",
                    "granularity": "month"}},
        {"name": "str", "type": "string",
         "domain": {"kind": "string", "alphabet": "ab, ", "min_length": 1, "max_length": 3}},
        {"name": "text_null", "type": "text", "nullable": True, "null_values": ["N"],
         "domain": {"kind": "string", "alphabet": "xyz", "min_length": 1, "max_length": 3}},
    ],
}
FORMATS = ("csv", "csv.gz", "jsonl", "avro", "parquet")
ROWS = 400


def _codes(schema, rows: int) -> np.ndarray:
    rng = np.random.default_rng(19)
    cols = [rng.integers(0, c.cells, rows) for c in schema.columns]
    codes = np.stack(cols, axis=1)
    codes[:len(schema.columns)] = np.array([c.cells - 1 for c in schema.columns])  # nulls/other
    return codes


def _typed(column, value):
    """A raw value read from a file as the written Python value (null tokens → None)."""
    if value is None or value in column.null_values and column.nullable:
        return None
    if column.type == "integer":
        assert not isinstance(value, float), value  # never 501.0
        return int(value)
    if column.type == "float":
        return float(value)
    return value


def _read_back(schema, path: str):
    """(codes, dead letters, rows of typed raw values) of a file read with ``schema``."""
    batches, rejected, rows = [], [], []
    for item in iter_raw_blocks(path):
        if hasattr(item, "columns"):
            batch, bad = encode_block(schema, item)
            batches.append(batch.codes)
            rejected.extend(bad)
            cols = [[_typed(c, v) for v in item.columns[c.name]] for c in schema.columns]
            rows.extend(zip(*cols))
        else:
            rejected.append(item)
    return np.concatenate(batches), rejected, rows


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    schema = load_schema(SPEC)
    codes = _codes(schema, ROWS)
    tables = [codes_to_table(schema, codes[:250], RandomSource(seed=1).child("a")),
              codes_to_table(schema, codes[250:], RandomSource(seed=1).child("b"))]
    out = tmp_path_factory.mktemp("round_trip")
    paths = {fmt: str(out / f"synthetic.{fmt}") for fmt in FORMATS}
    with TestPipeline() as p:
        pcoll = p | beam.Create(tables, reshuffle=False)
        for fmt, path in paths.items():
            pcoll | f"Write {fmt}" >> WriteTables(
                path, column_names=schema.names, avro_schema=schema.avro_schema(),
                arrow_schema=arrow_schema_for(schema))
    return schema, codes, pa.concat_tables(tables), paths


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_back_unchanged(written, fmt):
    schema, codes, table, paths = written
    back, rejected, rows = _read_back(schema, paths[fmt])
    assert [r.reason for r in rejected] == []
    assert back.shape == codes.shape
    # part order may differ from our concatenation; compare as multisets of rows
    order = np.lexsort(codes.T[::-1])
    back_order = np.lexsort(back.T[::-1])
    np.testing.assert_array_equal(back[back_order], codes[order])
    # values too (in-bin integers/floats, datetimes, labels, nulls), exactly as written
    assert sorted(rows, key=repr) == sorted(map(tuple, table.to_pylist()), key=repr) or sorted(
        rows, key=repr) == sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


def test_text_formats_write_declared_null_tokens_and_integers(written):
    schema, _, _, paths = written
    lines = gzip.open(paths["csv.gz"], "rt").read().splitlines()
    assert lines[0].split(",")[:4] == ["cat", "cat_null", "int", "int_null"]
    body = "\n".join(lines[1:])
    assert ".0," not in body.replace("0.0,", "")  # no 501.0 for integers
    # the rows whose every nullable column is null and whose categorical is the catch-all
    nulls = [line for line in lines if line.startswith("OTHER,N,60,N,")]
    assert len(nulls) == len(schema.columns)
    assert all(",NA," in line and ",?," in line and line.endswith(",N") for line in nulls)
    recs = [json.loads(line) for line in Path(paths["jsonl"]).read_text().splitlines()]
    assert sum(r["cat_null"] is None and r["int_null"] is None and r["text_null"] is None
               for r in recs) >= len(schema.columns)
    assert all(isinstance(r["int_null"], (int, type(None))) for r in recs)


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("matplotlib", "sklearn")),
                    reason="reports need matplotlib and scikit-learn (pip install '.[report]')")
@pytest.mark.parametrize("fmt", ["csv", pytest.param("parquet", marks=pytest.mark.slow)])
def test_report_with_the_same_schema_uses_every_synthetic_row(written, tmp_path, fmt):
    """The issue's symptom: report dropped 6,055 of 6,112 synthetic rows (nulls written as "")."""
    _, _, _, paths = written
    spec = tmp_path / "schema.json"
    spec.write_text(json.dumps(SPEC), encoding="utf-8")
    out = tmp_path / "report.html"
    assert main(["report", "--real", paths["csv"], "--synthetic", paths[fmt],
                 "--schema", str(spec), "--output", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert f"Real rows compared: {ROWS} (0 outside" in text
    assert f"synthetic rows: {ROWS} (0 dropped)" in text
