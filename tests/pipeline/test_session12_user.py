"""Session 12 (H40): an open-data portal engineer feeds every public output of ``bs`` into Beam's
own sinks, Beam YAML, other input shapes and streams. Each test is a problem that user hit,
failing on the code before its fix."""

from __future__ import annotations

import glob

import apache_beam as beam
import pyarrow.parquet as pq
import pytest

import beamsynth as bs

ROW = {"age": 39, "sex": "Male", "race": "White", "income": "<=50K"}
SMALL = bs.load_schema("adult").select(["age", "sex", "race", "income"])


def _lines(prefix: str) -> list[str]:
    return [line for path in sorted(glob.glob(prefix + "*")) for line in open(path, encoding="utf-8")]


def test_dead_letters_straight_into_batched_sinks_are_written(tmp_path):
    """`private.dead_letters | beam.io.WriteToCsv(...)` (or WriteToJson, WriteToParquet,
    to_dataframe) wrote an empty file, silently: the dead letters are emitted in _EncodeFn's
    finish_bundle, and Beam 2.77's DoOperation.finish flushes its receivers' batch buffers before
    finish_bundle runs, so a batched consumer fused to it never got them (rule 8: a bad row lost).
    WriteToText, which takes one element at a time, had them."""
    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    out = str(tmp_path)
    with beam.Pipeline() as p:
        private = p | beam.Create([ROW, {"age": "abc"}, dict(ROW, sex="X")]) | job.private(SMALL)
        bad = private.dead_letters
        bad | "Csv" >> beam.io.WriteToCsv(f"{out}/bad_csv", num_shards=1)
        bad | "Json" >> beam.io.WriteToJson(f"{out}/bad_json", num_shards=1)
        bad | "Parquet" >> beam.io.WriteToParquet(f"{out}/bad_parquet", num_shards=1)
        private | bs.Count(epsilon=1.0) | "CountCsv" >> beam.io.WriteToCsv(f"{out}/count")
        p | bs.WriteManifest(job=job, path=f"{out}/manifest.json")
    assert len(_lines(f"{out}/bad_csv")) == 1 + 2      # header + both rejected rows
    assert len(_lines(f"{out}/bad_json")) == 2
    assert sum(pq.read_table(f).num_rows for f in glob.glob(f"{out}/bad_parquet*")) == 2
    assert _lines(f"{out}/count")[0].strip() == "noisy_count"


def test_dask_refusal_of_schemaless_write_to_parquet_names_the_schema_form(tmp_path):
    """`bs.Count(...) | beam.io.WriteToParquet(path)` (no schema: Beam converts schema'd rows
    with a batched DoFn) was refused on --runner dask with 'Write with
    WriteToText/WriteToParquet', i.e. with the very sink refused. It now names the form that
    runs there: dicts and a pyarrow schema, bs.arrow_schema(pcoll)."""
    pytest.importorskip("distributed")
    job = bs.PrivacyJob(epsilon=1.0)
    with pytest.raises(NotImplementedError) as err:
        with beam.Pipeline(options=bs.pipeline_options(["--runner", "dask"])) as p:
            count = p | beam.Create([ROW]) | job.private(SMALL) | bs.Count(epsilon=1.0)
            count | "Parquet" >> beam.io.WriteToParquet(str(tmp_path / "count"))
    message = str(err.value)
    assert message.startswith("the dask runner cannot run step 'Parquet/")
    assert "WriteToParquet(path, bs.arrow_schema(pcoll))" in message
    assert "r._asdict()" in message
    assert not list(tmp_path.glob("count*"))
