"""Session 13 (H50): an ETL engineer adds beamsynth to an existing Beam Python job: every public
PTransform on dicts, schema'd rows and Arrow batches, Beam's own sinks, Beam's type checks and
pickling options, and the errors a user meets. Each test is a problem that user hit, failing on
the code before its fix."""

from __future__ import annotations

import json

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that

import beamsynth as bs

ROW = {"age": 39, "sex": "Male", "race": "White", "income": "<=50K"}
SMALL = bs.load_schema("adult").select(["age", "sex", "race", "income"])


@pytest.mark.parametrize("unit, keys, missing", [
    (None, None, "'income'"),
    (bs.PrivacyUnit(id_column="user", max_contributions=2), None, "'user' (the privacy id)"),
    (None, {"q": bs.TextKey(column="query", alphabet="abc", max_length=3)}, "'query' (key 'q')"),
])
def test_typed_rows_lacking_a_required_field_are_warned_about_when_built(unit, keys, missing, caplog):
    """beam.Row(age, sex, race) (a CSV read without its income column, a beam.Select that forgot
    one) into job.private(schema with a required 'income') ran: every row was a dead letter
    ("required field 'income' is missing") and Count released noise on no record, silently. The
    element type says so when the pipeline is built: a warning names the missing field and the
    fixes. Not a refusal: Beam infers some element types from the records (beam.Create,
    ReadFromJson), so refusing would make whether a release happens depend on one record (rule 7,
    tests/audit/test_session13_redteam.py). Same for the privacy-id column and a key's column."""
    job = bs.PrivacyJob(epsilon=1.0, **({"privacy_unit": unit} if unit else {}))
    rows = [beam.Row(age=39, sex="Male", race="White", **({"income": "<=50K"} if unit or keys else {}))]
    p = beam.Pipeline()
    typed = p | beam.Create(rows)
    with caplog.at_level("WARNING", logger="beamsynth.transforms.private"):
        typed | job.private(SMALL, keys=keys)
    message = "\n".join(r.getMessage() for r in caplog.records)
    assert f"lack {missing}" in message, message
    assert "['age', 'sex', 'race'" in message      # the rows' own fields
    assert "bs.field_name" in message and "dead letter" in message
    assert not job.accountant.spends


def test_typed_rows_lacking_only_a_nullable_field_still_run():
    """A nullable declared column may be absent from the rows (it is null): not refused."""
    schema = bs.load_schema({"name": "t", "columns": [
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["Female", "Male"]}},
        {"name": "note", "type": "categorical", "nullable": True,
         "domain": {"kind": "categorical", "values": ["a", "b"]}}]})
    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    with beam.Pipeline() as p:
        private = p | beam.Create([beam.Row(sex="Male")]) | job.private(schema)
        private.dead_letters | "Bad" >> beam.Map(lambda r: pytest.fail(f"dead letter {r}"))
        private | bs.Count(epsilon=1.0)


def _manifest_job(tmp_path, output: str, sink) -> dict:
    """A seeded one-Count job whose bs.WriteManifest(output=...) goes on to `sink`; returns the
    manifest file's content."""
    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    with beam.Pipeline() as p:
        private = p | beam.Create([ROW]) | job.private(SMALL)
        private.dead_letters | "Bad" >> beam.Map(print)
        private | bs.Count(epsilon=1.0)
        sink(p | bs.WriteManifest(job=job, path=str(tmp_path / "manifest.json"), output=output))
    return json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8"))


def test_manifest_as_json_text_goes_to_write_to_text(tmp_path):
    """`p | bs.WriteManifest(...) | beam.io.WriteToText(path)` wrote the dict's Python repr
    (single quotes: not JSON, silently). output="json" gives the file's JSON text."""
    manifest = _manifest_job(tmp_path, "json", lambda m: m | beam.io.WriteToText(
        str(tmp_path / "copy"), num_shards=1, shard_name_template="", file_name_suffix=".json"))
    assert (tmp_path / "copy.json").read_text(encoding="utf-8") == (
        tmp_path / "manifest.json").read_text(encoding="utf-8")
    assert manifest["release"]["budget"]


def test_manifest_as_row_goes_to_schema_sinks(tmp_path):
    """`bs.WriteManifest(...) | beam.io.WriteToJson(path)` (or WriteToCsv, WriteToParquet) was
    refused when built: 'Could not determine schema for type hint Dict[Any, Any]' / 'A schema
    is required to write non-schema'd data'. output="row" gives one schema'd Row(path, created,
    release, operational), the two parts as JSON text."""
    def sinks(m):
        m | "Json" >> beam.io.WriteToJson(str(tmp_path / "json"), num_shards=1)
        m | "Csv" >> beam.io.WriteToCsv(str(tmp_path / "csv"), num_shards=1)
        m | "Parquet" >> beam.io.WriteToParquet(str(tmp_path / "pq"), num_shards=1)
    manifest = _manifest_job(tmp_path, "row", sinks)
    [line] = (tmp_path / "json-00000-of-00001").read_text(encoding="utf-8").splitlines()
    row = json.loads(line)
    assert row["path"] == str(tmp_path / "manifest.json")
    assert json.loads(row["release"]) == manifest["release"]
    assert json.loads(row["operational"]) == manifest["operational"]
    [table] = [pq.read_table(f) for f in tmp_path.glob("pq-*")]
    assert table.column_names == ["path", "created", "release", "operational"]
    assert (tmp_path / "csv-00000-of-00001").read_text(encoding="utf-8").startswith(
        "path,created,release,operational\n")


def test_manifest_default_output_is_still_the_dict_and_a_bad_output_is_refused(tmp_path):
    def is_the_dict(manifests):
        assert [type(m) for m in manifests] == [dict] and manifests[0]["release"]["budget"]

    def check(m):
        assert str(m.element_type) == "Dict[Any, Any]"
        assert_that(m, is_the_dict)
    _manifest_job(tmp_path, "dict", check)
    job = bs.PrivacyJob(epsilon=1.0)
    with pytest.raises(ValueError, match=r"output \('text'\) must be one of \['dict', 'json', "
                       r"'row'\]: .*beam.io.WriteToText"):
        bs.WriteManifest(job=job, path="m.json", output="text")


def test_display_data_of_every_public_transform_names_its_noise_and_no_data():
    """display_data (what a runner's UI shows for each step): bs.Count showed ε and δ but no
    noise scale, and the synthesizers (bs.IndependentSynthesis, PrivBayes, SBHG,
    PlausibleDeniability, Synthesize) neither scale nor how their ε is spent. After the step is
    applied every public transform shows ε, δ and its scale, or its spends (each part's ε and
    scale); never a data value."""
    from apache_beam.transforms.display import DisplayData

    races = ["White", "Black"]
    keys = {"occ": bs.TextKey(column="occupation", alphabet="abcdefghijklmnopqrstuvwxyz", max_length=4),
            "who": bs.HierarchyKey(columns=["sex", "race"], tree={"Male": races, "Female": races})}
    job = bs.PrivacyJob(epsilon=100.0, delta=1e-5, privacy_unit=bs.PrivacyUnit(id_column="user",
                                                                               max_contributions=2))
    private = (beam.Pipeline() | beam.Create([dict(ROW, user="secret-user", occupation="zyzzyva")])
               | job.private(SMALL, keys=keys))
    steps = {"Count": bs.Count(epsilon=0.5),
             "Marginals": bs.Marginals(marginals=[("sex", "income")], epsilon=0.5),
             "Histogram": bs.Histogram(column="race", epsilon=0.5, tolerance=0.9),
             "PrefixTree": bs.PrefixTree(key="occ", epsilon=0.5),
             "Independent": bs.IndependentSynthesis(epsilon=0.5, rows=10),
             "PrivBayes": bs.PrivBayes(epsilon=0.5, rows=10),
             "SBHG": bs.SBHG(epsilon=0.5, delta=1e-6, rows=10),
             "Plausible": bs.PlausibleDeniability(epsilon=40.0, delta=1e-6, rows=2),
             "Synthesize": bs.Synthesize(method="independent", epsilon=0.5)}
    for name, step in steps.items():
        private | name >> step
        shown = {i.key: i.value for i in DisplayData.create_from(step).items}
        assert {"epsilon", "delta"} <= set(shown), (name, shown)
        assert "scale" in shown or "spends" in shown, (name, shown)
        assert shown.get("scale") != "unbound", (name, shown)
        assert not any(v in str(shown) for v in ("secret", "zyzz")), (name, shown)
    count = {i.key: i.value for i in DisplayData.create_from(steps["Count"]).items}
    assert count["scale"] == 2 / 0.5                            # k / ε
    spends = {i.key: i.value for i in DisplayData.create_from(steps["Synthesize"]).items}["spends"]
    assert spends.startswith("row_count ε=0.025 scale 80; independent.marginals ε=0.475"), spends
    job.accountant.to_dict()


@pytest.mark.parametrize("make, message", [
    (lambda: bs.PrivacyJob(epsilon="1.0"),
     "epsilon must be a number > 0, got str ('1.0'); pass epsilon=1.0"),
    (lambda: bs.PrivacyJob(epsilon=1.0, delta="1e-6"),
     "delta must be a number in [0, 1), got str ('1e-6'); pass delta=1e-06"),
    (lambda: bs.Count(epsilon="0.5"), "epsilon must be a number > 0, got str ('0.5'); pass epsilon=0.5"),
    (lambda: bs.PrivBayes(epsilon="half", rows=10),
     "epsilon must be a number > 0, got str ('half'); pass a number, e.g. epsilon=0.5"),
    (lambda: bs.PrivacyJob(epsilon=0), "epsilon (0) must be a finite number > 0"),
    (lambda: bs.Histogram(column="sex", epsilon=-1, tolerance=0.9),
     "epsilon (-1) must be a finite number > 0"),
])
def test_a_string_or_nonpositive_epsilon_is_refused_saying_what_to_pass(make, message):
    """epsilon read from argparse or a config as text: bs.PrivacyJob(epsilon='1.0') said
    'epsilon must be a number, got str ('1.0')' and bs.Count 'epsilon must be a number > 0, got
    str ('0.5')', leaving the user to guess; now both say the same and what to pass."""
    with pytest.raises((TypeError, ValueError)) as err:
        make()
    assert str(err.value).startswith(message), str(err.value)


def test_a_delta_step_on_a_pure_job_says_the_job_needs_a_delta():
    """bs.SBHG(epsilon=0.5, delta=1e-6) on bs.PrivacyJob(epsilon=1.0) (no delta) said 'asks for
    (ε=0.5, δ=1e-06) but only (ε=1, δ=0) of the total ε=1 remains': ε=1 is left, so what is
    wrong? Now it names the job's δ = 0 and the fix; nothing is spent."""
    job = bs.PrivacyJob(epsilon=1.0)
    private = beam.Pipeline() | beam.Create([ROW]) | job.private(SMALL)
    with pytest.raises(bs.BudgetExceededError) as err:
        private | bs.SBHG(epsilon=0.5, delta=1e-6, rows=10)
    assert str(err.value).startswith(
        "step 'Synthesize[sbhg]' asks for (ε=0.5, δ=1e-06), but this job's total ε=1 has δ = 0 "
        "(pure ε-DP), so no step can spend a δ: give the job one, e.g. bs.PrivacyJob(epsilon=1, "
        "delta=1e-06)"), str(err.value)
    assert not job.accountant.spends


@pytest.mark.parametrize("step, message", [
    (lambda: beam.Map(print), r"^Map\(print\): job.private's output is a private collection, not a "
     r"PCollection: Beam's own steps do not apply to it; apply a beamsynth mechanism "
     r"\(private \| bs.Count\(epsilon=...\), bs.Marginals, ...\) and give its output to Beam, or "
     r"route private.dead_letters"),
    (lambda: "Print" >> beam.io.WriteToText("unused"), r"^Print: job.private's output is a private"),
    (lambda: bs.PrivacyJob(epsilon=1.0).private(SMALL), r"^MakePrivate\(adult\): job.private's "
     r"output is a private collection, .* \(it is private already\)$"),
])
def test_a_beam_step_on_the_private_collection_says_what_to_apply(step, message):
    """`private | beam.Map(print)` (or WriteToText, or job.private again) raised
    "TypeError: PrivateCollection.__new__() takes 1 positional argument but 2 were given" from
    inside Beam; it now says what a private collection takes, when the pipeline is built."""
    job = bs.PrivacyJob(epsilon=1.0)
    private = beam.Pipeline() | beam.Create([ROW]) | job.private(SMALL)
    with pytest.raises(TypeError, match=message):
        private | step()
    private | "Labelled" >> bs.Count(epsilon=0.5)          # beamsynth steps still apply
    assert [s.step for s in job.accountant.spends] == ["Labelled"]


def test_a_beam_step_on_the_marginals_dict_names_its_tables():
    """`private | bs.Marginals(...) | beam.Map(print)` raised "AttributeError: '_Tables' object
    has no attribute 'is_bounded'"; it now names the tables to pick one from."""
    job = bs.PrivacyJob(epsilon=1.0)
    private = beam.Pipeline() | beam.Create([ROW]) | job.private(SMALL)
    tables = private | bs.Marginals(marginals=[("sex", "income"), ("race",)], epsilon=0.5)
    with pytest.raises(TypeError, match=r"^Map\(print\): bs.Marginals' output is a dict of tables "
                       r"\(one PCollection each\): apply Beam's steps to one of them, "
                       r"tables\['race'\] or tables\['sex,income'\]"):
        tables | beam.Map(print)
    job.accountant.to_dict()


def test_a_beam_step_on_the_prefix_tree_dict_names_its_outputs():
    """`tree | beam.Map(print)` on bs.PrefixTree's output raised "AttributeError: 'dict' object
    has no attribute 'is_bounded'" and tree['key'] a bare KeyError: 'key'."""
    job = bs.PrivacyJob(epsilon=1.0)
    keys = {"q": bs.TextKey(column="q", alphabet="ab", max_length=3)}
    private = beam.Pipeline() | beam.Create([dict(ROW, q="ab")]) | job.private(SMALL, keys=keys)
    tree = private | bs.PrefixTree(key="q", epsilon=0.5)
    with pytest.raises(TypeError, match=r"^Map\(print\): bs.PrefixTree's output is a dict of two "
                       r"outputs \(one PCollection each\): apply Beam's steps to one of them, "
                       r"tree\['keys'\] or tree\['tree'\]$"):
        tree | beam.Map(print)
    with pytest.raises(KeyError, match=r"no bs.PrefixTree output 'key'; its outputs are \['keys', "
                       r"'tree'\]"):
        tree["key"]
    job.accountant.to_dict()


@pytest.mark.parametrize("make, message", [
    (lambda: bs.PrivacyJob(1.0), "bs.PrivacyJob takes keyword arguments only (epsilon=, delta=, "
     "privacy_unit=, seed=, name=, disjoint=); got 1 positional: 1.0"),
    (lambda: bs.PrivacyJob(epsilon=1.0, privacy_unt=None),
     "bs.PrivacyJob got an unknown keyword 'privacy_unt' (did you mean 'privacy_unit'?)"),
    (lambda: bs.PrivacyUnit("user", 2), "bs.PrivacyUnit takes keyword arguments only (id_column=, "
     "max_contributions=); got 2 positional: 'user', 2"),
    (lambda: bs.PrivacyJob(epsilon=1.0).private(SMALL, key={}),
     "bs.MakePrivate got an unknown keyword 'key' (did you mean 'keys'?)"),
    (lambda: bs.WriteManifest(bs.PrivacyJob(epsilon=1.0), "m.json"),
     "bs.WriteManifest takes keyword arguments only (job=, path=, output=, label=); got 2 "
     "positional: "),
    (lambda: bs.WriteManifest(job=bs.PrivacyJob(epsilon=1.0), pth="m.json"),
     "bs.WriteManifest got an unknown keyword 'pth' (did you mean 'path'?); it takes: job, path, "
     "output, label"),
])
def test_positional_or_misspelt_arguments_of_the_job_say_the_keywords(make, message):
    """bs.PrivacyJob(1.0) said 'PrivacyJob.__init__() takes 1 positional argument but 2 were
    given' (bs.WriteManifest(job, 'm.json'), bs.PrivacyUnit('user', 2) the same) and a typo 'got
    an unexpected keyword argument 'privacy_unt'', where the mechanisms (bs.Count(0.5)) already
    named their keywords and the nearest one."""
    with pytest.raises(TypeError) as err:
        make()
    assert str(err.value).startswith(message), str(err.value)


def test_privbayes_with_a_per_round_scale_builds_and_shows_it():
    """bs.PrivBayes(options={"refine_pairs": 3}) raised when applied, from display data: its
    refinement spend's scale is one number per round, and the spends text formatted it as one
    number ('unsupported format string passed to list.__format__'). It builds, and the display
    lists the numbers."""
    from apache_beam.transforms.display import DisplayData

    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    p = beam.Pipeline()
    step = bs.PrivBayes(epsilon=1.0, rows=50, options={"refine_pairs": 3})
    _ = p | beam.Create([ROW] * 5) | job.private(SMALL) | step
    spends = {item.key: item.value for item in DisplayData.create_from(step).items}["spends"]
    assert "refine" in spends and "scale [" in spends, spends
