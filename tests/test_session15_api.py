"""Session 15 (H68): the public plugin API's open gaps and an ETL engineer's fourth round: the
private collection's escapes into Beam's joins and merges, dead-letter positions of Arrow
batches, and what a job written from the README and docs/beam-api.md met. Each test is a problem
found there, failing on the code before its fix; pipelines run on tiny data (each < 5 s)."""

from __future__ import annotations

import apache_beam as beam
import pytest

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
