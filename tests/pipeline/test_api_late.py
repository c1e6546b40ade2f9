"""The public API on a stream (TestStream, DirectRunner in streaming mode): a record that arrives
after its declared window's release fired is a dead letter with its reason and position, counted
in the job's exact counts, exactly once; the window is still released exactly once (rule 7),
whether the watermark sits exactly at the window's end (the old combine fired a second release
there) or past it (the old API dropped the record without a trace)."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing import test_stream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window as beam_window

import beamsynth as bs
from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.synthesis import DPCount

DAY = 86_400
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z
D1, D2, D3 = "2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"
WINDOWS = bs.DeclaredWindows(start=T0, end=T0 + 3 * DAY, size=DAY)
SCHEMA = bs.load_schema({"name": "toy", "columns": [
    {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}}]})
SOURCE = "events"


def _late_reason(day: str, next_day: str) -> str:
    return f"arrived after window [{day}, {next_day}) was released"


def _options() -> PipelineOptions:
    options = PipelineOptions(["--direct_running_mode=in_memory"])
    options.view_as(StandardOptions).streaming = True
    return options


def _event(line: int, sex: str, ts: int) -> beam_window.TimestampedValue:
    return beam_window.TimestampedValue({"sex": sex, "line": line}, ts)


def _stream(*, after_day1=(), after_day2=(), past_end: int = 1) -> test_stream.TestStream:
    """On time: line 1 (F, day 1) and line 3 (M, day 3); day 2 has no on-time record. The
    watermark moves to ``past_end`` seconds after the end of day 1, then of day 2; the events
    ``after_day1`` / ``after_day2`` arrive right after each move."""
    stream = (test_stream.TestStream().advance_watermark_to(T0)
              .add_elements([_event(1, "F", T0 + 60), _event(3, "M", T0 + 2 * DAY + 60)])
              .advance_watermark_to(T0 + DAY + past_end))
    if after_day1:
        stream = stream.add_elements(list(after_day1))
    stream = stream.advance_watermark_to(T0 + 2 * DAY + past_end)
    if after_day2:
        stream = stream.add_elements(list(after_day2))
    return stream.advance_watermark_to_infinity()


def _global(pcoll, label: str):
    return pcoll | label >> beam.WindowInto(beam_window.GlobalWindows())


def _run(stream: test_stream.TestStream, *, dead: list, counts: dict[str, int]) -> None:
    """Run a seeded job (ε large enough that every noise draw is 0) and check: one count and two
    marginal cells per declared window, exactly; ``dead`` (position, reason) dead letters; the
    job's exact counts ``counts`` (read = used + rejected)."""
    job = bs.PrivacyJob(epsilon=200.0, seed=7)
    with beam.Pipeline(options=_options()) as p:
        private = p | stream | job.private(SCHEMA, position_field="line", source=SOURCE,
                                           windows=WINDOWS)
        assert_that(private.dead_letters | beam.Map(lambda d: (d.source, d.position, d.reason)),
                    equal_to([(SOURCE, *d) for d in dead]), label="DeadLetters")
        count = private | bs.Count(epsilon=100.0)
        assert_that(_global(count | "CountRows" >> beam.Map(tuple), "GlobalCount"),
                    equal_to([(D1, 1), (D2, 0), (D3, 1)]), label="OneCountPerWindow")
        cells = (private | bs.Marginals(marginals=[("sex",)], epsilon=100.0))["sex"]
        assert_that(_global(cells | "CellRows" >> beam.Map(tuple), "GlobalCells"),
                    equal_to([(D1, "F", 1), (D1, "M", 0), (D2, "F", 0), (D2, "M", 0),
                              (D3, "F", 0), (D3, "M", 1)]), label="OneTablePerWindow")
        exact = tuple(job.count_outputs) | "JoinCounts" >> beam.Flatten()
        assert_that(exact, lambda items: _sums_are(items, counts), label="ExactCounts")


def _sums_are(items, expected: dict[str, int]) -> None:
    """``(source, field, rows)`` items summed per field equal ``expected``."""
    sums: dict[str, int] = {}
    for source, field, rows in items:
        assert source == SOURCE
        sums[field] = sums.get(field, 0) + rows
    assert {f: sums.get(f, 0) for f in expected} == expected, sums


@pytest.mark.parametrize("past_end", [0, 1], ids=["watermark_at_end", "watermark_past_end"])
def test_late_record_of_a_released_window_is_a_dead_letter(past_end):
    """Line 2 (M, day 1) arrives after day 1 was released: day 1 keeps its one release (count 1,
    M 0), line 2 is a dead letter with its reason and position, and it is counted."""
    _run(_stream(after_day1=[_event(2, "M", T0 + 120)], past_end=past_end),
         dead=[(2, _late_reason(D1, D2))],
         counts={"read": 3, "rejected": 1, "encoded": 2, "used": 2})


@pytest.mark.parametrize("past_end", [0, 1], ids=["watermark_at_end", "watermark_past_end"])
def test_late_record_of_an_empty_window_is_a_dead_letter(past_end):
    """Day 2 had no record on time (released on its heartbeat alone); line 4, stamped on day 2,
    arrives after that: one release of day 2 (count 0), line 4 in the dead letters."""
    _run(_stream(after_day2=[_event(4, "F", T0 + DAY + 7)], past_end=past_end),
         dead=[(4, _late_reason(D2, D3))],
         counts={"read": 3, "rejected": 1, "encoded": 2, "used": 2})


@pytest.mark.parametrize("past_end", [0, 1], ids=["watermark_at_end", "watermark_past_end"])
def test_nothing_late_no_dead_letter_and_a_late_neighbour_changes_no_release(past_end):
    """Neighbours: D (nothing late: no dead letter) and D + line 6, stamped on day 1 and arriving
    after days 1 and 2 were released: the same releases in both (checked exactly by ``_run``),
    line 6 only in D + 6's dead letters and counts."""
    _run(_stream(past_end=past_end), dead=[],
         counts={"read": 2, "rejected": 0, "encoded": 2, "used": 2})
    _run(_stream(after_day2=[_event(6, "F", T0 + 300)], past_end=past_end),
         dead=[(6, _late_reason(D1, D2))],
         counts={"read": 3, "rejected": 1, "encoded": 2, "used": 2})


def test_building_block_releases_once_when_a_record_arrives_at_the_window_end():
    """Below the API (``beam.WindowInto(days) | DPCount``, default trigger): with the watermark
    exactly at the end of day 2, which had no record on time, a batch of 7 records of day 2
    arrives. The old combine fired day 2 twice (0, then 7: a second release, rule 7); now once,
    and the batch is dropped there (the API turns such records into dead letters first)."""
    batch = EncodedBatch(np.zeros((7, 1), dtype=np.int32), None)
    stream = (test_stream.TestStream().advance_watermark_to(T0)
              .add_elements([beam_window.TimestampedValue(batch, T0 + 60)])
              .advance_watermark_to(T0 + 2 * DAY)
              .add_elements([beam_window.TimestampedValue(batch, T0 + DAY + 120)])
              .advance_watermark_to_infinity())
    with beam.Pipeline(options=_options()) as p:
        counts = (p | stream | beam.WindowInto(WINDOWS)
                  | DPCount(budget=PureDP(epsilon=1000.0), seed=1)
                  | beam.Map(lambda c, w=beam.DoFn.WindowParam: (int(w.start), c.value)))
        assert_that(_global(counts, "GlobalCounts"),
                    equal_to([(T0, 7), (T0 + DAY, 0), (T0 + 2 * DAY, 0)]))


def test_write_manifest_refuses_an_unbounded_pipeline_when_built(tmp_path):
    """Late dead letters keep coming for a year after a window's release, so an unbounded job's
    exact counts are never final: bs.WriteManifest is refused when the pipeline is built, with
    a message saying why and where the spends are (was Beam's bare GroupByKey error)."""
    job = bs.PrivacyJob(epsilon=1.0, seed=7)
    p = beam.Pipeline(options=_options())
    private = p | _stream() | job.private(SCHEMA, source=SOURCE, windows=WINDOWS)
    _ = private | bs.Count(epsilon=1.0)
    with pytest.raises(ValueError) as err:
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "manifest.json"))
    assert str(err.value) == (
        "WriteManifest: job 'beamsynth job' reads an unbounded source; its manifest's exact counts "
        "are never final (a record late for its window is a dead letter until a year after the "
        "window's release) and records outside the declared windows belong to none, so "
        "bs.WriteManifest needs a bounded pipeline; the spends are known now: "
        "job.accountant.to_dict() (docs/beam-api.md, windows)")
    assert not (tmp_path / "manifest.json").exists()


def test_write_manifest_refuses_open_ended_windows_on_a_bounded_input(tmp_path):
    """end=None drives every release with PeriodicImpulse heartbeats that never stop: a bounded
    job (Create) with bs.WriteManifest ran forever (H28: timed out after 90 s with bs.Count and
    10 records). Now refused when built, with the way out."""
    job = bs.PrivacyJob(epsilon=1.0, seed=7)
    open_ended = bs.DeclaredWindows(start=T0, end=None, size=DAY)
    p = beam.Pipeline(options=PipelineOptions(["--direct_running_mode=in_memory"]))
    rows = p | beam.Create([{"sex": "F"}] * 3) | beam.Map(lambda r: beam_window.TimestampedValue(r, T0 + 60))
    private = rows | job.private(SCHEMA, source=SOURCE, windows=open_ended)
    _ = private | bs.Count(epsilon=1.0)
    with pytest.raises(ValueError, match=r"declares open-ended windows .*end=None.*never finishes.*"
                                         r"declare the range's end"):
        _ = p | bs.WriteManifest(job=job, path=str(tmp_path / "manifest.json"))
    assert not (tmp_path / "manifest.json").exists()
