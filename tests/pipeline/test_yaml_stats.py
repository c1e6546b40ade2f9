"""Beam YAML DP statistics (pipelines/yaml_stats.py): BeamsynthHistogram, BeamsynthMarginals and
BeamsynthCount next to BeamsynthSynthesize under one job budget."""

from __future__ import annotations

import csv
import glob
import json
from pathlib import Path

import pytest

yaml_main = pytest.importorskip(
    "apache_beam.yaml.main", reason="Beam YAML needs apache-beam[yaml] (docstring_parser, jinja2, ...)")

import apache_beam as beam  # noqa: E402

from beamsynth.pipelines import yaml_stats  # noqa: E402
from beamsynth.pipelines.yaml_transforms import job_accountant  # noqa: E402
from beamsynth.transforms.budget import BudgetExceededError  # noqa: E402
from tests.yaml_helpers import build, json_lines, provider, run_yaml  # noqa: E402

TINY = """
name: tiny
columns:
  - name: color
    type: categorical
    nullable: true
    domain: {kind: categorical, values: [red, green, blue]}
  - name: age
    type: integer
    domain: {kind: integer, low: 0, high: 99, edges: [0, 50, 100]}
"""
# every declared cell, in declared order: color's three values and its null cell, age's two bins
CELLS = [("color", "red"), ("color", "green"), ("color", "blue"), ("color", ""),
         ("age", "0"), ("age", "50")]
ROWS = "color,age\nred,3\ngreen,60\nblue,20\nred,70\n,10\npurple,5\nred,41\n"  # purple: no color


def _files(tmp_path: Path) -> tuple[str, str]:
    schema = tmp_path / "tiny.yaml"
    schema.write_text(TINY, encoding="utf-8")
    data = tmp_path / "in.csv"
    data.write_text(ROWS, encoding="utf-8")
    return str(schema), str(data)


def _spec(tmp_path: Path, *, hist_eps: float = 0.5, synth_eps: float = 0.5, seed: int = 3,
          synth_first: bool = False) -> dict:
    schema, data = _files(tmp_path)
    out = tmp_path / "out"
    job = {"epsilon": 1.0}
    hist = {"type": "BeamsynthHistogram", "name": "Hist", "input": "Read",
            "config": {"schema": schema, "columns": ["color", "age"], "epsilon": hist_eps,
                       "seed": seed, "job_budget": job, "manifest": f"{out}/hist.manifest.json",
                       "error_handling": {"output": "bad"}}}
    synth = {"type": "BeamsynthSynthesize", "name": "Synth", "input": "Read",
             "config": {"schema": schema, "epsilon": synth_eps, "rows": 5, "seed": seed,
                        "job_budget": job, "manifest": f"{out}/synth.manifest.json"}}
    steps = [synth, hist] if synth_first else [hist, synth]
    return {
        "providers": [{"include": provider()}],
        "pipeline": {"transforms": [
            {"type": "ReadFromCsv", "name": "Read",
             "config": {"path": data, "keep_default_na": False, "dtype": "str"}},
            *steps,
            {"type": "WriteToCsv", "name": "WriteHist", "input": "Hist.output",
             "config": {"path": f"{out}/hist"}},
            {"type": "WriteToJson", "name": "WriteBad", "input": "Hist.bad",
             "config": {"path": f"{out}/bad"}},
            {"type": "WriteToJson", "name": "WriteSynth", "input": "Synth",
             "config": {"path": f"{out}/synth"}},
        ]},
    }


# the seeded run's histogram (seed 3): pinned so that a change of the noise streams is seen
SEEDED_COUNTS = [3, 0, -5, 2, 0, 6]  # exact: 3 1 1 1 | 4 2; scale 4 (ε 0.25 per column)


def test_histogram_and_synthesis_in_one_yaml_pipeline(tmp_path: Path) -> None:
    run_yaml(tmp_path / "pipeline.yaml", _spec(tmp_path))
    _check_run(tmp_path / "out")


@pytest.mark.slow
def test_seeded_yaml_run_is_the_same_on_direct_multi(tmp_path: Path) -> None:
    """Worker processes (2) give the seeded run's exact rows: the noise follows the step labels,
    not the worker or bundle."""
    run_yaml(tmp_path / "pipeline.yaml", _spec(tmp_path), "--direct_running_mode=multi_processing",
             "--direct_num_workers=2")
    _check_run(tmp_path / "out")


def _check_run(out: Path) -> None:
    (hist_file,) = glob.glob(f"{out}/hist-*")
    with open(hist_file, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["column", "value", "noisy_count"]
    assert [tuple(r[:2]) for r in rows[1:]] == CELLS  # every declared cell, in declared order
    assert [int(r[2]) for r in rows[1:]] == SEEDED_COUNTS
    bad = json_lines(f"{out}/bad-*")
    assert [(b["source"], b["row"]) for b in bad] == [("Hist", None)]
    assert "color" in bad[0]["reason"] and "purple" in bad[0]["raw"]
    synth = json_lines(f"{out}/synth-*")
    assert len(synth) == 5 and set(synth[0]) == {"color", "age"}
    for name in ("hist", "synth"):
        manifest = json.loads((out / f"{name}.manifest.json").read_text(encoding="utf-8"))
        budget = manifest["release"]["budget"]
        assert budget["total"]["epsilon"] == 1.0
        spends = {s["step"]: s["epsilon"] for s in budget["spends"]}
        assert set(spends) == {"Hist/histogram", "Synth/independent.marginals"}
        assert sum(spends.values()) == pytest.approx(1.0)
        assert manifest["release"]["randomness"] == "seeded: not for release"
        ops = manifest["operational"]
        assert (ops["rows_read"], ops["rows_used"], ops["rows_rejected"]) == (7, 6, 1)
    hist_manifest = json.loads((out / "hist.manifest.json").read_text(encoding="utf-8"))
    assert hist_manifest["release"]["rows_out"] == len(CELLS)
    assert hist_manifest["release"]["details"]["step_budget"]["spent"]["epsilon"] == 0.5


@pytest.mark.parametrize("synth_first", [False, True])
def test_over_budget_yaml_pipeline_is_refused_when_built(tmp_path: Path, synth_first: bool) -> None:
    with pytest.raises(ValueError) as err:
        build(_spec(tmp_path, hist_eps=0.6, synth_eps=0.6, synth_first=synth_first))
    assert isinstance(err.value.__cause__, BudgetExceededError)
    late, early = ("Hist", "Synth/independent.marginals") if synth_first else ("Synth", "Hist/histogram")
    assert f"step '{late}' asks for ε=0.6" in str(err.value)
    assert f"already spent: {early} ε=0.6" in str(err.value)
    p = build(_spec(tmp_path, hist_eps=0.4, synth_eps=0.6, synth_first=synth_first))
    assert job_accountant(p).spent_epsilon == pytest.approx(1.0)
    assert not (tmp_path / "out").exists()  # built only: nothing written


def test_config_is_checked_in_the_steps_words(tmp_path: Path) -> None:
    schema, _ = _files(tmp_path)
    with pytest.raises(ValueError, match=r"BeamsynthHistogram: unknown config key 'colums' \(did you "
                                         r"mean 'columns'\?\)"):
        yaml_stats.Histogram(schema=schema, epsilon=1.0, colums=["age"])
    with pytest.raises(ValueError, match=r"BeamsynthHistogram: column: 'colour' is not a declared "
                                         r"column of schema 'tiny' \(did you mean 'color'\?"):
        yaml_stats.Histogram(schema=schema, epsilon=1.0, column="colour")
    with pytest.raises(ValueError, match="give column: NAME or columns"):
        yaml_stats.Histogram(schema=schema, epsilon=1.0, column="age", columns=["age"])
    with pytest.raises(ValueError, match=r"BeamsynthMarginals: config needs marginals"):
        yaml_stats.Marginals(schema=schema, epsilon=1.0)
    with pytest.raises(ValueError, match=r"BeamsynthCount: epsilon \(ε=1.5\) exceeds the declared job_budget"):
        yaml_stats.Count(schema=schema, epsilon=1.5, job_budget={"epsilon": 1.0})
    with pytest.raises(ValueError, match="error_handling output; rename one"):
        yaml_stats.Marginals(schema=schema, epsilon=1.0, marginals={"bad": ["age"]},
                             error_handling={"output": "bad"})


def test_statistics_steps_share_one_job_seed_and_unit(tmp_path: Path) -> None:
    schema, _ = _files(tmp_path)
    p = beam.Pipeline()
    rows = p | beam.Create([beam.Row(color="red", age="3", pid="a")])
    job = {"epsilon": 1.0}
    _ = rows | "A" >> yaml_stats.Count(schema=schema, epsilon=0.3, seed=1, job_budget=job)
    with pytest.raises(ValueError, match=r"seed 2 differs from step 'A'"):
        _ = rows | "B" >> yaml_stats.Count(schema=schema, epsilon=0.3, seed=2, job_budget=job)
    with pytest.raises(ValueError, match=r"BeamsynthCount 'C': privacy unit \(privacy_id='pid'"):
        _ = rows | "C" >> yaml_stats.Count(schema=schema, epsilon=0.3, seed=1, job_budget=job,
                                           privacy_id="pid", max_contributions=2)


def test_marginals_and_count_release_every_declared_cell_and_window(tmp_path: Path) -> None:
    """Declared windows: one release per window, the empty one included; marginals: every
    declared cell of each table (shape public)."""
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    schema, _ = _files(tmp_path)
    stamped = [(beam.Row(color="red", age="3"), 10), (beam.Row(color="blue", age="70"), 20),
               (beam.Row(color="green", age="7"), 7300)]  # windows [0, 3600) and [7200, 10800)
    windows = {"start": 0, "end": 3 * 3600, "size": 3600}
    with TestPipeline() as p:
        rows = (p | beam.Create(stamped)
                | beam.MapTuple(lambda r, t: beam.window.TimestampedValue(r, t)))
        job = {"epsilon": 1.0}
        counts = rows | "Count" >> yaml_stats.Count(schema=schema, epsilon=0.4, seed=1,
                                                    windows=windows, job_budget=job,
                                                    manifest=str(tmp_path / "count.json"))
        tables = rows | "Tables" >> yaml_stats.Marginals(
            schema=schema, epsilon=0.6, seed=1, windows=windows, job_budget=job,
            marginals=[["color", "age"], ["age"]])
        assert set(tables) == {"color_by_age", "age"}
        assert counts.element_type._fields[0][0] == "window_start"
        assert_that(counts | "Starts" >> beam.Map(lambda r: r.window_start)
                    | "GlobalStarts" >> beam.WindowInto(beam.window.GlobalWindows()),
                    equal_to(["1970-01-01T00:00:00Z", "1970-01-01T01:00:00Z",
                              "1970-01-01T02:00:00Z"]), label="one count per declared window")
        cells = [(c, a) for c in ("red", "green", "blue", None) for a in (0, 50)]
        assert_that(tables["color_by_age"] | "Cells" >> beam.Map(lambda r: (r.color, r.age))
                    | "GlobalCells" >> beam.WindowInto(beam.window.GlobalWindows()),
                    equal_to(cells * 3), label="every cell in every window")
    manifest = json.loads((tmp_path / "count.json").read_text(encoding="utf-8"))  # one per run
    assert manifest["release"]["rows_out"] == 3 and manifest["operational"]["rows_used"] == 3
    assert [s["step"] for s in manifest["release"]["budget"]["spends"]] == ["Count/count",
                                                                          "Tables/marginals"]


def test_prefixes_step_releases_keys_and_tree_of_a_declared_text_key(tmp_path: Path) -> None:
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    schema, _ = _files(tmp_path)
    words = ["ab", "ab", "abc", "b", "ba", "abcabc"]  # the last one: a dead letter
    key = {"kind": "text", "column": "word", "alphabet": "abc", "max_length": 3}
    with pytest.raises(ValueError, match=r"BeamsynthPrefixes: key: unknown fields for a text key: "
                                         r"\['colum'\]"):
        yaml_stats.Prefixes(schema=schema, epsilon=1.0, key={"kind": "text", "colum": "word"})
    with pytest.raises(ValueError, match=r"discount: 'skip' is not used by method: basic"):
        yaml_stats.Prefixes(schema=schema, epsilon=1.0, key=key, method="basic", discount="skip")
    with TestPipeline() as p:
        rows = p | beam.Create([beam.Row(color="red", age="3", word=w) for w in words])
        out = rows | "Words" >> yaml_stats.Prefixes(
            schema=schema, epsilon=2.0, key=key, seed=4, error_handling={"output": "bad"},
            manifest=str(tmp_path / "prefixes.json"))
        assert set(out) == {"keys", "tree", "bad"}
        assert [f for f, _ in out["keys"].element_type._fields] == ["word"]
        assert_that(out["keys"] | beam.Map(lambda r: set(r.word) <= set("abc") and len(r.word) <= 3)
                    | beam.Distinct(), equal_to([True]), label="declared keys only")
        assert_that(out["bad"] | beam.Map(lambda r: r.reason.startswith("key 'word': length 6")), equal_to([True]),
                    label="one dead letter")
    manifest = json.loads((tmp_path / "prefixes.json").read_text(encoding="utf-8"))
    (spend,) = manifest["release"]["budget"]["spends"]
    assert spend["step"] == "prefixes" and spend["epsilon"] == 2.0  # the step alone: its own
    assert manifest["operational"]["rows_rejected"] == 1 and manifest["operational"]["rows_used"] == 5


def test_manifest_of_a_stream_is_refused_when_built(tmp_path: Path) -> None:
    """A stream's exact counts are never final: one run manifest would never be written."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.testing.test_stream import TestStream

    schema, _ = _files(tmp_path)
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    p = beam.Pipeline(options=options)
    rows = p | TestStream().add_elements([beam.Row(color="red", age="3")])
    windows = {"start": 0, "end": 3600, "size": 3600}
    _ = rows | "Plain" >> yaml_stats.Count(schema=schema, epsilon=0.5, windows=windows,
                                           job_budget={"epsilon": 1.0})
    with pytest.raises(ValueError, match=r"BeamsynthCount 'Counted': manifest needs a bounded input"):
        _ = rows | "Counted" >> yaml_stats.Count(schema=schema, epsilon=0.5, windows=windows,
                                                 job_budget={"epsilon": 1.0},
                                                 manifest=str(tmp_path / "m.json"))


def test_statistics_and_synthesis_steps_without_job_budget_are_refused(tmp_path: Path) -> None:
    from beamsynth.pipelines.yaml_transforms import Synthesize

    schema, _ = _files(tmp_path)
    p = beam.Pipeline()
    rows = p | beam.Create([beam.Row(color="red", age="3")])
    _ = rows | "Hist" >> yaml_stats.Histogram(schema=schema, epsilon=0.3, column="color")
    with pytest.raises(ValueError, match=r"^beamsynth steps \['Hist', 'Synth'\] run in one pipeline"):
        _ = rows | "Synth" >> Synthesize(schema=schema, epsilon=0.3, rows=5)


def test_a_step_without_a_manifest_says_its_spends_are_recorded_nowhere(tmp_path: Path, caplog) -> None:
    """A YAML step without `manifest:` spent its ε with no record in any file, silently (the API
    warns for a job without bs.WriteManifest): each step now says so when built; with a manifest
    it does not."""
    from beamsynth.pipelines.yaml_transforms import Synthesize

    schema = tmp_path / "tiny.yaml"
    schema.write_text(TINY, encoding="utf-8")
    with caplog.at_level("WARNING", logger="beamsynth.pipelines.yaml_transforms"):
        yaml_stats.Histogram(schema=str(schema), epsilon=0.3, column="age")
        Synthesize(schema=str(schema), epsilon=0.5, rows=5)
    notes = [r.getMessage() for r in caplog.records if "no manifest" in r.getMessage()]
    assert len(notes) == 2 and "ε=0.3" in notes[0] and "ε=0.5" in notes[1], notes
    caplog.clear()
    with caplog.at_level("WARNING", logger="beamsynth.pipelines.yaml_transforms"):
        yaml_stats.Histogram(schema=str(schema), epsilon=0.3, column="age",
                             manifest=str(tmp_path / "m.json"))
    assert "no manifest" not in caplog.text
