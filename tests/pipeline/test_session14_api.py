"""Session 14 (H57): the public plugin API's known gaps and an ETL engineer's third round: keyword
messages that echo the call, type hints at the public boundary, escapes of the private collection,
Arrow batches as input, and what a job written from the README and docs/beam-api.md met. Each test
is a problem found there, failing on the code before its fix; pipelines run on tiny data."""

from __future__ import annotations

import apache_beam as beam
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
