"""The public API on the inputs ETL jobs read from files: pyarrow Tables (``ReadFromParquetBatched``),
schema'd rows typed as generated NamedTuples (``ReadFromParquet(as_rows=True)``) and dicts
(``ReadFromAvro``), every mechanism written with Beam's standard sinks.

``ReadFromParquet(as_rows=True)`` types its output as a generated NamedTuple class, which Beam
does not see as a ``beam.Row``: ``job.private`` refused it when the pipeline was built
(``TypeCheckError: Input type hint violation at MakePrivate(toy): expected Union[...], got <class
'apache_beam.typehints.schemas.BeamSchema_...'>``) until ``MakePrivate.type_check_inputs``
accepted NamedTuple row types.
"""

from __future__ import annotations

import json

import apache_beam as beam
import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beamsynth as bs
from tests.pipeline.test_api import (
    NAME,
    SCHEMA,
    _apply_all,
    _check_correlated_synthesizers,
    _check_structure,
    _opts,
    _records,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The toy records as Parquet (declared, hyphenated names), Parquet with identifier names
    (what ``as_rows=True`` needs) and Avro (identifier names, as Avro requires)."""
    folder = tmp_path_factory.mktemp("inputs")
    records = _records()
    records[3] = dict(records[3], sex="X")                       # one dead letter per source
    table = pa.Table.from_pylist(records)
    pq.write_table(table, folder / "toy.parquet", row_group_size=100)
    ids = table.rename_columns([c.replace("-", "_") for c in table.column_names])
    pq.write_table(ids, folder / "toy_ids.parquet")
    avro = {"type": "record", "name": "toy", "fields": [
        {"name": "sex", "type": "string"}, {"name": "age_band", "type": "long"},
        {"name": "city", "type": ["null", "string"]}, {"name": "name", "type": "string"},
        {"name": "line", "type": "long"}]}
    with open(folder / "toy.avro", "wb") as fh:
        fastavro.writer(fh, avro, ids.to_pylist())
    return {k: str(folder / f) for k, f in
            [("parquet", "toy.parquet"), ("rows", "toy_ids.parquet"), ("avro", "toy.avro")]}


def test_every_mechanism_on_arrow_tables_and_rows_and_dicts_from_files(files, tmp_path):
    job = bs.PrivacyJob(epsilon=10.0, seed=3)
    with beam.Pipeline(options=_opts()) as p:
        tables = p | "Batched" >> beam.io.ReadFromParquetBatched(files["parquet"])
        # pyarrow.Table per row group
        arrow = tables | "FromArrow" >> job.private(SCHEMA, keys={"name": NAME},
                                                    position_field="line", source="arrow")
        out = _apply_all(arrow)
        _check_structure(out)
        rows = p | "ReadRows" >> beam.io.ReadFromParquet(files["rows"], as_rows=True)
        dicts = p | "ReadAvro" >> beam.io.ReadFromAvro(files["avro"])
        for name, pcoll in [("rows", rows), ("avro", dicts)]:
            private = pcoll | f"From[{name}]" >> job.private(SCHEMA, source=name)
            private.dead_letters | f"Bad[{name}]" >> beam.Map(print)
            counts = private | f"Count[{name}]" >> bs.Count(epsilon=0.5)
            counts | f"Csv[{name}]" >> beam.io.WriteToCsv(str(tmp_path / f"count_{name}"))
        bad = arrow.dead_letters | "BadArrow" >> beam.Map(lambda r: (r.position, r.reason))
        assert_that(bad, equal_to([(4, "column 'sex': value 'X' is outside the declared "
                                       "categorical domain (to keep such rows, declare a "
                                       "catch-all cell, other: OTHER in the domain, and "
                                       "on_out_of_domain: other; docs/schema-format.md)")]),
                    label="ArrowDeadLetter")
        out["independent"] | "AsDicts" >> beam.Map(lambda r: r._asdict()) | beam.io.WriteToParquet(
            str(tmp_path / "synthetic"), bs.arrow_schema(SCHEMA), shard_name_template="",
            file_name_suffix=".parquet")
        out["histogram"] | "Json" >> beam.Map(lambda r: json.dumps(r._asdict())) | \
            "Text" >> beam.io.WriteToText(str(tmp_path / "city"), shard_name_template="")
        out["prefix"]["tree"] | "TreeCsv" >> beam.io.WriteToCsv(str(tmp_path / "tree"))
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "manifest.json"))
    assert pq.read_table(tmp_path / "synthetic.parquet").num_rows == 20
    for line in (tmp_path / "city").read_text().splitlines():
        assert set(json.loads(line)) == {"city", "noisy_count"}
    assert list(tmp_path.glob("tree*")) and list(tmp_path.glob("count_rows*"))
    sources = json.loads((tmp_path / "manifest.json").read_text())["operational"]["sources"]
    expected = {"read": 240, "rejected": 1, "dropped_by_bound": 0, "used": 239}
    assert sources == {"arrow": expected, "rows": expected, "avro": expected}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["arrow", "dicts"])
def test_correlated_synthesizers_on_arrow_tables_and_dicts(files, kind):
    job = bs.PrivacyJob(epsilon=100.0, delta=1e-4, seed=3)
    with beam.Pipeline(options=_opts()) as p:
        source = (p | beam.io.ReadFromParquetBatched(files["parquet"]) if kind == "arrow"
                  else p | beam.Create(_records()))
        private = source | job.private(SCHEMA, source=kind)
        private.dead_letters | "Bad" >> beam.Map(print)
        _check_correlated_synthesizers(private)
