"""examples/etl_job.py on a data set it was not written for, as a user would run it.

The two end-to-end runs are slow-marked (46 s direct, 129 s two processes at load ~8-16 with
``--rows 50``); the default suite checks the schema-driven choices and the cleaning step.

The schema is drafted from the bundled SDNist ACS data dictionary with ``beamsynth schema draft``
(the console script, never the data); the events are 300 rows of the bundled 2,000-row ACS
sample as JSON lines the way an ETL source gives them: numbers as JSON numbers, ``N`` codes as
strings, plus messy events (nulls, missing keys, extra and nested keys, numbers as strings or
floats, a list, a bool, an out-of-domain number) and five bad lines (truncated JSON, a JSON
array, an empty line, NaN in an undeclared field only, bytes that are not UTF-8). Nothing may
crash; every event is used or a dead letter; the histogram column and the marginals come from
the schema alone (no Adult column names).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import beamsynth as bs
from tests.pipeline.test_etl_job import ROOT, etl_job

ACS = ROOT / "examples" / "data" / "acs_nist_sdnist"
ROWS = 300
# row index -> (change, kept?): each judged alone by job.private
MESSY = {
    1: (lambda r: r.update(MSP=None), True),                       # null, nullable column
    2: (lambda r: r.update(AGEP=None), False),                     # null, required column
    3: (lambda r: r.pop("NOC"), True),                             # missing nullable key
    4: (lambda r: r.pop("SEX"), False),                            # missing required key
    5: (lambda r: r.update(ingest={"id": 5, "tags": ["a"]}, SRC="x"), True),  # extra keys
    6: (lambda r: r.update(AGEP=str(r["AGEP"])), True),            # number as a string
    7: (lambda r: r.update(AGEP=float(r["AGEP"])), True),          # 40.0 for an integer
    8: (lambda r: r.update(SEX=[1, 2]), False),                    # a list value
    9: (lambda r: r.update(SEX=True), False),                      # a bool value
    10: (lambda r: r.update(PUMA=12345), False),                   # out of the declared domain
}
BAD_LINES = ['{"PUMA": "01-01301", "AGEP": ', "[1, 2, 3]", "", '{"age": NaN}']


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@pytest.fixture(scope="module")
def acs(tmp_path_factory) -> tuple[Path, Path]:
    """(schema drafted from the dictionary, messy JSON-lines events)."""
    folder = tmp_path_factory.mktemp("acs")
    schema = folder / "acs.yaml"
    script = Path(sys.executable).with_name("beamsynth")
    subprocess.run([str(script), "schema", "draft", str(ACS / "data_dictionary.json"),
                    "--output", str(schema)], check=True, capture_output=True)
    with (ACS / "national2019_2k.csv").open(encoding="utf-8") as fh:
        rows = [{k: _number(v) for k, v in r.items()} for _, r in zip(range(ROWS), csv.DictReader(fh))]
    lines = []
    for i, row in enumerate(rows):
        if i in MESSY:
            MESSY[i][0](row)
        lines.append(json.dumps(row))
    for j, bad in enumerate(BAD_LINES):
        lines.insert(20 + 10 * j, bad)
    events = folder / "events.jsonl"
    events.write_bytes(("\n".join(lines) + "\n").encode("utf-8") + b'{"AGEP": "\xff"}\n')
    return schema, events


def _run(acs: tuple[Path, Path], out: Path, *beam_args: str) -> dict:
    schema, events = acs
    assert etl_job.main([str(events), "--schema", str(schema), "--epsilon", "2", "--output",
                         str(out), "--seed", "3", "--rows", "50", *beam_args]) == 0
    return {f.name: (pq.read_table(f).to_pylist() if f.suffix == ".parquet" else f.read_text())
            for f in sorted(out.iterdir())}


def _chosen(schema: Path) -> dict:
    return etl_job.plan(etl_job.build_parser().parse_args(
        ["x", "--schema", str(schema), "--epsilon", "2", "--output", "o"]))


def test_choices_and_cleaning_come_from_the_unseen_schema(acs):
    schema = bs.load_schema(str(acs[0]))
    chosen = _chosen(acs[0])
    assert chosen["histogram"] == "PUMA"  # the categorical column with the largest declared domain
    assert chosen["pairs"] == [("AGEP", "SEX"), ("MSP", "HISP"), ("RAC1P", "NOC")]
    assert all(schema.column(a).cells * schema.column(b).cells <= etl_job.MAX_PAIR_CELLS
               for a, b in chosen["pairs"])
    one = bs.load_schema({"name": "one", "columns": [schema.column("AGEP").to_spec()]})
    assert etl_job.default_marginals(one, "AGEP") == [("AGEP",)]  # no pair: one-way tables
    columns = etl_job.field_names(schema)
    kept = list(etl_job.parse_line((3, b'{"SEX": 1, "INDP": "x", "extra": [1]}'), columns=columns))
    assert kept == [{"SEX": 1, etl_job.POSITION_FIELD: 3}]
    for raw, reason in [(b"", "invalid JSON"), (b"[1]", "not a JSON object (list)"),
                        (b'{"age": NaN}', "no declared values"), (b"\xff", "not UTF-8")]:
        (bad,) = etl_job.parse_line((1, raw), columns=columns)
        assert bad.value["reason"].startswith(reason) and bad.value["position"] == 1


@pytest.mark.slow
def test_etl_job_on_a_schema_it_has_never_seen(acs, tmp_path, capsys):
    schema = bs.load_schema(str(acs[0]))
    chosen = _chosen(acs[0])
    files = _run(acs, tmp_path / "out")
    printed = capsys.readouterr().out
    assert "histogram column 'PUMA'" in printed and "spent ε = 2 of 2.0" in printed
    names = ["count.parquet", "histogram_PUMA.parquet", "manifest.json", "rejected.jsonl",
             "synthetic.parquet"] + [f"marginal_{a}__{b}.parquet" for a, b in chosen["pairs"]]
    assert sorted(files) == sorted(names)
    assert set(files["synthetic.parquet"][0]) == {f.name for f in bs.arrow_schema(schema)}
    dead = [json.loads(line) for line in files["rejected.jsonl"].splitlines()]
    rejected = sum(not kept for _, kept in MESSY.values()) + len(BAD_LINES) + 1
    assert len(dead) == rejected, [d["reason"] for d in dead]
    manifest = json.loads(files["manifest.json"])
    assert manifest["operational"]["sources"]["events"] == {
        "read": ROWS + len(BAD_LINES) + 1, "rejected": rejected, "dropped_by_bound": 0,
        "used": ROWS + len(BAD_LINES) + 1 - rejected}


@pytest.mark.slow
def test_etl_job_on_the_unseen_schema_is_the_same_on_two_processes(acs, tmp_path):
    one = _run(acs, tmp_path / "one")
    two = _run(acs, tmp_path / "two", "--runner", "direct-multi", "--direct_num_workers=2")
    for name in one:
        if name.endswith(".parquet"):
            key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
            assert sorted(one[name], key=key) == sorted(two[name], key=key), name
    assert sorted(one["rejected.jsonl"].splitlines()) == sorted(two["rejected.jsonl"].splitlines())
    m1, m2 = (json.loads(x["manifest.json"]) for x in (one, two))
    assert m1["operational"] == m2["operational"] and m1["release"]["budget"] == m2["release"]["budget"]


def _private_pair(options=None):
    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    p = beam.Pipeline(options=options)
    rows = p | beam.Create([{"sex": "Male", "race": "White"}])
    return job, rows | job.private(bs.load_schema("adult").select(["sex", "race"]))


def test_a_step_label_used_twice_is_refused_before_it_spends():
    """Written as a user: IndependentSynthesis and Synthesize(method="independent") share the
    default label; Beam refused the second one only after it had spent (a phantom spend)."""
    job, private = _private_pair()
    _ = private | bs.IndependentSynthesis(epsilon=0.3, rows=5)
    with pytest.raises(RuntimeError, match=r"'Synthesize\[independent\]' is already in the pipeline "
                       r"\(nothing was spent\); give this one its own label: private \| "
                       r'"MySynthesize" >> bs.Synthesize'):
        _ = private | bs.Synthesize(method="independent", epsilon=0.3, rows=5)
    assert job.accountant.spent_epsilon == pytest.approx(0.3)
    _ = private | "ByName" >> bs.Synthesize(method="independent", epsilon=0.3, rows=5)
    assert job.accountant.spent_epsilon == pytest.approx(0.6)


def test_auto_unique_labels_give_each_spend_its_own_step():
    job, private = _private_pair(PipelineOptions(["--auto_unique_labels"]))
    _ = private | bs.Count(epsilon=0.1)
    _ = private | bs.Count(epsilon=0.1)
    steps = [s.step for s in job.accountant.spends]
    assert len(steps) == 2 and len(set(steps)) == 2 and steps[0] == "Count"  # two seeds, not one


def test_parquet_rows_with_field_name_columns_are_read_for_their_declared_columns(tmp_path):
    """Written as a user on census KDD: ``ReadFromParquet(as_rows=True)`` needs identifier column
    names, and a hand-made ``replace(" ", "_")`` leaves ``veteran's`` invalid; ``bs.field_name``
    gives the name Beam takes and ``job.private`` reads for the declared column."""
    import pyarrow as pa
    from apache_beam.testing.util import assert_that, equal_to

    schema = bs.load_schema({"name": "kdd_like", "columns": [
        {"name": "fill inc questionnaire for veteran's admin", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["No", "Yes", "Not in universe"]}},
        {"name": "age-years", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 120}}]})
    table = pa.table({"fill inc questionnaire for veteran's admin": ["No", "Yes", "No", "Maybe"],
                      "age-years": [30, 41, 52, 63]})
    names = [bs.field_name(c) for c in table.column_names]
    assert names == ["fill_inc_questionnaire_for_veteran_s_admin", "age_years"]
    assert names == [f.name for f in bs.arrow_schema(schema)]
    assert all(n.isidentifier() for n in names)
    pq.write_table(table.rename_columns(names), tmp_path / "kdd.parquet")
    job = bs.PrivacyJob(epsilon=1.0, seed=2)
    with beam.Pipeline() as p:
        rows = p | beam.io.ReadFromParquet(str(tmp_path / "kdd.parquet"), as_rows=True)
        private = rows | job.private(schema, source="kdd")
        reasons = private.dead_letters | beam.Map(lambda r: r.reason)
        assert_that(reasons, equal_to(
            ["column \"fill inc questionnaire for veteran's admin\": value 'Maybe' is outside "
             "the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)"]))
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "manifest.json"))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["operational"]["sources"]["kdd"]["used"] == 3


def test_one_person_whose_id_arrives_as_int_string_and_float_is_one_unit(tmp_path):
    """Seen converting PUMS_dup to JSON lines: a producer writes the same id as 7, "7" or 7.0
    (pandas turns an int column with a null into floats). 7.0 became the id "7.0", a second unit
    for the same person, so the contribution bound held per spelling, not per person."""
    unit = bs.PrivacyUnit(id_column="pid", max_contributions=1)
    job = bs.PrivacyJob(epsilon=1.0, seed=1, privacy_unit=unit)
    events = [{"pid": pid, "sex": "Male", "race": "White"} for pid in (7, "7", 7.0, 8.0, 8.5)]
    with beam.Pipeline() as p:
        private = p | beam.Create(events) | job.private(
            bs.load_schema("adult").select(["sex", "race"]), source="events")
        _ = private.dead_letters | beam.Map(print)
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "manifest.json"))
    counts = json.loads((tmp_path / "manifest.json").read_text())["operational"]["sources"]
    assert counts["events"] == {"read": 5, "rejected": 0, "dropped_by_bound": 2, "used": 3}
    # the CLI's JSON-lines reader encodes through Schema.encode_columns: the same ids
    schema = bs.load_schema({"name": "ids", "privacy_id": "pid", "columns": [
        {"name": "sex", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["Female", "Male"]}}]})
    batch, bad = schema.encode_columns({"sex": ["Male"] * 5, "pid": [e["pid"] for e in events]}, 5)
    assert bad == [] and list(batch.pids) == ["7", "7", "7", "8", "8.5"]


def test_cli_prefixes_count_an_id_written_as_a_float_as_one_unit(tmp_path):
    from beamsynth.pipelines.cli.main import main

    events = tmp_path / "q.jsonl"
    events.write_text('{"pid": 7, "q": "ab"}\n{"pid": "7", "q": "ab"}\n{"pid": 7.0, "q": "ab"}\n')
    out = tmp_path / "keys.csv"
    assert main(["prefixes", str(events), "--kind", "text", "--column", "q", "--privacy-id", "pid",
                 "--max-contributions", "1", "--epsilon", "1", "--seed", "1", "--quiet",
                 "--output", str(out)]) == 0
    manifest = json.loads(Path(f"{out}.manifest.json").read_text())
    assert (manifest["operational"]["rows_dropped_by_bound"], manifest["operational"]["rows_used"]) == (2, 1)


def test_marginals_missing_table_and_sbhg_without_delta_say_what_to_write():
    """Written as a user: marginals=("AGEP", "SEX") gave two one-way tables and
    tables["AGEP,SEX"] a bare KeyError; SBHG on a job without δ named the CLI's --delta."""
    job, private = _private_pair()
    tables = private | bs.Marginals(marginals=("sex", "race"), epsilon=0.1)
    with pytest.raises(KeyError, match=r"no marginal table 'sex,race'; the tables are \['race', "
                       r"'sex'\] .*\[\('a', 'b'\)\] for one two-way table"):
        _ = tables["sex,race"]
    assert sorted(tables) == ["race", "sex"]
    with pytest.raises(ValueError, match=r"^the sbhg method \(bs.SBHG, bs.Synthesize\(method='sbhg'\)\) needs delta > 0 .* pass e.g. delta=1e-06 on a "
                       r"bs.PrivacyJob\(epsilon=..., delta=...\) that has δ$"):
        _ = private | bs.SBHG(epsilon=0.5, rows=10)


def test_unstamped_or_outside_elements_under_declared_windows_say_their_time():
    """Written as a user (query log, 3-hour windows): an element stamped outside the windows and
    one never stamped (Beam's minimum timestamp, e.g. straight from beam.Create) were both
    'timestamp outside the declared windows [...]', which named neither the time nor the
    forgotten TimestampedValue."""
    from apache_beam.testing.util import assert_that, equal_to

    schema = bs.load_schema({"name": "toy", "columns": [
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical",
                                                          "values": ["F", "M"]}}]})
    hours = bs.DeclaredWindows(start=0, end=6 * 3600, size=3 * 3600)
    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    with beam.Pipeline() as p:
        stamped = (p | "Stamped" >> beam.Create([{"sex": "F", "line": 1}, {"sex": "M", "line": 2}])
                   | "Stamp" >> beam.Map(lambda d: beam.window.TimestampedValue(
                       d, 60 if d["line"] == 1 else 7 * 3600)))
        plain = p | "Plain" >> beam.Create([{"sex": "F", "line": 3}])
        private = ((stamped, plain) | beam.Flatten()
                   | job.private(schema, windows=hours, position_field="line"))
        assert_that(private.dead_letters | beam.Map(lambda d: (d.position, d.reason)), equal_to([
            (2, "timestamp 1970-01-01T07:00:00Z is outside the declared windows "
                "[1970-01-01T00:00:00Z, 1970-01-01T06:00:00Z)"),
            (3, "timestamp -9223372036855 (none assigned? stamp the elements upstream) is outside "
                "the declared windows [1970-01-01T00:00:00Z, 1970-01-01T06:00:00Z)")]))
        private | bs.Count(epsilon=1.0)


def test_a_declared_privacy_id_column_says_to_remove_it():
    """Written as a user (query log, prefix tree only): declaring user_id in the schema, since an
    empty schema is refused, gave '... a privacy id must not be released' with no way out."""
    schema = bs.load_schema({"name": "queries", "columns": [
        {"name": "user_id", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 9}}]})
    job = bs.PrivacyJob(epsilon=1.0, privacy_unit=bs.PrivacyUnit(id_column="user_id",
                                                                 max_contributions=3))
    with pytest.raises(ValueError, match=r"remove it from the schema's columns \(job.private "
                                         r"reads it from each element\)"):
        job.private(schema)


def test_key_dead_letters_echo_the_bad_coordinate_or_say_missing():
    """Written as a user (GeoNames places, ACS state > PUMA): a coordinate 'abc' and a point at
    lat 95 gave 'coordinate is missing or not a number' / 'point outside the declared box ...'
    (which column? which value? what to do?), a missing PUMA gave "PUMA value 'None' is not
    declared under 25"."""
    from apache_beam.testing.util import assert_that, equal_to

    schema = bs.load_schema({"name": "places", "columns": [
        {"name": "kind", "type": "categorical", "nullable": True,
         "domain": {"kind": "categorical", "values": ["home"]}}]})
    keys = {"where": bs.SpatialKey(columns=["lat", "lon"], box=[(-90.0, 90.0), (-180.0, 180.0)],
                                   depth=4),
            "puma": bs.HierarchyKey(columns=["STATE", "PUMA"], tree={"25": ["25-00503"]})}
    ok = {"lat": "1", "lon": "2", "STATE": "25", "PUMA": "25-00503"}
    elements = [dict(ok, lat="abc", line=1), dict(ok, lat="95.0", lon="10", line=2),
                {k: v for k, v in ok.items() if k != "PUMA"} | {"line": 3}]
    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    with beam.Pipeline() as p:
        private = p | beam.Create(elements) | job.private(schema, keys=keys, position_field="line")
        assert_that(private.dead_letters | beam.Map(lambda d: (d.position, d.reason)), equal_to([
            (1, "key 'where': coordinate lat 'abc' is missing or not a number"),
            (2, "key 'where': point (95, 10) outside the declared box lat in [-90, 90], lon in "
                "[-180, 180] (check the column order, or on_outside='clip')"),
            (3, "key 'puma': PUMA is missing under 25")]))
        private | bs.Count(epsilon=1.0)
