"""The public API (``import beamsynth as bs``): every mechanism on dicts, beam.Rows and a Beam
DataFrame, written with Beam's standard sinks; construction-time errors with exact messages."""

from __future__ import annotations

import csv
import glob
import json
import random

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

import beamsynth as bs

SCHEMA = bs.load_schema({
    "name": "toy",
    "columns": [
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}},
        {"name": "age-band", "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 3}},
        {"name": "city", "type": "categorical", "nullable": True,
         "domain": {"kind": "categorical", "values": ["Oslo", "Rome", "Lima"]}},
    ],
})
NAME = bs.TextKey(column="name", alphabet="abc", max_length=3)


def _records(n: int = 240) -> list[dict]:
    rnd = random.Random(7)
    return [{"sex": rnd.choice("FM"), "age-band": rnd.randrange(4),
             "city": rnd.choice(["Oslo", "Rome", "Lima", None]), "name": rnd.choice(["ab", "abc", "c"]),
             "line": i + 1} for i in range(n)]


def _opts() -> PipelineOptions:
    return PipelineOptions(["--runner=beamsynth.runners.local.LocalDirectRunner"])


def _job(**kw) -> bs.PrivacyJob:
    return bs.PrivacyJob(epsilon=10.0, delta=1e-5, seed=3, **kw)


# -- construction-time errors -----------------------------------------------------------------------
def test_a_second_privacy_job_in_one_pipeline_is_refused_when_built():
    """Two jobs of ε = 1 each on one pipeline would release 2ε over the same records."""
    first, second = bs.PrivacyJob(epsilon=1.0), bs.PrivacyJob(epsilon=1.0, name="other job")
    p = beam.Pipeline(options=_opts())
    records = p | beam.Create(_records(5))
    private = records | "A" >> first.private(SCHEMA)
    _ = private | bs.Count(epsilon=1.0)
    _ = records | "B" >> first.private(SCHEMA)  # the same job on a second source: fine
    with pytest.raises(ValueError) as err:
        _ = records | "C" >> second.private(SCHEMA)
    assert str(err.value) == (
        "C: this pipeline already has a PrivacyJob ('beamsynth job', ε=1); a second job "
        "('other job', ε=1) would add its whole budget to the first one's over the same records. "
        "Use one bs.PrivacyJob per pipeline and call job.private on every source (its ε is the "
        "pipeline's total), or, only for jobs over disjoint people, declare disjoint=True on every "
        "job")
    other = beam.Pipeline(options=_opts())  # another pipeline may have its own job
    _ = other | beam.Create(_records(5)) | second.private(SCHEMA)
    tenants = [bs.PrivacyJob(epsilon=1.0, disjoint=True, name=f"t{i}") for i in range(3)]
    q = beam.Pipeline(options=_opts())
    for i, job in enumerate(tenants[:2]):  # declared disjoint: each tenant has its own budget
        _ = q | f"Create{i}" >> beam.Create(_records(5)) | f"P{i}" >> job.private(SCHEMA)
    with pytest.raises(ValueError, match="already has a PrivacyJob"):
        _ = q | "Create3" >> beam.Create(_records(5)) | "P3" >> first.private(SCHEMA)
    with pytest.raises(TypeError, match=r"disjoint must be True or False, got str \('yes'\)"):
        bs.PrivacyJob(epsilon=1.0, disjoint="yes")


def test_overspending_fails_when_the_pipeline_is_built_naming_step_and_amounts():
    job = bs.PrivacyJob(epsilon=1.0)
    p = beam.Pipeline(options=_opts())
    private = p | beam.Create(_records(5)) | job.private(SCHEMA)
    _ = private | bs.Count(epsilon=0.6)
    with pytest.raises(bs.BudgetExceededError) as err:
        _ = private | bs.Marginals(marginals=[("sex",)], epsilon=0.5)
    assert str(err.value) == ("step 'Marginals' asks for ε=0.5 but only (ε=0.4, δ=0) of the total "
                              "ε=1 remains (already spent: Count ε=0.6)")
    with pytest.raises(bs.BudgetExceededError) as err:
        _ = private | bs.PrivBayes(epsilon=0.5, rows=10)
    assert str(err.value) == ("step 'Synthesize[privbayes]' asks for ε=0.5 but only (ε=0.4, δ=0) "
                              "of the total ε=1 remains (already spent: Count ε=0.6)")
    assert [s.step for s in job.accountant.spends] == ["Count"]  # nothing half-spent


def test_miswired_element_types_fail_at_construction():
    job = bs.PrivacyJob(epsilon=1.0)
    p = beam.Pipeline(options=_opts())
    dicts = p | "Dicts" >> beam.Create([{"sex": "F"}])
    with pytest.raises(TypeError) as err:
        _ = dicts | bs.Count(epsilon=0.1)
    assert str(err.value) == (
        "Count applies to a private collection, got PCollection[Dict[<class 'str'>, <class 'str'>]]; "
        "make one with `private = records | job.private(schema)` and apply `private | "
        "bs.Count(...)`")
    ints = p | "Ints" >> beam.Create([1, 2])  # builds since H55 (warning; dead letters)
    assert isinstance(ints | job.private(SCHEMA), bs.PrivateCollection)


def test_windowed_input_manifest_freeze_and_validation_messages():
    job = bs.PrivacyJob(epsilon=1.0)
    p = beam.Pipeline(options=_opts())
    windowed = (p | beam.Create([{"sex": "F"}])
                | beam.WindowInto(beam.window.FixedWindows(60)))
    with pytest.raises(ValueError) as err:
        _ = windowed | job.private(SCHEMA)
    assert str(err.value).startswith("MakePrivate(toy): the input is windowed (FixedWindows); the "
                                     "beamsynth API releases over the global window only")
    private = p | "Plain" >> beam.Create([{"sex": "F"}]) | "P2" >> job.private(SCHEMA)
    _ = p | bs.WriteManifest(job=job, path="unused.json")
    with pytest.raises(ValueError) as err:
        _ = private | bs.Count(epsilon=0.1)
    assert str(err.value) == ("step 'Count' is applied after 'WriteManifest' took the job's "
                              "manifest; apply every mechanism before bs.WriteManifest")
    cases = [
        (lambda: bs.WriteManifest(job=job, path="/dev/null"), ValueError,
         "manifest path ('/dev/null') exists and is not a regular file"),
        (lambda: bs.Count(epsilon=0), ValueError, "epsilon (0) must be a finite number > 0"),
        (lambda: bs.Count(epsilon="1"), TypeError, "epsilon must be a number > 0, got str ('1')"),
        (lambda: bs.PrivacyUnit(max_contributions=2), ValueError,
         "max_contributions (2) needs an id_column; without one every record is its own privacy unit"),
        (lambda: bs.Synthesize(epsilon=1, method="privbayes", options={"rowz": 1}), ValueError,
         "unknown option 'rowz' for method 'privbayes' (did you mean rows=..., not in options?)"),
        (lambda: bs.Marginals(marginals=[], epsilon=1), ValueError,
         "marginals ([]) must be a non-empty list of column-name tuples, e.g. [('age', 'sex')]"),
        (lambda: bs.Histogram(column="sex", epsilon=1, tolerance=2), ValueError,
         "tolerance (2) must be None or in (0, 1)"),
    ]
    for make, exc, message in cases:
        with pytest.raises(exc) as err:
            make()
        assert str(err.value).startswith(message)


# -- every mechanism, three input kinds ---------------------------------------------------------------
def _apply_all(private, x: str = "") -> dict:
    return {
        "count": private | f"{x}Count" >> bs.Count(epsilon=1.0),
        "marginals": private | f"{x}Marginals" >> bs.Marginals(
            marginals=[("sex", "city"), ("age-band",)], epsilon=1.0),
        "histogram": private | f"{x}Histogram" >> bs.Histogram(column="city", epsilon=1.0,
                                                               tolerance=0.5),
        "independent": private | f"{x}Independent" >> bs.IndependentSynthesis(epsilon=1.0, rows=20),
        "prefix": private | f"{x}PrefixTree" >> bs.PrefixTree(key="name", epsilon=1.0,
                                                              method="direct"),
    }


def _check_structure(out: dict, x: str = "") -> None:
    assert_that(out["count"] | f"{x}CountN" >> beam.combiners.Count.Globally(), equal_to([1]),
                label=f"{x}OneCount")
    cells = out["marginals"]["sex,city"] | f"{x}Cells" >> beam.Map(lambda r: (r.sex, r.city))
    assert_that(cells, equal_to([(s, c) for s in "FM" for c in ["Oslo", "Rome", "Lima", None]]),
                label=f"{x}EveryCell")
    assert_that(out["independent"] | f"{x}SynthN" >> beam.combiners.Count.Globally(),
                equal_to([20]), label=f"{x}Rows")
    keys = out["prefix"]["keys"] | f"{x}Keys" >> beam.Map(lambda r: set(r.name) <= set("abc"))
    assert_that(keys | f"{x}AllKeysDeclared" >> beam.combiners.Count.PerElement(),
                lambda got: all(ok for ok, _ in got) or pytest.fail(f"undeclared keys {got}"),
                label=f"{x}KeysInAlphabet")

def _check_correlated_synthesizers(private) -> None:
    """PrivBayes, SBHG, plausible deniability and Synthesize emit rows with the schema's fields."""
    for name, t in [("pb", bs.PrivBayes(epsilon=1.0, rows=30)),
                    ("sbhg", bs.SBHG(epsilon=1.0, delta=1e-6, rows=30)),
                    ("pd", bs.PlausibleDeniability(epsilon=40.0, delta=1e-6, rows=10)),
                    ("synth", bs.Synthesize(method="independent", epsilon=0.5))]:
        synth = private | t
        assert_that(synth | f"Fields[{name}]" >> beam.Map(lambda r: tuple(r._asdict())),
                    lambda got: all(f == ("sex", "age_band", "city") for f in got)
                    or pytest.fail(str(got[:3])), label=f"Schema[{name}]")



def test_every_mechanism_on_dicts_written_with_standard_sinks(tmp_path):
    job = _job()
    records = _records()
    records[3] = dict(records[3], sex="X")
    with beam.Pipeline(options=_opts()) as p:
        private = (p | beam.Create(records)
                   | job.private(SCHEMA, keys={"name": NAME}, position_field="line"))
        private.dead_letters | "WriteBad" >> beam.io.WriteToText(str(tmp_path / "bad"),
                                                                 shard_name_template="")
        out = _apply_all(private)
        _check_structure(out)
        out["independent"] | "AsDicts" >> beam.Map(lambda r: r._asdict()) | beam.io.WriteToParquet(
            str(tmp_path / "synthetic"), bs.arrow_schema(SCHEMA),
            shard_name_template="", file_name_suffix=".parquet")
        out["marginals"]["age-band"] | "MDicts" >> beam.Map(lambda r: r._asdict()) | \
            "MParquet" >> beam.io.WriteToParquet(
                str(tmp_path / "age"), bs.arrow_schema(out["marginals"]["age-band"]),
                shard_name_template="", file_name_suffix=".parquet")
        out["marginals"]["sex,city"] | "Csv" >> beam.io.WriteToCsv(str(tmp_path / "sex_city"))
        out["histogram"] | "Json" >> beam.Map(lambda r: json.dumps(r._asdict())) | "Text" >> \
            beam.io.WriteToText(str(tmp_path / "city"), shard_name_template="")
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "out" / "manifest.json"))
    bad = (tmp_path / "bad").read_text().splitlines()
    assert len(bad) == 1 and "position=4" in bad[0] and "value 'X' is outside" in bad[0]
    table = pq.read_table(tmp_path / "synthetic.parquet")
    assert table.num_rows == 20 and table.column_names == ["sex", "age_band", "city"]
    assert table.schema.field("city").nullable and not table.schema.field("sex").nullable
    ages = pq.read_table(tmp_path / "age.parquet")
    assert ages.column("age_band").to_pylist() == [0, 1, 2, 3]
    assert ages.schema.field("noisy_count").type == pa.int64()
    (csv_file,) = glob.glob(str(tmp_path / "sex_city*"))
    rows = list(csv.DictReader(open(csv_file)))
    assert len(rows) == 8 and set(rows[0]) == {"sex", "city", "noisy_count"}
    for line in (tmp_path / "city").read_text().splitlines():
        assert set(json.loads(line)) == {"city", "noisy_count"}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    spends = manifest["release"]["budget"]["spends"]
    assert [s["step"] for s in spends] == [
        "Count", "Marginals", "Histogram", "Independent/independent.marginals", "PrefixTree"]
    assert manifest["release"]["randomness"] == "seeded: not for release"
    src = manifest["operational"]["sources"]["MakePrivate(toy)"]
    assert src == {"read": 240, "rejected": 1, "dropped_by_bound": 0, "used": 239}


def test_every_mechanism_on_rows_with_a_bounded_privacy_unit(tmp_path):
    job = _job(privacy_unit=bs.PrivacyUnit(id_column="user", max_contributions=2))
    records = [dict(r, user=f"u{i % 50}") for i, r in enumerate(_records())]
    with beam.Pipeline(options=_opts()) as p:
        rows = (p | beam.Create(records)
                | beam.Select(sex=lambda d: d["sex"], age_band=lambda d: d["age-band"],
                              city=lambda d: d["city"], name=lambda d: d["name"],
                              user=lambda d: d["user"]))
        private = rows | job.private(SCHEMA, keys={"name": NAME})
        assert_that(private.dead_letters, equal_to([]), label="NoDeadLetters")
        counts = private | bs.Count(epsilon=1.0)
        assert_that(counts | beam.Map(lambda r: tuple(r._asdict())), equal_to([("noisy_count",)]))
        margs = private | bs.Marginals(marginals=[("sex",)], epsilon=1.0)
        assert_that(margs["sex"] | beam.Map(lambda r: r.sex), equal_to(["F", "M"]), label="Sex")
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "m.json")) | beam.Map(
            lambda m: m["operational"]["sources"]["MakePrivate(toy)"]) | "Bound" >> beam.Map(
            lambda s: s == {"read": 240, "rejected": 0, "dropped_by_bound": 140, "used": 100}
            or pytest.fail(str(s)))


@pytest.mark.slow
def test_every_mechanism_on_rows_and_a_dataframe_with_the_correlated_synthesizers():
    from apache_beam.dataframe.convert import to_dataframe, to_pcollection

    job = bs.PrivacyJob(epsilon=100.0, delta=1e-4, seed=3)
    with beam.Pipeline(options=_opts()) as p:
        rows = p | beam.Create([beam.Row(sex=r["sex"], age_band=r["age-band"], city=r["city"] or "",
                                         name=r["name"]) for r in _records()])
        df = to_dataframe(rows)
        df = df[df.age_band >= 0]  # an ordinary DataFrame step
        rows_private = rows | "FromRows" >> job.private(SCHEMA, keys={"name": NAME})
        _check_structure(_apply_all(rows_private, "Rows"), "Rows")
        private = to_pcollection(df, include_indexes=False) | "FromDataFrame" >> job.private(
            bs.load_schema({**SCHEMA.to_spec(), "columns": [
                {**c.to_spec(), "null_values": [""]} for c in SCHEMA.columns]}),
            keys={"name": NAME})
        _check_structure(_apply_all(private))
        _check_correlated_synthesizers(private)


@pytest.mark.slow
def test_two_process_runner_gives_the_same_seeded_release(tmp_path):
    def run(args: list[str], folder) -> tuple[str, dict]:
        job = bs.PrivacyJob(epsilon=2.0, seed=5)
        with beam.Pipeline(options=PipelineOptions(
                ["--runner=beamsynth.runners.local.LocalDirectRunner", *args])) as p:
            private = p | beam.Create(_records()) | job.private(SCHEMA)
            private.dead_letters | "Bad" >> beam.Map(print)
            tables = private | bs.Marginals(marginals=[("sex", "city")], epsilon=2.0)
            tables["sex,city"] | beam.Map(lambda r: json.dumps(r._asdict())) | beam.io.WriteToText(
                str(folder / "m"), shard_name_template="")
            _ = p | bs.WriteManifest(job=job, path=str(folder / "manifest.json"))
        manifest = json.loads((folder / "manifest.json").read_text())
        return sorted((folder / "m").read_text().splitlines()), manifest["operational"]["sources"]
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = run([], tmp_path / "one")
    two = run(["--direct_running_mode=multi_processing", "--direct_num_workers=2"], tmp_path / "two")
    assert one == two and len(one[0]) == 8
