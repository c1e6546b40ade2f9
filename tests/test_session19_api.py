"""The plugin API's open items and the ninth round as an ETL engineer (nineteenth session, H101).

Each test fails on the code before its fix (docs/beam-api.md, "Nineteenth session").
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import apache_beam as beam
import pytest


# -- 1. ReadFromJson(lines=False) on a file without records reads no rows ------------------------
@pytest.mark.parametrize("text", ["", "\n  \n", "[]"])
def test_read_from_json_whole_file_without_records_is_built(tmp_path: Path, text: str) -> None:
    """``beam.io.ReadFromJson(path, lines=False)`` samples the whole first file when built: a
    0-byte or blank file failed the pipeline when built (pandas' ``Expected object or value``),
    and each such file failed the run on the workers. Now the build gives rows of no field (a
    ``[]`` file already did) and the workers' reader reads such a file as no rows."""
    from beamsynth._json_sample_fix import WholeJsonReader

    path = tmp_path / "drop.json"
    path.write_text(text, encoding="utf-8")
    rows = beam.Pipeline() | beam.io.ReadFromJson(str(path), lines=False)  # was ValueError
    assert beam.typehints.schemas.named_fields_from_element_type(rows.element_type) == []
    assert len(WholeJsonReader()(io.StringIO(text), orient="records", dtype=False)) == 0


def test_read_from_json_whole_files_of_a_pattern_keep_their_fields(tmp_path: Path) -> None:
    """A pattern whose first file is empty (or ``[]``) samples the file with records, and the
    empty files read as no rows with the sample's columns on the workers (a frame without them
    failed Beam's conversion to rows: ``KeyError: 'sex'``)."""
    from apache_beam.testing.util import assert_that, equal_to

    from beamsynth.runners.local import LocalDirectRunner

    (tmp_path / "a0.json").write_text("", encoding="utf-8")
    (tmp_path / "a1.json").write_text("[]", encoding="utf-8")
    (tmp_path / "a2.json").write_text(json.dumps([{"age": 30, "sex": "Male"}]), encoding="utf-8")
    with beam.Pipeline(runner=LocalDirectRunner()) as p:
        rows = p | beam.io.ReadFromJson(str(tmp_path / "a*.json"), lines=False)
        assert_that(rows | beam.Map(lambda r: (r.age, r.sex)), equal_to([(30, "Male")]))
