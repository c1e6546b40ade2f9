"""Third newcomer trial of the public API (NLTCS, SDNist ACS, SmartNoise PUMS): what it found.

A Beam DataFrame read with ``apache_beam.dataframe.io.read_csv`` turns a code column with a
blank into floats (``1`` -> ``1.0``), and only in the chunk that holds the blank: before, every
such value was "outside the declared categorical domain" (PUMS_null: all 1,948 rows were dead
letters), so whether a row was used depended on its neighbours (rule 6). A whole float now
matches its integer text when its own text is not declared, as privacy ids already did.
"""

from __future__ import annotations

import json

import apache_beam as beam

import beamsynth as bs

SCHEMA = bs.load_schema({"name": "codes", "columns": [
    {"name": "sex", "type": "categorical", "nullable": True,
     "domain": {"kind": "categorical", "values": ["0", "1"]}},
    {"name": "race", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["1", "2", "3"]}},
    {"name": "score", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["0.5", "1.0"]}},
    {"name": "age", "type": "integer", "nullable": True,
     "domain": {"kind": "integer", "low": 0, "high": 100}}]})


def _run(tmp_path, make, keys=None):
    """(manifest's counts for the one source, dead-letter reasons) of ``make(p)`` made private."""
    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    reasons = tmp_path / "reasons"
    with beam.Pipeline() as p:
        private = make(p) | job.private(SCHEMA, keys=keys, source="src")
        (private.dead_letters | beam.Map(lambda r: r.reason)
            | beam.io.WriteToText(str(reasons), shard_name_template=""))
        private | bs.Count(epsilon=1.0) | "Drop" >> beam.Map(lambda r: None)
        p | bs.WriteManifest(job=job, path=str(tmp_path / "manifest.json"))
    counts = json.loads((tmp_path / "manifest.json").read_text())["operational"]["sources"]["src"]
    text = reasons.read_text(encoding="utf-8") if reasons.exists() else ""
    return counts, sorted(text.splitlines())


def test_dataframe_codes_with_a_blank_are_used(tmp_path):
    from apache_beam.dataframe.convert import to_pcollection
    from apache_beam.dataframe.io import read_csv

    path = tmp_path / "people.csv"
    path.write_text("sex,race,score,age\n1,2,1.0,40\n,3,0.5,\n0,1,1.0,71\n1,4,0.5,5\n",
                    encoding="utf-8")

    def make(p):
        df = p | read_csv(str(path))          # sex and age become float64 (a blank in each)
        return to_pcollection(df, include_indexes=False)

    counts, reasons = _run(tmp_path, make)
    assert counts == {"read": 4, "rejected": 1, "dropped_by_bound": 0, "used": 3}
    assert reasons == ["column 'race': value 4 is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)"]


def test_whole_floats_match_integer_codes_and_keys(tmp_path):
    rows = [{"sex": 1.0, "race": 2.0, "score": 1.0, "age": 40.0},    # used: "1", "2", "1.0"
            {"sex": 0, "race": "3", "score": "0.5", "age": 7},        # used
            {"sex": 1.5, "race": 1, "score": 0.5, "age": 1},          # 1.5 is no code
            {"sex": 1, "race": 2.0, "score": 1.5, "age": 1},          # 1.5 not declared
            {"sex": True, "race": 1, "score": 0.5, "age": 1}]         # a bool is no code
    keys = {"who": bs.HierarchyKey(columns=["sex", "race"],
                                   tree={"0": ["1", "2", "3"], "1": ["1", "2", "3"]})}
    counts, reasons = _run(tmp_path, lambda p: p | beam.Create(rows), keys=keys)
    assert counts == {"read": 5, "rejected": 3, "dropped_by_bound": 0, "used": 2}
    assert reasons == ["column 'score': value 1.5 is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)",
                       "column 'sex': value 1.5 is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)",
                       "column 'sex': value True is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)"]


def _dask_job(tmp_path, build):
    """Run ``build(p)`` on ``--runner dask``; what it raises (no cluster starts if it refuses)."""
    import pytest

    pytest.importorskip("distributed")
    with pytest.raises(NotImplementedError) as err:
        with beam.Pipeline(options=bs.pipeline_options(["--runner", "dask"])) as p:
            build(p)
    assert not list(tmp_path.glob("out*")), "nothing may be written"
    return str(err.value)


def test_dask_reads_beam_read_instead_of_reading_nothing(tmp_path, dask_address):
    """ReadFromText/ReadFromParquet on the DaskRunner gave 0 elements (a PUMS_dup job: read 4 =
    the 4 rows of a beam.Create, the 1,948 Parquet rows silently missing); 43f3e33 refused them,
    now they read the DirectRunner's elements (tests/pipeline/test_dask_read.py)."""
    src = tmp_path / "in.txt"
    src.write_text("a\nb\n", encoding="utf-8")
    args = ["--runner", "dask", f"--dask_client_address={dask_address}"]
    with beam.Pipeline(options=bs.pipeline_options(args)) as p:
        _ = (p | "Lines" >> beam.io.ReadFromText(str(src))
               | beam.io.WriteToText(str(tmp_path / "out"), shard_name_template=""))
    assert sorted((tmp_path / "out").read_text(encoding="utf-8").splitlines()) == ["a", "b"]


def test_dask_refuses_write_to_csv_before_running(tmp_path):
    """WriteToCsv's batched DoFn failed mid-run with a bare NotImplementedError."""
    message = _dask_job(tmp_path, lambda p: (
        p | beam.Create([beam.Row(a=1)]) | "Csv" >> beam.io.WriteToCsv(str(tmp_path / "out"))))
    assert message.startswith("the dask runner cannot run step 'Csv/")
    assert "batched DoFn" in message and "WriteToText/WriteToParquet" in message
