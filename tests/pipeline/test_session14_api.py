"""Session 14 (H57): the public plugin API's known gaps and an ETL engineer's third round: keyword
messages that echo the call, type hints at the public boundary, escapes of the private collection,
Arrow batches as input, and what a job written from the README and docs/beam-api.md met. Each test
is a problem found there, failing on the code before its fix; pipelines run on tiny data."""

from __future__ import annotations

import csv
import json

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.dataframe.convert import to_dataframe

import beamsynth as bs


def test_declared_windows_positional_echoes_the_values_as_the_keyword_call():
    """bs.DeclaredWindows(0, 3600, 600) said 'DeclaredWindows.__init__() takes 1 positional
    argument but 4 were given' (no values, no keywords); a misspelt keyword named no parameter."""
    with pytest.raises(TypeError) as info:
        bs.DeclaredWindows(0, 3600, 600)
    assert "bs.DeclaredWindows takes keyword arguments only (start=, end=, size=)" in str(info.value)
    assert "call bs.DeclaredWindows(start=0, end=3600, size=600)" in str(info.value)
    with pytest.raises(TypeError, match=r"unknown keyword 'sise' \(did you mean 'size'\?\)"):
        bs.DeclaredWindows(start=0, end=3600, sise=600)
    with pytest.raises(TypeError, match=r"call bs.PrivacyJob\(epsilon=1.0\)"):
        bs.PrivacyJob(1.0)
    assert bs.DeclaredWindows(start=0, end=3600, size=600).window_starts()[-1] == 3000
    assert isinstance(beam.WindowInto(bs.DeclaredWindows(start=0, end=3600, size=600)), beam.PTransform)


SMALL = bs.load_schema("adult").select(["age", "sex", "race", "income"])
ROW = {"age": 39, "sex": "Male", "race": "White", "income": "<=50K"}


@pytest.mark.parametrize("escape", [
    lambda p, private: to_dataframe(private),
    lambda p, private: p | "One" >> beam.Create([1]) | beam.Map(
        lambda x, rows: x, beam.pvalue.AsList(private)),
])
def test_a_dataframe_or_side_input_of_the_private_collection_is_refused_with_what_to_apply(escape):
    """to_dataframe(private) said "'PrivateCollection' object has no attribute 'element_type'"
    and beam.pvalue.AsList(private) "... no attribute 'windowing'" (Beam's words, no hint)."""
    p = beam.Pipeline()
    private = p | beam.Create([ROW]) | bs.PrivacyJob(epsilon=1.0, seed=1).private(SMALL)
    with pytest.raises(TypeError, match=r"private collection, not a PCollection.*"
                                        r"to_dataframe\(private \| bs.Count\(epsilon=...\)\)"):
        escape(p, private)
    assert not hasattr(private, "element_type")  # code probing with hasattr is not broken


def test_a_dataframe_of_the_whole_marginals_or_prefix_tree_output_names_its_pcollections():
    """to_dataframe(tables) (the dict bs.Marginals returns) said "'_Tables' object has no
    attribute 'element_type'"; bs.PrefixTree's the same. Now they name what to pick, as a Beam
    step on them already did."""
    p = beam.Pipeline()
    private = p | beam.Create([ROW]) | bs.PrivacyJob(epsilon=2.0, seed=1).private(SMALL, keys=NAME_KEY)
    tables = private | bs.Marginals(marginals=[("sex", "income"), "race"], epsilon=1.0)
    tree = private | bs.PrefixTree(key="name", epsilon=1.0)
    with pytest.raises(TypeError, match=r"dict of tables .* tables\['race'\] or tables\['sex,income'\]"):
        to_dataframe(tables)
    with pytest.raises(TypeError, match=r"tree\['keys'\] or tree\['tree'\]"):
        beam.pvalue.AsList(tree)
    assert to_dataframe(tables["race"]) is not None  # one table converts


RACES = ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"]
_GOOD = [{"age": 20 + i % 50, "sex": "Male" if i % 3 else "Female", "race": RACES[i % 5],
          "income": ">50K" if i % 7 == 0 else "<=50K", "name": ["ola", "kari", "ole"][i % 3]}
         for i in range(60)]
_BAD = [dict(_GOOD[0], age=300), dict(_GOOD[1], sex="X"), dict(_GOOD[2], name="toolongname")]
RECORDS = _GOOD[:25] + _BAD[:1] + _GOOD[25:] + _BAD[1:]
NAME_KEY = {"name": bs.TextKey(column="name", alphabet="abcdefghijklmnopqrstuvwxyz", max_length=4)}
# every public transform, on a job of epsilon 60 and delta 1e-6 (PlausibleDeniability needs 45)
EVERY = {
    "Count": lambda: bs.Count(epsilon=1.0),
    "Marginals": lambda: bs.Marginals(marginals=[("sex", "income"), ("race",)], epsilon=1.0),
    "Histogram": lambda: bs.Histogram(column="race", epsilon=1.0, tolerance=0.9),
    "PrefixTree": lambda: bs.PrefixTree(key="name", epsilon=1.0, method="improved"),
    "Synthesize": lambda: bs.Synthesize(method="independent", epsilon=1.0, rows=30),
    "IndependentSynthesis": lambda: bs.IndependentSynthesis(epsilon=1.0, rows=30),
    "PrivBayes": lambda: bs.PrivBayes(epsilon=1.0, rows=30),
    "SBHG": lambda: bs.SBHG(epsilon=1.0, delta=1e-7, rows=30),
    "PlausibleDeniability": lambda: bs.PlausibleDeniability(epsilon=45.0, delta=1e-7, rows=10),
}


def _as(kind: str) -> list:
    """RECORDS as dicts, beam.Rows, or pyarrow RecordBatches of 17 / 30 / 16 rows (a bad row in
    the first and the last batch)."""
    if kind == "dicts":
        return RECORDS
    if kind == "rows":
        return [beam.Row(**r) for r in RECORDS]
    cuts = [0, 17, 47, len(RECORDS)]
    return [pa.RecordBatch.from_pylist(RECORDS[a:b]) for a, b in zip(cuts, cuts[1:])]


def _releases(kind: str, names: list[str], tmp_path) -> tuple[dict, list, dict]:
    """Seeded releases of `names` on RECORDS as `kind`: sorted rows per output, the dead
    letters' (reason, element) and the manifest's source counts."""
    out = tmp_path / kind
    job = bs.PrivacyJob(epsilon=60.0, delta=1e-6, seed=7)
    with beam.Pipeline() as p:
        private = (p | beam.Create(_as(kind), reshuffle=False)
                   | job.private(SMALL, keys=NAME_KEY, source="src"))
        private.dead_letters | "BadJson" >> beam.Map(lambda r: json.dumps(r._asdict())) \
            | "Bad" >> beam.io.WriteToText(str(out / "bad"))
        for name in names:
            result = private | name >> EVERY[name]()
            for key, pc in (result.items() if isinstance(result, dict) else [("out", result)]):
                pc | f"Repr[{name}.{key}]" >> beam.Map(lambda r: repr(tuple(r))) \
                    | f"Write[{name}.{key}]" >> beam.io.WriteToText(str(out / f"{name}.{key}"))
        p | bs.WriteManifest(job=job, path=str(out / "manifest.json"))
    released = {f.name.split("-")[0]: sorted(f.read_text().splitlines())
                for f in out.glob("*-of-*") if not f.name.startswith("bad")}
    bad = sorted((d["reason"], d["element"]) for f in out.glob("bad-*")
                 for d in map(json.loads, f.read_text().splitlines()))
    manifest = json.loads((out / "manifest.json").read_text())
    return released, bad, manifest["operational"]["sources"]


def _check_same_releases(names: list[str], kinds: tuple[str, ...], tmp_path) -> None:
    dicts = _releases("dicts", names, tmp_path)
    assert len(dicts[1]) == 3 and dicts[2]["src"] == {
        "read": 63, "rejected": 3, "dropped_by_bound": 0, "used": 60}, dicts
    assert sorted(dicts[0]) == sorted(
        f"{n}.{k}" for n in names for k in (["keys", "tree"] if n == "PrefixTree" else
                                             ["sex,income", "race"] if n == "Marginals" else ["out"]))
    for kind in kinds:
        assert _releases(kind, names, tmp_path) == dicts, kind


def test_record_batches_release_what_the_same_dicts_release(tmp_path):
    """The brief's third input form: a PCollection of pyarrow RecordBatches gives the same seeded
    Marginals as the same rows as dicts, each bad row of a batch is its own dead letter (the other
    rows of its batch are used) and the manifest counts the same. Every public transform, and
    beam.Rows too, in the slow variant below (the same, session 14)."""
    _check_same_releases(["Marginals"], ("arrow",), tmp_path)


@pytest.mark.slow
def test_record_batches_release_what_the_same_dicts_release_for_every_transform(tmp_path):
    """As above for every public transform, on RecordBatches and on beam.Rows."""
    _check_same_releases(list(EVERY), ("arrow", "rows"), tmp_path)


def test_a_job_builds_under_beams_all_required_type_check_strictness():
    """--type_check_strictness=ALL_REQUIRED (every step declares its output type) failed when
    built at the first inner step, naming no public step: 'no output type-hint was found for the
    PTransform _MultiParDo(MakePrivate(adult)/Encode/Encode)' (then Flatten(WriteManifest/
    JoinCounts), ...). The public steps declare their types and their inner steps are not asked
    to; a composite with several outputs declares the union of their row types. (Run under the
    flag for every public transform, windowed too, and under --runtime_type_check and
    --performance_runtime_type_check: all ran, session 14.)"""
    options = beam.options.pipeline_options.PipelineOptions(
        ["--type_check_strictness=ALL_REQUIRED"])
    p = beam.Pipeline(options=options)
    job = bs.PrivacyJob(epsilon=60.0, delta=1e-6, seed=7)
    rows = p | beam.Create(RECORDS).with_output_types(dict)
    private = rows | job.private(SMALL, keys=NAME_KEY)
    tables = private | bs.Marginals(marginals=[("sex", "income"), ("race",)], epsilon=1.0)
    for name in ("Count", "PrefixTree", "IndependentSynthesis"):
        private | name >> EVERY[name]()
    p | bs.WriteManifest(job=job, path="unused.json")
    assert str(tables["race"].element_type) == "Row(race=<class 'str'>, noisy_count=<class 'int'>)"
    public = {t.full_label: t.transform for t in p.transforms_stack[0].parts}
    assert "noisy_count" in str(public["Marginals"].get_type_hints().output_types)
    assert all(step.get_type_hints().output_types for step in public.values()), public


def test_every_public_ptransform_is_typed_at_its_boundary():
    """Every bs. PTransform's expand is a typed boundary (a new public step without it would stop
    an ALL_REQUIRED job at its first inner step, as all did before session 14)."""
    public = [getattr(bs, n) for n in bs.__all__]
    steps = [c for c in public if isinstance(c, type) and issubclass(c, beam.PTransform)]
    assert {c.__name__ for c in steps} >= {"Count", "Marginals", "Histogram", "PrefixTree",
                                           "Synthesize", "PrivBayes", "MakePrivate", "WriteManifest"}, steps
    assert [c.__name__ for c in steps if not getattr(c.expand, "_typed_boundary", False)] == []


def test_a_csv_line_with_more_fields_than_its_header_is_a_dead_letter(tmp_path):
    """csv.DictReader (the standard parse of a CSV line to a dict) keeps a line's extra fields
    under the key None; such a line was used with its first fields (in the ETL round: 2,000 Adult
    lines + 5 bad, the one with 17 fields for 16 columns went into every release). Now it is a
    dead letter saying why; a short line and a blank one were dead letters already."""
    header = ["age", "sex", "race", "income"]
    lines = ["39,Male,White,<=50K", "40,Male,White,<=50K,surplus", "41,Male", ""]
    job = bs.PrivacyJob(epsilon=1.0, seed=1)
    with beam.Pipeline() as p:
        records = p | beam.Create(lines) | beam.Map(
            lambda line: next(csv.DictReader([line], fieldnames=header), {}))
        private = records | job.private(SMALL)
        private.dead_letters | beam.Map(lambda r: r.reason) | beam.io.WriteToText(
            str(tmp_path / "bad"), num_shards=1, shard_name_template="")
        private | bs.Count(epsilon=1.0)
        p | bs.WriteManifest(job=job, path=str(tmp_path / "manifest.json"))
    reasons = sorted((tmp_path / "bad").read_text().splitlines())
    assert reasons == ["column 'race': null in a non-nullable column",
                       "required field 'age' is missing",
                       "values without a field name (csv.DictReader's extra fields: the line has "
                       "more fields than its header)"], reasons
    sources = json.loads((tmp_path / "manifest.json").read_text())["operational"]["sources"]
    assert list(sources.values()) == [{"read": 4, "rejected": 3, "dropped_by_bound": 0, "used": 1}]


def test_a_marginal_table_is_found_by_the_tuple_given_to_marginals() -> None:
    """``tables[("sex", "income")]`` (the tuple the user passed in ``marginals=``) is the table
    keyed ``"sex,income"``; it raised KeyError (lead's user check); unknown tuples still do."""
    from beamsynth.transforms.private_ops import _Tables

    tables = _Tables({"sex,income": "the table", "age": "one-way"})
    assert tables[("sex", "income")] == "the table"
    assert tables["sex,income"] == "the table" and tables["age"] == "one-way"
    with pytest.raises(KeyError, match="or their tuple"):
        tables[("income", "sex")]
