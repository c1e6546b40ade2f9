"""Session 13 (H50): an ETL engineer adds beamsynth to an existing Beam Python job: every public
PTransform on dicts, schema'd rows and Arrow batches, Beam's own sinks, Beam's type checks and
pickling options, and the errors a user meets. Each test is a problem that user hit, failing on
the code before its fix."""

from __future__ import annotations

import apache_beam as beam
import pytest

import beamsynth as bs

ROW = {"age": 39, "sex": "Male", "race": "White", "income": "<=50K"}
SMALL = bs.load_schema("adult").select(["age", "sex", "race", "income"])


@pytest.mark.parametrize("unit, keys, missing", [
    (None, None, "'income'"),
    (bs.PrivacyUnit(id_column="user", max_contributions=2), None, "'user' (the privacy id)"),
    (None, {"q": bs.TextKey(column="query", alphabet="abc", max_length=3)}, "'query' (key 'q')"),
])
def test_typed_rows_lacking_a_required_field_are_refused_when_built(unit, keys, missing):
    """beam.Row(age, sex, race) (a CSV read without its income column, a beam.Select that forgot
    one) into job.private(schema with a required 'income') ran: every row was a dead letter
    ("required field 'income' is missing") and Count released noise on no record. The element
    type says so when the pipeline is built: refused, naming the missing field and the fixes.
    Same for the privacy-id column and a key's column."""
    job = bs.PrivacyJob(epsilon=1.0, **({"privacy_unit": unit} if unit else {}))
    rows = [beam.Row(age=39, sex="Male", race="White", **({"income": "<=50K"} if unit or keys else {}))]
    p = beam.Pipeline()
    typed = p | beam.Create(rows)
    with pytest.raises(ValueError) as err:
        typed | job.private(SMALL, keys=keys)
    message = str(err.value)
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

