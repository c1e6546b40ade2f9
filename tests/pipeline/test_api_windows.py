"""The public API per declared window: one release per declared window (empty ones included),
``window_start`` on every output row, per-window spends in the manifest; undeclared windowing,
triggers that fire twice and mixed windowings refused when the pipeline is built; Beam's stock
DaskRunner refused and beamsynth's accepted (build time only: runs are in test_api_dask.py)."""

from __future__ import annotations

import json
import random

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger

import beamsynth as bs

DAY = 86_400
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z
DAYS = ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"]
WINDOWS = bs.DeclaredWindows(start=T0, end=T0 + 3 * DAY, size=DAY)
SCHEMA = bs.load_schema({
    "name": "toy",
    "columns": [
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}},
        {"name": "city", "type": "categorical", "nullable": True,
         "domain": {"kind": "categorical", "values": ["Oslo", "Rome", "Lima"]}},
    ],
})
NAME = bs.TextKey(column="name", alphabet="abc", max_length=3)


def _opts() -> PipelineOptions:
    return PipelineOptions(["--runner=beamsynth.runners.local.LocalDirectRunner"])


def _stamped(n: int = 60) -> list[beam.window.TimestampedValue]:
    """Records on days 1 and 3 (day 2 is empty), one stamped before the declared range."""
    rnd = random.Random(5)
    out = [beam.window.TimestampedValue(
        {"sex": rnd.choice("FM"), "city": rnd.choice(["Oslo", "Rome", "Lima", None]),
         "name": rnd.choice(["ab", "abc", "c"]), "line": i + 1}, T0 + (0 if i % 2 else 2) * DAY + i)
        for i in range(n)]
    out.append(beam.window.TimestampedValue({"sex": "F", "city": "Oslo", "name": "a", "line": 999},
                                            T0 - 1))
    return out


def _per_window(pcoll, label: str):
    """window_start → number of rows."""
    return (pcoll | f"{label}Key" >> beam.Map(lambda r: r.window_start)
            | f"{label}Global" >> beam.WindowInto(beam.window.GlobalWindows())
            | f"{label}N" >> beam.combiners.Count.PerElement())


def test_every_mechanism_releases_once_per_declared_window_empty_one_included(tmp_path):
    job = bs.PrivacyJob(epsilon=50.0, seed=11)
    with beam.Pipeline(options=_opts()) as p:
        stamped = p | beam.Create(_stamped()) | "Stamp" >> beam.Map(lambda tv: tv)
        private = stamped | job.private(SCHEMA, keys={"name": NAME}, position_field="line",
                                        windows=WINDOWS)
        assert_that(private.dead_letters | beam.Map(lambda d: (d.position, d.reason)), equal_to([
            (999, "timestamp 2023-12-31T23:59:59Z is outside the declared windows [2024-01-01T00:00:00Z, "
                  "2024-01-04T00:00:00Z)")]), label="OutsideIsADeadLetter")
        count = private | bs.Count(epsilon=5.0)
        assert_that(count | "CountWindows" >> beam.Map(lambda r: (r.window_start, tuple(r._asdict()))),
                    equal_to([(d, ("window_start", "noisy_count")) for d in DAYS]), label="Counts")
        cells = (private | bs.Marginals(marginals=[("sex", "city")], epsilon=5.0))["sex,city"]
        assert_that(_per_window(cells, "Cells"), equal_to([(d, 8) for d in DAYS]), label="Cells")
        hist = private | bs.Histogram(column="city", epsilon=5.0, tolerance=0.5, typed=True)
        assert_that(hist | beam.Map(lambda h, w=beam.DoFn.WindowParam: w.start.micros // 10**6)
                    | beam.WindowInto(beam.window.GlobalWindows()),
                    equal_to([T0, T0 + DAY, T0 + 2 * DAY]), label="OneHistogramPerDay")
        synth = private | bs.IndependentSynthesis(epsilon=5.0, rows=4)
        assert_that(_per_window(synth, "Synth"), equal_to([(d, 4) for d in DAYS]), label="Synth")
        _ = (cells | beam.Map(lambda r: r._asdict())
             | beam.io.WriteToParquet(str(tmp_path / "cells"), bs.arrow_schema(cells),
                                      shard_name_template="", file_name_suffix=".parquet"))
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "manifest.json"))
    table = pq.read_table(tmp_path / "cells.parquet")
    assert table.column_names == ["window_start", "sex", "city", "noisy_count"]
    assert sorted(set(table.column("window_start").to_pylist())) == DAYS
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    windows = manifest["release"]["details"]["windows"]
    assert windows["declared"] == {"start": DAYS[0], "end": "2024-01-04T00:00:00Z",
                                   "window_seconds": DAY}
    steps = ["Count", "Marginals", "Histogram[city]", "Synthesize[independent]/independent.marginals"]
    assert [w["start"] for w in windows["per_window"]] == DAYS
    for w in windows["per_window"]:
        assert [s["step"] for s in w["spends"]] == steps
        assert sum(s["epsilon"] for s in w["spends"]) == pytest.approx(20.0)
    assert manifest["operational"]["sources"]["MakePrivate(toy)"] == {
        "read": 61, "rejected": 1, "dropped_by_bound": 0, "used": 60}


@pytest.mark.slow
def test_correlated_synthesizers_and_prefix_trees_release_once_per_declared_window():
    job = bs.PrivacyJob(epsilon=200.0, delta=1e-4, seed=11)
    with beam.Pipeline(options=_opts()) as p:
        private = p | beam.Create(_stamped()) | "Stamp" >> beam.Map(lambda tv: tv) | job.private(
            SCHEMA, keys={"name": NAME}, windows=WINDOWS)
        private.dead_letters | "Bad" >> beam.Map(print)
        for name, t in [("pb", bs.PrivBayes(epsilon=5.0, rows=4)),
                        ("sbhg", bs.SBHG(epsilon=5.0, delta=1e-6, rows=4))]:
            assert_that(_per_window(private | t, name), equal_to([(d, 4) for d in DAYS]), label=name)
        for method in ("direct", "basic", "improved"):
            levels = private | f"Tree[{method}]" >> bs.PrefixTree(
                key="name", epsilon=5.0, method=method, typed=True)
            # LevelRelease per level with candidates, per declared window: which levels exist is
            # post-processing of noisy counts, so an empty window may show none (improved does)
            days = (levels | f"{method}Day" >> beam.Map(
                        lambda r, w=beam.DoFn.WindowParam: int(w.start.micros // 10**6))
                    | f"{method}Global" >> beam.WindowInto(beam.window.GlobalWindows())
                    | f"{method}Days" >> beam.Distinct())
            assert_that(days, lambda got: {T0, T0 + 2 * DAY} <= set(got) <= {T0, T0 + DAY, T0 + 2 * DAY}
                        or pytest.fail(f"levels in windows {sorted(got)}"), label=f"{method}Levels")


def test_undeclared_windows_triggers_and_mixed_windowings_are_refused_when_built():
    p = beam.Pipeline(options=_opts())
    plain = p | "Plain" >> beam.Create([{"sex": "F"}])
    fixed = plain | "Fixed" >> beam.WindowInto(beam.window.FixedWindows(DAY))
    with pytest.raises(ValueError) as err:
        _ = fixed | "A" >> bs.PrivacyJob(epsilon=1.0).private(SCHEMA)
    assert str(err.value) == (
        "A: the input is windowed (FixedWindows); the beamsynth API releases over the global window "
        "only, or once per declared window: pass windows=bs.DeclaredWindows(start=..., end=..., "
        "size=...) to job.private on timestamped input in the global window (docs/beam-api.md, "
        "docs/streaming.md)")
    with pytest.raises(ValueError) as err:  # declared windows do not bless other windowing
        _ = fixed | "B" >> bs.PrivacyJob(epsilon=1.0).private(SCHEMA, windows=WINDOWS)
    assert str(err.value).startswith("B: the input is windowed (FixedWindows); ")
    counted = plain | "Counted" >> beam.WindowInto(
        WINDOWS, trigger=trigger.Repeatedly(trigger.AfterCount(10)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING)
    with pytest.raises(ValueError) as err:
        _ = counted | "C" >> bs.PrivacyJob(epsilon=1.0).private(SCHEMA)
    assert str(err.value).startswith(
        "C: trigger Repeatedly(AfterCount(10)) (allowed lateness 0s) can fire more than once per "
        "window, so the number of releases would depend on the data")
    declared = plain | "Declared" >> beam.WindowInto(WINDOWS)  # windowed upstream: accepted
    assert (declared | "W" >> bs.PrivacyJob(epsilon=1.0).private(SCHEMA)).windows == WINDOWS
    plain = beam.Pipeline(options=_opts()) | "Plain" >> beam.Create([{"sex": "F"}])  # one job each
    job = bs.PrivacyJob(epsilon=1.0)
    _ = plain | "D" >> job.private(SCHEMA, windows=WINDOWS)
    with pytest.raises(ValueError) as err:
        _ = plain | "E" >> job.private(SCHEMA)
    assert str(err.value) == (
        "E: windowing the global window differs from the job's other private collections "
        "(DeclaredWindows(start=1704067200, end=1704326400, size=86400)); the job's ε is per "
        "declared window, so every input of one job uses the same windows")
    with pytest.raises(TypeError) as err:
        job.private(SCHEMA, windows=beam.window.FixedWindows(DAY))
    assert str(err.value).startswith("windows must be None or bs.DeclaredWindows(start=, end=, "
                                     "size=), got FixedWindows")


def test_stock_dask_runner_is_refused_and_beamsynths_accepted_when_built():
    pytest.importorskip("dask", reason="pip install 'beamsynth[dask]'")
    stock = beam.Pipeline(options=PipelineOptions(
        ["--runner=apache_beam.runners.dask.dask_runner.DaskRunner"]))
    with pytest.raises(ValueError) as err:
        _ = stock | beam.Create([{"sex": "F"}]) | bs.PrivacyJob(epsilon=1.0).private(SCHEMA)
    assert str(err.value) == (
        "MakePrivate(toy): the beamsynth API emits each bundle's last batch from finish_bundle, "
        "whose output Beam's DaskRunner drops (docs/runners.md); use beamsynth's DaskRunner "
        "(--runner dask, beamsynth.runners.dask_runner.DaskRunner), or the direct, flink, spark or "
        "dataflow runner")
    ours = beam.Pipeline(options=bs.pipeline_options(["--runner", "dask"]))
    private = ours | beam.Create([{"sex": "F"}]) | bs.PrivacyJob(epsilon=1.0).private(SCHEMA)
    assert private.windows is None
    with pytest.raises(ValueError) as err:
        _ = ours | "W" >> beam.Create([{"sex": "F"}]) | "P" >> bs.PrivacyJob(epsilon=1.0).private(
            SCHEMA, windows=WINDOWS)
    assert str(err.value).startswith("P: declared windows were not tested on the DaskRunner")


@pytest.mark.slow
def test_seeded_windowed_release_is_the_same_on_two_processes(tmp_path):
    def run(args: list[str], folder) -> list[str]:
        job = bs.PrivacyJob(epsilon=30.0, seed=11)
        with beam.Pipeline(options=bs.pipeline_options(args)) as p:
            private = (p | beam.Create(_stamped()) | "Stamp" >> beam.Map(lambda tv: tv)
                       | job.private(SCHEMA, windows=WINDOWS))
            private.dead_letters | "Bad" >> beam.Map(print)
            outs = [private | bs.Count(epsilon=10.0),
                    (private | bs.Marginals(marginals=[("sex", "city")], epsilon=10.0))["sex,city"],
                    private | bs.IndependentSynthesis(epsilon=10.0, rows=5)]
            _ = (outs | beam.Flatten() | beam.Map(lambda r: json.dumps(r._asdict()))
                 | beam.io.WriteToText(str(folder / "rows"), shard_name_template=""))
        return sorted((folder / "rows").read_text().splitlines())

    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = run([], tmp_path / "one")
    assert one == run(["--runner", "direct-multi", "--direct_num_workers=2"], tmp_path / "two")
    assert len(one) == 3 * (1 + 8 + 5)
