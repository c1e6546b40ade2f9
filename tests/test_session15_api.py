"""Session 15 (H68): the public plugin API's open gaps and an ETL engineer's fourth round: the
private collection's escapes into Beam's joins and merges, dead-letter positions of Arrow
batches, and what a job written from the README and docs/beam-api.md met. Each test is a problem
found there, failing on the code before its fix; pipelines run on tiny data (each < 5 s)."""

from __future__ import annotations

import dataclasses

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

import beamsynth as bs

SMALL = bs.load_schema("adult").select(["age", "sex", "race", "income"])
ROW = {"age": 39, "sex": "Male", "race": "White", "income": "<=50K"}
JOIN_HINT = r"private collection, not a PCollection.*join or merge the records upstream"


def _private(p: beam.Pipeline, **job: object) -> bs.PrivateCollection:
    return p | beam.Create([ROW]) | bs.PrivacyJob(epsilon=1.0, seed=1, **job).private(SMALL)


@pytest.mark.parametrize("escape", [
    lambda p, private, other: {"a": private, "b": other} | beam.CoGroupByKey(),
    lambda p, private, other: (private, other) | beam.CoGroupByKey(),
    lambda p, private, other: {"a": private} | beam.CoGroupByKey(),
    lambda p, private, other: (private, other) | beam.Flatten(),
    lambda p, private, other: [private] | beam.Flatten(),
], ids=["cogbk-dict", "cogbk-tuple", "cogbk-alone", "flatten", "flatten-alone"])
def test_a_join_or_merge_of_the_private_collection_is_refused_when_built(escape):
    """{"a": private} | beam.CoGroupByKey() built and failed only in the run (Beam made a Create
    of the private collection's two PCollections: 'argument after * must be an iterable, not
    _InvalidUnpickledPCollection [while running CoGroupByKey/.../Tag[a]]'); Flatten said 'Inputs
    to Flatten cannot include an iterable of PCollections', naming no way out. Now each is
    refused when built, saying to join upstream or measure first."""
    p = beam.Pipeline()
    private = _private(p)
    other = p | "Other" >> beam.Create([("k", 1)])
    with pytest.raises(TypeError, match=JOIN_HINT):
        escape(p, private, other)


@pytest.mark.parametrize("escape", [
    lambda private: private.batches | beam.Map(print),
    lambda private: private[0] | beam.Map(print),
    lambda private: beam.pvalue.AsList(private.batches),
], ids=["batches", "index", "side-input"])
def test_the_exact_encoded_records_are_not_an_attribute_beam_takes(escape):
    """private.batches (and private[0]) was an ordinary PCollection of the exact encoded
    records: private.batches | beam.Map(print) ran and printed them, no noise, no spend. Now it
    is refused when built; private.exact_batches() names what it is."""
    p = beam.Pipeline()
    private = _private(p)
    with pytest.raises(TypeError, match=r"the encoded records are exact.*"
                                        r"private\.exact_batches\(\) \(not DP\)"):
        escape(private)
    assert isinstance(private.exact_batches(), beam.PCollection)
    assert not hasattr(private, "batches")  # hasattr probes are not broken (AttributeError)


def test_unpacking_the_private_collection_is_refused():
    """batches, dead = private unpacked the tuple it was (the exact records, then the dead
    letters); now refused with what to do."""
    p = beam.Pipeline()
    private = _private(p)
    with pytest.raises(TypeError, match=JOIN_HINT):
        _batches, _dead = private


def test_a_job_still_runs_with_a_composite_returning_the_private_collection(tmp_path):
    """The private collection is no tuple of PCollections to Beam now: a user's composite that
    returns it, mechanisms on it and its dead letters through Beam's Flatten still run."""

    class ReadPrivate(beam.PTransform):
        def __init__(self, job: bs.PrivacyJob) -> None:
            super().__init__()
            self._job = job

        def expand(self, p):
            return p | beam.Create([ROW, {**ROW, "sex": "X"}]) | self._job.private(SMALL)

    job = bs.PrivacyJob(epsilon=1.0, seed=3)
    with beam.Pipeline() as p:
        private = p | ReadPrivate(job)
        other = p | "OtherBad" >> beam.Create([beam.Row(source="s", position=0, reason="r",
                                                        element="{}")])
        bad = (private.dead_letters, other) | "AllBad" >> beam.Flatten()
        bad | "Reasons" >> beam.Map(lambda r: r.reason) | "WriteBad" >> beam.io.WriteToText(
            str(tmp_path / "bad"), num_shards=1, shard_name_template="")
        private | bs.Count(epsilon=1.0) | beam.Map(lambda r: r.noisy_count) | beam.io.WriteToText(
            str(tmp_path / "count"), num_shards=1, shard_name_template="")
    reasons = (tmp_path / "bad").read_text().splitlines()
    assert len(reasons) == 2 and "r" in reasons and any("'X'" in r for r in reasons)
    int((tmp_path / "count").read_text())


# --- dead-letter positions (H68 gap 1): the same bad rows as dicts, beam.Rows and Arrow ----------

GOOD = [{"age": 20 + i, "sex": "Female" if i % 2 else "Male", "race": "White",
         "income": "<=50K"} for i in range(6)]
BAD = [{"age": "abc", "sex": "Male", "race": "White", "income": "<=50K"},    # malformed
       {"age": 40, "sex": "X", "race": "White", "income": "<=50K"},          # out of domain
       {"age": 41, "sex": None, "race": "White", "income": ">50K"}]          # null, required


def _numbered() -> list[dict]:
    return [{**r, "row": i + 2} for i, r in enumerate(GOOD[:3] + BAD + GOOD[3:])]  # line numbers


def _as(kind: str, records: list[dict]) -> list:
    if kind == "dicts":
        return records
    if kind == "rows":
        return [beam.Row(**{k: (None if v is None else str(v)) for k, v in r.items()}) for r in records]
    table = pa.Table.from_pylist([{k: (None if v is None else str(v)) for k, v in r.items()}
                                  for r in records])
    return [table.slice(0, 4), table.slice(4)]  # two batches, the bad rows across both


def _dead_letters(kind: str, records: list[dict], **private: object) -> list[tuple]:
    with TestPipeline() as p:
        out = (p | beam.Create(_as(kind, records), reshuffle=False)
               | bs.PrivacyJob(epsilon=1.0, seed=1).private(SMALL, **private))
        assert_that(out.dead_letters | beam.Map(lambda d: (d.position, d.reason)),
                    equal_to(EXPECTED[private.get("position_field")]))
    return []


EXPECTED = {
    "row": [(5, "column 'age': value 'abc' is not a valid integer"),
            (6, "column 'sex': value 'X' is outside the declared categorical domain (to keep such rows, declare a catch-all cell, other: OTHER in the domain, and on_out_of_domain: other; docs/schema-format.md)"),
            (7, "column 'sex': null in a non-nullable column")],
}
EXPECTED[None] = [(None, why) for _, why in EXPECTED["row"]]


@pytest.mark.parametrize("kind", ["dicts", "rows", "arrow"])
@pytest.mark.parametrize("field", ["row", None])
def test_dead_letters_of_dicts_rows_and_arrow_batches_carry_the_same_positions(kind, field):
    """The same three bad rows as dicts, beam.Rows and two Arrow batches: the same (position,
    reason) dead letters, the position read from position_field='row' (a line number attached
    upstream), None without one (Beam gives an element no stable position of its own)."""
    _dead_letters(kind, _numbered(), **({} if field is None else {"position_field": field}))


def test_position_field_is_no_undeclared_field_of_a_dict_under_extra_columns_reject():
    """With extra_columns: reject, a dict's position_field was an undeclared field, so every
    numbered dict was a dead letter (an Arrow batch's position column was allowed): the release
    was learned from no record. Now the position field is allowed for every kind of element."""
    strict = dataclasses.replace(SMALL, extra_columns="reject")
    records = [{**r, "row": i} for i, r in enumerate(GOOD)] + [{**GOOD[0], "row": 9, "x": 1}]
    for kind in ("dicts", "arrow"):
        elements = records if kind == "dicts" else [pa.Table.from_pylist(records[:-1]),
                                                    pa.Table.from_pylist(records[-1:])]
        with TestPipeline() as p:
            private = (p | beam.Create(elements, reshuffle=False)
                       | bs.PrivacyJob(epsilon=1.0, seed=1).private(strict, position_field="row"))
            assert_that(private.dead_letters | beam.Map(lambda d: (d.position, d.reason)),
                        equal_to([(9, "undeclared field(s) ['x'] and the schema says "
                                      "extra_columns: reject")]))


@pytest.mark.parametrize("value", [12.7, 2**70, True, "a.csv:12"])
def test_a_position_that_is_no_64_bit_integer_is_none_never_made_up_or_a_crash(value):
    """A position 12.7 became 12 (int()), True became 1, and 2**70 failed the run when Beam
    encoded the dead letter (its int is 64 bits): rule 8. Now each is None; 12.0 (pandas' float
    of a line number) and "12" are 12."""
    records = [{**BAD[0], "row": value}, {**BAD[1], "row": 12.0}, {**BAD[2], "row": " 12 "}]
    with TestPipeline() as p:
        private = (p | beam.Create(records, reshuffle=False)
                   | bs.PrivacyJob(epsilon=1.0, seed=1).private(SMALL, position_field="row"))
        assert_that(private.dead_letters | beam.Map(lambda d: d.position),
                    equal_to([None, 12, 12]))


def test_a_position_field_the_input_lacks_is_said_when_built_and_counted_in_the_run(caplog):
    """position_field='line' on rows or Arrow batches without that field gave every dead letter
    position None without a word. Typed rows lacking it: a warning when built; an Arrow batch
    (whose columns only the run sees): the counter beamsynth/dead_letters_without_position and
    one warning per worker, never a failed run (rules 7, 8)."""
    rows = [beam.Row(age=39, sex="X", race="White", income="<=50K")]
    with caplog.at_level("WARNING"):
        p = beam.Pipeline()
        _ = p | beam.Create(rows) | bs.PrivacyJob(epsilon=1.0, seed=1).private(
            SMALL, position_field="line")
    assert "position_field 'line' is not a field of its input rows" in caplog.text
    p = beam.Pipeline()
    table = pa.Table.from_pylist([{k: str(v) for k, v in r.items()} for r in GOOD + BAD[:2]])
    private = (p | beam.Create([table], reshuffle=False)
               | bs.PrivacyJob(epsilon=1.0, seed=1).private(SMALL, position_field="line"))
    _ = private.dead_letters | beam.Map(lambda d: d)
    with caplog.at_level("WARNING"):
        result = p.run()
        result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("dead_letters_without_position"))
    assert sum(c.committed for c in counters["counters"]) == 2
    assert "lack position_field 'line'" in caplog.text


# --- the ETL engineer's fourth round (H68): stumbles, each failing on the code before its fix ---

def test_a_marginal_written_as_its_output_key_names_the_tuple_to_pass():
    """marginals=["sex,income"] (the key the output dict uses) said "'sex,income' is not a
    declared column ... (did you mean 'income'?)", pointing to a one-way table; now it names the
    tuple ('sex', 'income'), field names (native_country) included."""
    p = beam.Pipeline()
    private = p | beam.Create([ROW]) | bs.PrivacyJob(epsilon=1.0, seed=1).private(
        bs.load_schema("adult"))
    with pytest.raises(ValueError, match=r"did you mean \('sex', 'income'\) \(its output key is "
                                         r"'sex,income'\)\?"):
        private | bs.Marginals(marginals=["sex,income"], epsilon=1.0)
    with pytest.raises(ValueError, match=r"did you mean \('native-country', 'sex'\)"):
        private | "M2" >> bs.Marginals(marginals=["native_country, sex"], epsilon=1.0)


def test_job_private_shows_its_source_and_position_field_in_display_data():
    """A runner's step panel showed job.private's schema and privacy unit but not the source
    name its dead letters and manifest counts carry, nor the field their positions come from."""
    from apache_beam.transforms.display import DisplayData

    step = bs.PrivacyJob(epsilon=1.0).private(SMALL, position_field="line", source="events")
    shown = {item.key: item.value for item in DisplayData.create_from(step).items}
    assert shown["source"] == "events" and shown["position_field"] == "line"
    assert shown["schema"] == "adult" and shown["privacy_id"] == "none"


def test_job_private_lists_its_two_outputs_in_the_graph_runners_see():
    """Now that the private collection is no tuple, Beam registers no output of a step returning
    it; job.private adds its two (batches, dead_letters), so the runner API graph is the one a
    tuple gave (a composite whose inner outputs are read outside it is what portable runners
    were given before)."""
    p = beam.Pipeline()
    private = _private(p)
    _ = private | bs.Count(epsilon=1.0)
    graph = p.to_runner_api()
    step = next(t for t in graph.components.transforms.values()
                if t.unique_name == "MakePrivate(adult)")
    assert sorted(step.outputs) == ["batches", "dead_letters"]


NESTED = [{"age": 30, "sex": {"code": "Male"}, "race": "White", "income": "<=50K", "line": 1},
          {"age": [31], "sex": "Female", "race": "White", "income": ">50K", "line": 3},
          {"age": 32, "sex": "Female", "race": "White", "income": ">50K", "line": 7}]


@pytest.mark.parametrize("kind", ["dicts", "rows", "arrow"])
def test_nested_values_give_the_same_dead_letters_as_dicts_rows_and_arrow(kind):
    """An Arrow struct column said 'cannot encode Arrow element: TypeError: unhashable type:
    'dict'' (a dict's: 'column 'sex': value {...} is a dict, not one value; flatten nested fields
    before job.private'), and a list column 'value array([31]) ...' (a dict's: 'value [31]').
    Now an Arrow batch's dead letters read as the same rows' as dicts or beam.Rows."""
    elements = (NESTED if kind == "dicts" else [beam.Row(**r) for r in NESTED] if kind == "rows"
                else [pa.Table.from_pylist([r]) for r in NESTED])
    with TestPipeline() as p:
        private = (p | beam.Create(elements, reshuffle=False)
                   | bs.PrivacyJob(epsilon=1.0, seed=1).private(SMALL, position_field="line"))
        assert_that(private.dead_letters | beam.Map(lambda d: (d.position, d.reason)), equal_to([
            (1, "column 'sex': value {'code': 'Male'} is a dict, not one value; flatten nested "
                "fields before job.private (e.g. in a beam.Map)"),
            (3, "column 'age': value [31] is not a valid integer")]))
