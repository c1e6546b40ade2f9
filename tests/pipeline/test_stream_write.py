"""Windowed releases: CSV-escaped header, rows streamed through part files, no leftover folder.

``_WriteWindowReleaseFn`` used to group every table of a window and write the header without
CSV escaping (a column name with a comma or a quote broke the file). Now each sampled table is
written to a part file of its window where it is sampled, the window's group holds part paths
only, and the release concatenates the parts under an escaped header.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import json
import os
from pathlib import Path

import apache_beam as beam
import pandas as pd
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window as beam_window

from beamsynth.pipelines import stream as stream_mod
from beamsynth.pipelines.io.manifest import manifest_path
from beamsynth.pipelines.io.single_file import (
    TEMP_PREFIX,
    csv_header,
    remove_temp_folders_on_failure,
)
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis
from beamsynth.pipelines.stream import DAY, WindowedSynthesis
from beamsynth.schemas.schema import load_schema
from beamsynth.transforms.faults import InjectedFault

T0 = int(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp())
NAMES = ['city, state', 'say "hi"', "plain"]
SCHEMA = {"columns": [
    {"name": NAMES[0], "type": "categorical", "domain": {"kind": "categorical", "values": ["a, b", "c"]}},
    {"name": NAMES[1], "type": "categorical", "domain": {"kind": "categorical", "values": ['q"x', "y"]}},
    {"name": NAMES[2], "type": "integer", "domain": {"kind": "integer", "low": 0, "high": 9, "bins": 5}},
]}


def _plan(tmp_path: Path, rows: int | None = None):
    cfg = SynthesisConfig(input="stream", schema=load_schema(SCHEMA), output=str(tmp_path / "day.csv"),
                          epsilon=2.0, seed=5, shard_rows=70, method="independent", rows=rows)
    return plan_synthesis(cfg)


def _batches(schema, days: int = 2) -> list:
    cols = {NAMES[0]: pd.Series(["a, b", "c"] * 100, dtype=object),
            NAMES[1]: pd.Series(['q"x'] * 150 + ["y"] * 50, dtype=object),
            NAMES[2]: pd.Series([str(i % 10) for i in range(200)], dtype=object)}
    batch, bad = schema.encode_columns(cols, 200)
    assert bad == []
    return [beam_window.TimestampedValue(batch, T0 + d * DAY + 60) for d in range(days)]


def _run(tmp_path: Path, plan, *, days: int = 2) -> None:
    p = beam.Pipeline(options=PipelineOptions(["--direct_running_mode=in_memory"]))
    out = (p | beam.Create(_batches(plan.schema, days), reshuffle=False)
           | WindowedSynthesis(plan=plan, output=str(tmp_path / "day.csv"), windows_start=T0,
                               windows_end=T0 + days * DAY, window_seconds=DAY))
    assert set(out) >= {"releases", "tables"}
    with remove_temp_folders_on_failure(p):
        p.run().wait_until_finish()


def test_csv_header_escapes_commas_and_quotes():
    assert csv_header(NAMES) == '"city, state","say ""hi""",plain\n'
    assert next(csv.reader(io.StringIO(csv_header(NAMES)))) == NAMES


def test_window_release_header_and_rows_parse_back(tmp_path):
    """A column name with a comma and one with a quote: the file parses back with the declared
    names and declared values, its row count is the manifest's, and no part folder is left."""
    plan = _plan(tmp_path, rows=250)  # 4 sampling shards of <= 70 rows per window
    _run(tmp_path, plan)
    files = sorted(tmp_path.glob("day.*.csv"))
    assert [f.name for f in files] == ["day.20240101T000000Z.csv", "day.20240102T000000Z.csv"]
    for f in files:
        df = pd.read_csv(f, dtype=str, keep_default_na=False)
        assert list(df.columns) == NAMES
        assert len(df) == 250
        assert set(df[NAMES[0]]) <= {"a, b", "c"} and set(df[NAMES[1]]) <= {'q"x', "y"}
        m = json.loads(Path(manifest_path(str(f))).read_text())
        assert m["release"]["rows_out"] == 250
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]
    # the file does not depend on the run: same seed, same bytes (parts in window, shard order)
    again = tmp_path / "again"
    again.mkdir()
    _run(again, _plan(again, rows=250))
    for f in files:
        assert (again / f.name).read_bytes() == f.read_bytes()


def test_window_group_holds_part_paths_not_tables(tmp_path):
    """The window's GroupByKey is fed by part entries (from ``WriteParts``, fused with sampling)
    and the planned row count only: it never holds synthetic rows."""
    plan = _plan(tmp_path, rows=10)
    p = beam.Pipeline()
    _ = (p | beam.Create(_batches(plan.schema, 1), reshuffle=False)
         | WindowedSynthesis(plan=plan, output=str(tmp_path / "day.csv"), windows_start=T0,
                             windows_end=T0 + DAY, window_seconds=DAY))
    nodes = {}

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            nodes[node.full_label.rsplit("/", 1)[-1]] = node

    p.visit(Visitor())

    def producers(node):
        return sorted(pc.producer.full_label.rsplit("/", 1)[-1] for pc in node.inputs)

    assert producers(nodes["GroupWindow"]) == ["JoinTables"]
    assert producers(nodes["JoinTables"]) == ["KeyParts", "KeyPlanned"]
    assert producers(nodes["KeyParts"]) == ["WriteParts"]


def test_failed_window_write_leaves_no_part_folder(tmp_path, monkeypatch):
    """The release step fails after every part of the window was written: the windows' part
    folders are removed (``remove_temp_folders_on_failure``) and the error is raised."""
    original = stream_mod.join_part_files
    seen = []

    def join(part_paths, parts_dir, path, write, **kw):
        assert part_paths and all(os.path.exists(p) for p in part_paths)
        seen.append(parts_dir)
        raise InjectedFault("injected failure writing a window")

    monkeypatch.setattr(stream_mod, "join_part_files", join)
    with pytest.raises(Exception, match="injected failure writing a window"):
        _run(tmp_path, _plan(tmp_path, rows=150))
    assert seen and not [p.name for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]
    assert not list(tmp_path.glob("day.*"))
    monkeypatch.setattr(stream_mod, "join_part_files", original)


def test_empty_window_gets_a_header_only_file(tmp_path):
    """A plan of 0 rows: no sampled table, still one release per window (header only). The
    CLI, API and YAML refuse ``rows=0`` (H96), so the plan's rows are set after planning."""
    plan = _plan(tmp_path, rows=1)
    _run(tmp_path, dataclasses.replace(plan, config=dataclasses.replace(plan.config, rows=0)),
         days=1)
    (f,) = tmp_path.glob("day.*.csv")
    assert f.read_text() == csv_header(NAMES)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]
    assert json.loads(Path(manifest_path(str(f))).read_text())["release"]["rows_out"] == 0
