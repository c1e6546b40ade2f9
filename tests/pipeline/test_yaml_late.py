"""The Beam YAML step ``BeamsynthSynthesize`` with ``windows`` on a stream (TestStream, DirectRunner
in streaming mode): a row that arrives after its declared window's release fired goes to the
step's ``error_handling`` output exactly once (reason ``arrived after window [start, end) was
released``, its ``position_field``), is counted in ``beamsynth/rows_late`` (also without an error
output) and never changes a release: one release per window, the same as without the late row
(rules 7 and 8). Before, the step dropped such rows without a trace (no error row, no count).

The counter is checked on a bounded pipeline: Beam 2.77's DirectRunner in streaming mode drops
counter updates of bundles after the first watermark move (a Map counting 3 TestStream elements,
the watermark moved after the first, reports 1), so its streaming runs cannot show it."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing import test_stream
from apache_beam.transforms import window as beam_window

from beamsynth.pipelines.methods.synthesize import counter_value
from beamsynth.pipelines.yaml_transforms import Synthesize, _LateRowsFn
from tests.pipeline.test_api_late import D1, D2, D3, DAY, T0, _options, _stream
from tests.pipeline.test_api_late import _event as _row  # a dict {sex, line}: rows alike here
from tests.pipeline.test_api_late import _late_reason as _late

WINDOWS = {"start": T0, "end": T0 + 3 * DAY, "size": DAY}
D4 = "2024-01-04T00:00:00Z"
SCHEMA = {"name": "toy", "columns": [
    {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}}]}
LATE_NOTE = ("rows arriving after their window's release are not in these counts: "
             "error_handling output, counted in beamsynth/rows_late")


class _Append(beam.DoFn):
    """Appends each element (as JSON text) to a file: the in-process runner's outputs, read back
    after the run (elements of a window: ``[window start, row]``)."""

    def __init__(self, path: str, windowed: bool) -> None:
        self._path, self._windowed = path, windowed

    def process(self, row, window=beam.DoFn.WindowParam):
        row = row if isinstance(row, dict) else row._asdict()
        item = [int(window.start), row] if self._windowed else row
        with open(self._path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(item) + "\n")


def _lines(path: Path) -> list:
    """The file's JSON items in a fixed order (by their text, keys sorted)."""
    if not path.exists():
        return []
    items = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))


def _run(stream: test_stream.TestStream, folder: Path, *, errors: bool = True) -> dict:
    """A seeded windowed step (ε large: every noise draw 0, rows 2 per window) over ``stream``:
    its synthetic rows per window, error rows and manifests (details, operational)."""
    folder.mkdir(parents=True)
    schema = folder / "schema.json"
    schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
    p = beam.Pipeline(options=_options())
    out = p | stream | Synthesize(
        schema=str(schema), epsilon=1000.0, rows=2, seed=3, windows=WINDOWS, position_field="line",
        manifest=str(folder / "m.json"), error_handling={"output": "bad"} if errors else None)
    synthetic = out["output"] if errors else out
    _ = synthetic | "Synthetic" >> beam.ParDo(_Append(str(folder / "out.jsonl"), True))
    if errors:
        _ = out["bad"] | "Errors" >> beam.ParDo(_Append(str(folder / "bad.jsonl"), False))
    result = p.run()
    result.wait_until_finish()
    manifests = [json.loads(f.read_text(encoding="utf-8"))
                 for f in sorted(folder.glob("m.*.json"))]
    return {"out": _lines(folder / "out.jsonl"), "bad": _lines(folder / "bad.jsonl"),
            "windows": [m["release"]["details"]["window"]["start"] for m in manifests],
            "ops": [{k: m["operational"][k] for k in ("rows_read", "rows_used", "rows_rejected")}
                    for m in manifests],
            "late_note": {m["release"]["details"].get("late_rows") for m in manifests}}


#: the releases of _stream() with nothing late: day 1 all F, day 3 all M (exact counts, ε large);
#: day 2 (empty) sampled from its uniform model with the seed (F, M: balanced, H91)
ON_TIME_OUT = [[T0 + i * DAY, {"window_start": start, "sex": sex}]  # rows say their window
               for i, start, sex in [(0, D1, "F"), (0, D1, "F"), (1, D2, "F"), (1, D2, "M"),
                                     (2, D3, "M"), (2, D3, "M")]]
ON_TIME_OPS = [{"rows_read": 1, "rows_used": 1, "rows_rejected": 0},
               {"rows_read": 0, "rows_used": 0, "rows_rejected": 0},
               {"rows_read": 1, "rows_used": 1, "rows_rejected": 0}]


def _error_row(line: int, sex: str, reason: str, source: str = "Synthesize") -> dict:
    return {"source": source, "row": line, "reason": reason,  # the step's full label (H70)
            "raw": json.dumps({"sex": sex, "line": str(line)})}


@pytest.mark.parametrize("past_end", [0, 1], ids=["watermark_at_end", "watermark_past_end"])
def test_late_row_of_a_released_window_goes_to_the_error_output(tmp_path, past_end):
    """Line 2 (M, day 1) arrives after day 1 was released: day 1 keeps its one release (F only,
    two rows), line 2 is one error row with its reason and position."""
    got = _run(_stream(after_day1=[_row(2, "M", T0 + 120)], past_end=past_end), tmp_path / "run")
    assert got["bad"] == [_error_row(2, "M", _late(D1, D2))]
    assert got["out"] == ON_TIME_OUT
    assert got["windows"] == [T0, T0 + DAY, T0 + 2 * DAY]
    assert got["ops"] == ON_TIME_OPS
    assert got["late_note"] == {LATE_NOTE}


def test_late_row_of_an_empty_window_goes_to_the_error_output(tmp_path):
    """Day 2 had no row on time (released on its heartbeat alone: an F and an M row with this
    seed, balanced sampling since H91);
    line 4 (M), stamped on day 2, arrives after that: day 2 released once, as without line 4;
    line 4 an error row."""
    got = _run(_stream(after_day2=[_row(4, "M", T0 + DAY + 7)], past_end=0), tmp_path / "run")
    assert got["bad"] == [_error_row(4, "M", _late(D2, D3))]
    assert got["out"] == ON_TIME_OUT
    assert got["ops"] == ON_TIME_OPS


def test_a_late_neighbour_changes_no_release_and_only_its_own_error_row(tmp_path):
    """Neighbours: D (an outside row, nothing late) and D + line 6 (F, day 1, arriving after
    days 1 and 2 were released): the same releases and manifests; D + 6 has line 6's error row
    beside the outside row."""
    outside = _row(9, "M", T0 + 5 * DAY)
    reason = f"timestamp 2024-01-06T00:00:00Z is outside the declared windows [{D1}, {D4})"
    without = _run(_stream(after_day1=[outside]), tmp_path / "without")
    with_late = _run(_stream(after_day1=[outside], after_day2=[_row(6, "F", T0 + 300)]),
                     tmp_path / "with")
    assert without["bad"] == [_error_row(9, "M", reason)]
    assert with_late["bad"] == [_error_row(6, "F", _late(D1, D2)), _error_row(9, "M", reason)]
    assert without["out"] == with_late["out"] == ON_TIME_OUT
    assert without["ops"] == with_late["ops"] == ON_TIME_OPS


def test_without_error_handling_a_late_row_is_dropped_and_the_manifest_says_so(tmp_path):
    """No error output: the late row is dropped (never released); the manifests say where late
    rows go (their count: test_late_rows_are_counted)."""
    got = _run(_stream(after_day1=[_row(2, "M", T0 + 120)]), tmp_path / "run", errors=False)
    assert got["out"] == ON_TIME_OUT
    assert got["ops"] == ON_TIME_OPS
    assert got["late_note"] == {"rows arriving after their window's release are not in these "
                                "counts: dropped, counted in beamsynth/rows_late"}


def test_late_rows_are_counted(tmp_path):
    """The step's late branch (``_LateRowsFn``, fed by SplitLate's late panes) counts each row in
    beamsynth/rows_late and turns it into an error row of its window (run bounded: see the
    module docstring on the streaming DirectRunner's counters)."""
    rows = [_row(2, "M", T0 + 120), _row(4, "F", T0 + DAY + 7)]
    p = beam.Pipeline()
    _ = (p | beam.Create(rows) | beam.WindowInto(beam_window.FixedWindows(DAY))
         | beam.ParDo(_LateRowsFn("line"))
         | beam.Map(lambda r: beam.Row(row=r.row, reason=r.reason))
         | beam.ParDo(_Append(str(tmp_path / "bad.jsonl"), False)))
    result = p.run()
    result.wait_until_finish()
    assert counter_value(result, "rows_late") == 2
    assert _lines(tmp_path / "bad.jsonl") == [{"reason": _late(D1, D2), "row": 2},
                                              {"reason": _late(D2, D3), "row": 4}]


def test_late_row_in_a_beam_yaml_pipelines_error_output(tmp_path):
    """Through Beam YAML itself (the shipped provider file, a composite with the step's
    error_handling output): the late row is in the error output with Beam YAML's row fields."""
    pytest.importorskip("apache_beam.yaml.yaml_transform", reason="Beam YAML extras")
    from apache_beam.yaml.yaml_provider import load_providers
    from apache_beam.yaml.yaml_transform import YamlTransform

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
    spec = f"""
type: composite
input: {{input: input}}
transforms:
  - type: BeamsynthSynthesize
    name: Synth
    input: input
    config:
      schema: {schema}
      epsilon: 1000
      rows: 2
      seed: 3
      position_field: line
      windows: {json.dumps(WINDOWS)}
      error_handling: {{output: bad}}
output:
  good: Synth.output
  bad: Synth.bad
"""
    from tests.yaml_helpers import provider

    with beam.Pipeline(options=_options()) as p:
        out = (p | _stream(after_day1=[_row(2, "M", T0 + 120)])
               | YamlTransform(spec, providers=list(load_providers(provider()))))
        _ = out["good"] | "Synthetic" >> beam.ParDo(_Append(str(tmp_path / "out.jsonl"), True))
        _ = out["bad"] | "Errors" >> beam.ParDo(_Append(str(tmp_path / "bad.jsonl"), False))
    assert _lines(tmp_path / "bad.jsonl") == [_error_row(2, "M", _late(D1, D2),
                                                         "YamlTransform/Composite/Synth")]
    assert _lines(tmp_path / "out.jsonl") == ON_TIME_OUT


def test_unbounded_input_without_windows_is_refused_with_the_way_out(tmp_path):
    """A stream into the step without ``windows`` could never release: refused when built with a
    message naming the step's ``windows`` (before: Beam's bare GroupByKey error on global windows
    with the default trigger)."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA), encoding="utf-8")
    p = beam.Pipeline(options=_options())
    stream = _stream()
    with pytest.raises(ValueError, match=r"the input is unbounded \(a stream\) and the step has "
                                         r"no windows, so it would never release; give the step "
                                         r"windows: \{start: S, end: E, size: SECONDS\}"):
        _ = p | stream | Synthesize(schema=str(schema), epsilon=1.0, rows=2, seed=3)
