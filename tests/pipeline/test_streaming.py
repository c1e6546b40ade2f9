"""Streaming: three days of records through TestStream, one DP release per daily window."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections import Counter
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing import test_stream as beam_test_stream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger
from apache_beam.transforms import window as beam_window

from beamsynth.pipelines.methods.plausible import PlausibleMethod
from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis
from beamsynth.pipelines.stream import (
    DAY,
    EMPTY_WINDOW_METHODS,
    WindowedSynthesis,
    WindowHeartbeat,
    window_output_path,
)
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.cathist import DPCategoricalHistogram
from beamsynth.transforms.measure import DPMarginals
from beamsynth.transforms.privbayes import DPPrivBayes
from beamsynth.transforms.synthesis import DPCount
from beamsynth.transforms.windows import DeclaredWindows

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"  # bundled
T0 = int(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp())
K = 2
DECLARED = {"windows_start": T0, "windows_end": T0 + 3 * DAY}  # three public days


def _plan(tmp_path: Path, method: str = "independent", delta: float = 0.0):
    cfg = SynthesisConfig(input="stream", schema=load_schema("adult"), output=str(tmp_path / "day.csv"),
                          epsilon=2.0, delta=delta, seed=11, privacy_id="pid", max_contributions=K,
                          shard_rows=400, method=method)
    return plan_synthesis(cfg)


def _days(schema):
    """Three days of 900 Adult rows; pid 'traveller' has 5 rows every day; one late batch."""
    if not ADULT.exists():
        pytest.skip(f"example data not found: {ADULT}")
    df = pd.read_csv(ADULT, nrows=2800, dtype=str, keep_default_na=False)
    cols = {c: df[c].astype(object) for c in schema.names}
    cols["pid"] = pd.Series(["p"] * len(df), dtype=object)  # replaced per day below
    batch, bad = schema.encode_columns(cols, len(df))
    assert bad == []
    days = []
    for d in range(3):
        codes = batch.codes[d * 900:(d + 1) * 900]
        pids = np.array([f"d{d}u{i // 3}" for i in range(900)], dtype=object)
        pids[:5] = "traveller"
        days.append(EncodedBatch(codes, pids))
    late = EncodedBatch(batch.codes[2700:2760], np.array([f"late{i}" for i in range(60)], dtype=object))
    return days, late


def _streaming_options() -> PipelineOptions:
    options = PipelineOptions(["--direct_running_mode=in_memory"])
    options.view_as(StandardOptions).streaming = True
    return options


def _kept_rows(b: EncodedBatch) -> int:
    return int(sum(min(c, K) for c in Counter(b.pids.tolist()).values()))


def test_three_days_give_three_releases_with_own_budget_and_manifest(tmp_path):
    plan = _plan(tmp_path)
    days, late = _days(plan.schema)
    stream = beam_test_stream.TestStream().advance_watermark_to(T0)
    for d, b in enumerate(days):
        half = len(b) // 2  # two batches a day, arriving in order within the day
        stream = stream.add_elements([
            beam_window.TimestampedValue(EncodedBatch(b.codes[:half], b.pids[:half]), T0 + d * DAY + 3600),
            beam_window.TimestampedValue(EncodedBatch(b.codes[half:], b.pids[half:]), T0 + d * DAY + 7200),
        ]).advance_watermark_to(T0 + (d + 1) * DAY + 1)
    # a batch stamped on day 1 arriving after day 1 was released: late
    stream = stream.add_elements([beam_window.TimestampedValue(late, T0 + 5000)])
    stream = stream.advance_watermark_to_infinity()

    options = PipelineOptions(["--direct_running_mode=in_memory"])
    options.view_as(StandardOptions).streaming = True
    expected_budget = plan.accountant.to_dict()
    with beam.Pipeline(options=options) as p:
        out = p | stream | WindowedSynthesis(plan=plan, output=str(tmp_path / "day.csv"), **DECLARED)
        releases = out["releases"] | "GlobalReleases" >> beam.WindowInto(beam_window.GlobalWindows())
        late_counts = out["late"] | "GlobalLate" >> beam.WindowInto(beam_window.GlobalWindows())
        per_window = (
            out["batches"]
            | "PidCounts" >> beam.Map(
                lambda b, w=beam.DoFn.WindowParam: (int(w.start), dict(Counter(b.pids.tolist()))))
            | "GlobalCounts" >> beam.WindowInto(beam_window.GlobalWindows()))

        def check_releases(rs):
            assert sorted(r.start for r in rs) == [
                "2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"]
            for r in rs:
                assert r.budget == expected_budget
                assert r.end[:10] > r.start[:10]
                lines = Path(r.synthetic).read_text().splitlines()
                assert lines[0] == ",".join(plan.schema.names)
                assert len(lines) - 1 == r.rows_out
                assert 400 < r.rows_out < 800  # DP count of ~606 kept rows (ε=0.1, k=2: scale 20)
                m = json.loads(Path(r.manifest).read_text())
                assert m["release"]["budget"] == expected_budget
                assert m["release"]["details"]["window"] == {"start": r.start, "end": r.end}
                assert m["release"]["privacy_unit"]["per"] == "window"

        def check_late(ls):
            assert [(x.start, x.late_rows) for x in ls] == [("2024-01-01T00:00:00Z", len(late))]

        def check_bounding(items):
            totals: dict[int, Counter] = {}
            for start, counts in items:
                totals.setdefault(start, Counter()).update(counts)
            assert sorted(totals) == [T0, T0 + DAY, T0 + 2 * DAY]
            for d, start in enumerate(sorted(totals)):
                counts = totals[start]
                assert max(counts.values()) <= K  # bounded per window
                assert counts["traveller"] == K  # ...so a unit in 3 windows contributes 3·k
                assert sum(counts.values()) == _kept_rows(days[d])  # the late batch is not in
                assert not any(pid.startswith("late") for pid in counts)

        assert_that(releases, check_releases, label="Releases")
        assert_that(late_counts, check_late, label="Late")
        assert_that(per_window, check_bounding, label="Bounding")

    files = sorted(f.name for f in tmp_path.glob("day.*.csv"))
    assert files == ["day.20240101T000000Z.csv", "day.20240102T000000Z.csv", "day.20240103T000000Z.csv"]


def test_window_output_path_inserts_the_window_start():
    w = beam_window.IntervalWindow(T0 + DAY, T0 + 2 * DAY)
    assert window_output_path("/x/out.csv", w) == "/x/out.20240102T000000Z.csv"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window_seconds": 0}, "window_seconds (0) must be an int >= 1"),
        ({"allowed_lateness": -1}, "allowed_lateness (-1) must be an int >= 0"),
        ({"output": "/x/out.parquet"}, "output ('/x/out.parquet') must be a .csv path"),
        ({"windows_start": T0 + 5}, f"windows_start ({T0 + 5}) must be a multiple of window_seconds"),
        ({"windows_end": T0}, f"windows_end ({T0}) must be after windows_start ({T0})"),
        ({"windows_start": dt.datetime(2024, 1, 1)}, "must be timezone-aware"),
    ],
)
def test_windowed_synthesis_validates(kwargs, message, tmp_path):
    args = {"plan": _plan(tmp_path), "output": str(tmp_path / "day.csv"), **DECLARED, **kwargs}
    with pytest.raises(ValueError) as err:
        WindowedSynthesis(**args)
    assert message in str(err.value)


def _run_days(plan, days, folder: Path, pieces: int, reverse: bool) -> dict[str, str]:
    """Stream the days cut into ``pieces`` batches each (optionally in reverse order within a
    day); return {file name: content} of the per-window synthetic files."""
    stream = beam_test_stream.TestStream().advance_watermark_to(T0)
    for d, b in enumerate(days):
        cuts = np.array_split(np.arange(len(b)), pieces)
        events = [beam_window.TimestampedValue(EncodedBatch(b.codes[c], b.pids[c]), T0 + d * DAY + 60 * i)
                  for i, c in enumerate(cuts)]
        stream = stream.add_elements(events[::-1] if reverse else events)
        stream = stream.advance_watermark_to(T0 + (d + 1) * DAY + 1)
    stream = stream.advance_watermark_to_infinity()
    folder.mkdir()
    with beam.Pipeline(options=_streaming_options()) as p:
        _ = p | stream | WindowedSynthesis(plan=plan, output=str(folder / "day.csv"), **DECLARED)
    return {f.name: f.read_text() for f in sorted(folder.glob("day.*.csv"))}


@pytest.mark.slow
def test_seeded_windows_do_not_depend_on_batching_or_arrival_order(tmp_path):
    plan = _plan(tmp_path)
    days, _ = _days(plan.schema)
    a = _run_days(plan, days, tmp_path / "a", pieces=2, reverse=False)
    b = _run_days(plan, days, tmp_path / "b", pieces=5, reverse=True)
    assert len(a) == 3 and all(len(text.splitlines()) > 400 for text in a.values())
    assert a == b


# -- declared windows: the set of releases does not depend on the data --------------------------
def _random_batch(shape, n: int, tag: str, seed: int) -> EncodedBatch:
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, s, n) for s in shape], axis=1).astype(np.int32)
    return EncodedBatch(codes, np.array([f"{tag}{i}" for i in range(n)], dtype=object))


DAYS = ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"]


def _check_releases(releases) -> None:
    assert sorted(r.start for r in releases) == DAYS
    for r in releases:  # every release, empty windows included, is a full file
        lines = Path(r.synthetic).read_text().splitlines()
        assert lines[0].startswith("age,") and len(lines) - 1 == r.rows_out


def _check_outside(outside) -> None:
    assert [(o.timestamp, o.rows) for o in outside] == [("2024-01-10T00:01:00Z", 5)]


def _stream_releases(plan, folder: Path, with_alice: bool) -> dict[str, dict]:
    """Day 1: 40 records; day 2: only Alice's one record (or nothing); day 3: nothing; plus a
    5-record batch stamped after the declared days (checked: dropped and counted). Returns
    {file name: manifest}."""
    shape = plan.schema.shape
    stream = beam_test_stream.TestStream().advance_watermark_to(T0)
    stream = stream.add_elements([beam_window.TimestampedValue(_random_batch(shape, 40, "u", 1), T0 + 60)])
    stream = stream.advance_watermark_to(T0 + DAY + 1)
    if with_alice:
        stream = stream.add_elements([beam_window.TimestampedValue(_random_batch(shape, 1, "alice", 2),
                                                                   T0 + DAY + 60)])
    stream = stream.advance_watermark_to(T0 + 2 * DAY + 1)
    stream = stream.add_elements([beam_window.TimestampedValue(_random_batch(shape, 5, "x", 3),
                                                               T0 + 9 * DAY + 60)])
    stream = stream.advance_watermark_to_infinity()
    folder.mkdir()
    with beam.Pipeline(options=_streaming_options()) as p:
        out = p | stream | WindowedSynthesis(plan=plan, output=str(folder / "day.csv"), **DECLARED)
        for name, check in (("releases", _check_releases), ("outside", _check_outside)):
            glob = out[name] | f"Global{name}" >> beam.WindowInto(beam_window.GlobalWindows())
            assert_that(glob, check, label=f"Check{name}")
    return {f.name: json.loads(f.read_text()) for f in sorted(folder.glob("day.*.manifest.json"))}


def _public_shape(manifest: dict) -> dict:
    """What a manifest says about which window was released and at what cost."""
    rel = manifest["release"]
    return {"window": rel["details"]["window"], "declared": rel["details"]["declared_windows"],
            "budget": rel["budget"], "privacy_unit": rel["privacy_unit"]}


@pytest.mark.parametrize("method", EMPTY_WINDOW_METHODS)
def test_released_windows_do_not_depend_on_one_unit(method, tmp_path):
    """Neighbours: Alice's one record is the only record of day 2. With and without her, the same
    declared windows are released, with the same files and manifest entries; the empty day 3 is
    released too; a record after the declared range is dropped and counted, never released."""
    plan = _plan(tmp_path, method)
    with_m = _stream_releases(plan, tmp_path / "with", with_alice=True)
    without_m = _stream_releases(plan, tmp_path / "without", with_alice=False)
    assert sorted(with_m) == sorted(without_m) == [
        f"day.2024010{d}T000000Z.csv.manifest.json" for d in (1, 2, 3)]
    assert {k: _public_shape(m) for k, m in with_m.items()} == {
        k: _public_shape(m) for k, m in without_m.items()}
    assert sorted(f.name for f in (tmp_path / "with").iterdir()) == sorted(
        f.name for f in (tmp_path / "without").iterdir())
    assert not list((tmp_path / "with").glob("day.20240110*"))  # outside: no window opened


def test_empty_declared_windows_get_noisy_measurements():
    """Windows holding only the heartbeat: DPCount, DPMarginals and PrivBayes each emit one noisy
    result per declared window (CombineFns on empty input + noise), never nothing."""
    schema = load_schema("adult")
    shape, names = schema.shape, schema.names
    with beam.Pipeline() as p:
        hb = (p | WindowHeartbeat(schema=schema, windows_start=T0, windows_end=T0 + 3 * DAY,
                                  window_seconds=DAY)
              | beam.WindowInto(DeclaredWindows(start=T0, end=T0 + 3 * DAY, size=DAY)))
        counts = hb | DPCount(budget=PureDP(epsilon=0.1), max_contributions=K, seed=5)
        marginals = hb | DPMarginals(specs=[(0,), (1,)], shape=shape, names=names,
                                     budgets=[PureDP(epsilon=0.5)] * 2, max_contributions=K, seed=5)
        models = hb | DPPrivBayes(schema=schema, budget=PureDP(epsilon=1.0), max_contributions=K,
                                  seed=5)
        windows = beam.Map(lambda x, w=beam.DoFn.WindowParam: (int(w.start), x))

        def check_counts(items):
            assert sorted(s for s, _ in items) == [T0, T0 + DAY, T0 + 2 * DAY]
            assert all(c.scale == K / 0.1 for _, c in items)
            assert any(c.value != 0 for _, c in items)  # noisy, not a hidden exact zero

        def check_marginals(items):
            assert sorted(s for s, _ in items) == [T0, T0 + DAY, T0 + 2 * DAY]
            assert all(any(np.any(m.values != 0) for m in ms) for _, ms in items)

        def check_models(items):
            assert sorted(s for s, _ in items) == [T0, T0 + DAY, T0 + 2 * DAY]

        assert_that(counts | "WinCounts" >> windows, check_counts, label="Counts")
        assert_that(marginals | "WinMarginals" >> windows, check_marginals, label="Marginals")
        assert_that(models | "WinModels" >> windows, check_models, label="Models")


@pytest.mark.parametrize("method", ["sbhg", "plausible"])
def test_methods_that_skip_empty_windows_are_refused(method, tmp_path):
    """sbhg's hashed counts and plausible's split skip empty input: no release for an empty
    window would reveal that it was empty, so they are refused when the pipeline is built."""
    plan = _plan(tmp_path, "sbhg", delta=1e-6)
    if method == "plausible":  # planning plausible needs many options; the refusal is by name
        plan = dataclasses.replace(plan, method=PlausibleMethod.__new__(PlausibleMethod))
    with pytest.raises(ValueError) as err:
        WindowedSynthesis(plan=plan, output=str(tmp_path / "day.csv"), **DECLARED)
    assert f"method {method!r} cannot release an empty window" in str(err.value)


# -- release steps refuse windows that open on data, and data-driven triggers ------------------
_DECLARED = DeclaredWindows(start=T0, end=T0 + 3 * DAY, size=DAY)


@pytest.mark.parametrize(
    ("window_into", "message"),
    [
        (beam.WindowInto(beam_window.FixedWindows(DAY)),
         "DPCount/CountRows: input is windowed with FixedWindows(size=86400s); a release per window"),
        (beam.WindowInto(beam_window.SlidingWindows(DAY, 3600)),
         "input is windowed with SlidingWindows(size=86400s, period=3600s)"),
        (beam.WindowInto(beam_window.Sessions(600)), "input is windowed with Sessions(gap=600s)"),
        (beam.WindowInto(beam_window.GlobalWindows(), trigger=trigger.Repeatedly(trigger.AfterCount(10)),
                         accumulation_mode=trigger.AccumulationMode.DISCARDING),
         "DPCount/CountRows: trigger Repeatedly(AfterCount(10))"),
        (beam.WindowInto(_DECLARED, allowed_lateness=3600),
         "trigger DefaultTrigger() (allowed lateness 3600s) can fire more than once"),
        (beam.WindowInto(_DECLARED, trigger=trigger.AfterWatermark(early=trigger.AfterCount(1)),
                         accumulation_mode=trigger.AccumulationMode.DISCARDING),
         "can fire more than once per window"),
    ],
)
def test_release_steps_refuse_windowing_that_depends_on_the_data(window_into, message):
    """Refused when the pipeline is built (no data read): FixedWindows/Sliding/Sessions open a
    window only when a record arrives; early/late/count triggers fire a data-dependent number of
    times."""
    p = beam.Pipeline()
    batches = p | beam.Create([], reshuffle=False).with_output_types(EncodedBatch) | window_into
    with pytest.raises(ValueError) as err:
        _ = batches | DPCount(budget=PureDP(epsilon=1.0), seed=1)
    assert message in str(err.value)


@pytest.mark.parametrize("window_into", [
    None,
    beam.WindowInto(_DECLARED),
    beam.WindowInto(_DECLARED, trigger=trigger.AfterWatermark(),
                    accumulation_mode=trigger.AccumulationMode.DISCARDING),
])
def test_release_steps_accept_global_and_declared_windows(window_into):
    p = beam.Pipeline()
    batches = p | beam.Create([], reshuffle=False).with_output_types(EncodedBatch)
    if window_into is not None:
        batches = batches | window_into
    _ = batches | DPCount(budget=PureDP(epsilon=1.0), seed=1)  # builds


def test_declared_windows_release_once_per_window_data_or_not():
    """Records on day 1 only, one record stamped after the declared range: DPCount, DPMarginals and
    CatHist (whose measurements feed no heartbeat of their own) release once per declared day;
    the late-stamped record is dropped and counted."""
    schema = load_schema("adult")
    shape, names = schema.shape, schema.names
    batch = _random_batch(shape, 6, "u", 4)
    stamped = [beam_window.TimestampedValue(batch, T0 + 60),
               beam_window.TimestampedValue(_random_batch(shape, 1, "x", 5), T0 + 9 * DAY)]
    windows = beam.Map(lambda x, w=beam.DoFn.WindowParam: int(w.start))
    three_days = [T0, T0 + DAY, T0 + 2 * DAY]
    with beam.Pipeline() as p:
        data = (p | beam.Create(stamped).with_output_types(EncodedBatch)
                | beam.WindowInto(_DECLARED))
        counts = data | DPCount(budget=PureDP(epsilon=0.5), seed=5)
        marginals = data | DPMarginals(specs=[(0,)], shape=shape, names=names,
                                       budgets=[PureDP(epsilon=0.5)], seed=5)
        hist = data | DPCategoricalHistogram(domain=schema.columns[1].domain,
                                             budget=PureDP(epsilon=1.0), tolerance=0.5, column=1, seed=5)
        assert_that(counts | "WinCounts" >> windows, equal_to(three_days), label="Counts")
        assert_that(marginals | "WinMarginals" >> windows, equal_to(three_days), label="Marginals")
        assert_that(hist | "WinHist" >> windows, equal_to(three_days), label="CatHist")
