"""Audit: releases happen only on declared windows; the Beam YAML step is safe and composes.

Each check is a function of a way to run the code that returns ``None`` (fine) or a finding. It
runs on the real code, which must pass, and on a **broken variant** — the behaviour before issue 15,
restored by patching — which it must catch:

* windowed building blocks and the YAML step: neighbours D (records on day 1) and D' = D + one
  record on day 2, an otherwise empty window. The releases (outputs per window, manifests) must be
  identical, or the windowing refused when the pipeline is built. Broken: ``combine_globally``
  as ``CombineGlobally(fn).without_defaults()`` on ``FixedWindows`` (a window released only if it
  had a record: ε = ∞);
* one out-of-domain row must not fail the run, and no exception or log text may carry its value.
  Broken: the step raising on a rejected row with its reason (which names the value);
* two YAML steps spending 0.6 each of a declared 1.0 must fail when the pipeline is built.
  Broken: one accountant per step;
* a seeded YAML step must be marked (warning when built, counter of rows not for release).
  Broken: no mark.

Tiny inputs: each pipeline runs on a handful of rows.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.transforms import window as beam_window

from beamsynth.pipelines import yaml_transforms as yt
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms import measure, synthesis
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.measure import DPMarginals
from beamsynth.transforms.synthesis import DPCount
from beamsynth.transforms.windows import DeclaredWindows

pytestmark = pytest.mark.audit

DAY = 86_400
T0 = int(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp())
DECLARED = DeclaredWindows(start=T0, end=T0 + 3 * DAY, size=DAY)
_SCHEMA_SPEC = {
    "name": "audit_windows",
    "columns": [
        {"name": "color", "type": "categorical",
         "domain": {"kind": "categorical", "values": ["red", "green", "blue"]}},
        {"name": "age", "type": "integer",
         "domain": {"kind": "integer", "low": 0, "high": 99, "edges": [0, 50, 100]}},
    ],
}
SCHEMA = load_schema(_SCHEMA_SPEC)
SECRET = "mauve-SECRET-0815"
Finding = str | None


def _old_combine_globally(pcoll, fn, label):
    """combine_globally before issue 15: per non-empty window outside the global window."""
    combine = beam.CombineGlobally(fn)
    if not isinstance(pcoll.windowing.windowfn, beam_window.GlobalWindows):
        combine = combine.without_defaults()
    return pcoll | label >> combine


def _broken_windows():
    """Patches restoring the old window handling (building blocks and the YAML step)."""
    return [mock.patch.object(measure, "combine_globally", _old_combine_globally),
            mock.patch.object(synthesis, "combine_globally", _old_combine_globally),
            mock.patch.object(yt, "combine_globally", _old_combine_globally),
            mock.patch.object(yt, "check_release_windowing", lambda pcoll, step, **kw: None)]


class _Patched:
    def __init__(self, patches):
        self._patches = patches

    def __enter__(self):
        for p in self._patches:
            p.start()

    def __exit__(self, *exc):
        for p in reversed(self._patches):
            p.stop()


# -- neighbours on windows ------------------------------------------------------------------------
def _stamped(with_extra: bool) -> list[beam_window.TimestampedValue]:
    """D: 5 records on day 1; D' adds one record on day 2 (otherwise empty); day 3 is empty."""
    codes = np.array([[0, 0], [1, 1], [2, 0], [0, 1], [1, 0]], dtype=np.int32)
    out = [beam_window.TimestampedValue(EncodedBatch(codes, None), T0 + 60)]
    if with_extra:
        out.append(beam_window.TimestampedValue(EncodedBatch(codes[:1], None), T0 + DAY + 60))
    return out


def _write_json(items: list, path: str) -> None:
    Path(path).write_text(json.dumps(sorted(items)), encoding="utf-8")


def _collect(pcoll, path: Path, label: str) -> None:
    """Writes the sorted (label, window start) of every output to ``path`` (one JSON list)."""
    _ = (pcoll
         | f"{label}Where" >> beam.Map(lambda _x, w=beam.DoFn.WindowParam: [label, int(w.start)])
         | f"{label}Global" >> beam.WindowInto(beam_window.GlobalWindows())
         | f"{label}List" >> beam.combiners.ToList()
         | f"{label}Write" >> beam.Map(_write_json, str(path)))


def _blocks_releases(windowfn: Any, with_extra: bool, folder: Path) -> list:
    """DPCount and DPMarginals on the stamped batches windowed by ``windowfn``; their outputs
    as (transform, window start), sorted."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "releases.json"
    with beam.Pipeline() as p:
        data = (p | beam.Create(_stamped(with_extra)).with_output_types(EncodedBatch)
                | beam.WindowInto(windowfn))
        _collect((data | DPCount(budget=PureDP(epsilon=0.5), seed=1),
                  data | DPMarginals(specs=[(0,), (1,)], shape=SCHEMA.shape, names=SCHEMA.names,
                                     budgets=[PureDP(epsilon=0.25)] * 2, seed=1)
                  | beam.Map(lambda ms: ms[0]))
                 | beam.Flatten(), out, "release")
    return json.loads(out.read_text(encoding="utf-8"))


def audit_window_neighbours(run: Callable[[bool, Path], list], folder: Path) -> Finding:
    """None if D and D' (one record in an otherwise empty window) give the same releases, or if
    the windowing is refused when the pipeline is built; else the finding."""
    try:
        without = run(False, folder / "without")
        with_one = run(True, folder / "with")
    except ValueError as exc:  # refused when the pipeline was built: no data was read
        return None if "DeclaredWindows(start=" in str(exc) else f"unexpected error: {exc}"
    if without != with_one:
        return f"releases differ on one record: {without} vs {with_one}"
    return None


def test_building_blocks_release_once_per_declared_window(tmp_path: Path) -> None:
    declared = lambda extra, folder: _blocks_releases(DECLARED, extra, folder)  # noqa: E731
    assert audit_window_neighbours(declared, tmp_path / "declared") is None
    fixed = lambda extra, folder: _blocks_releases(beam_window.FixedWindows(DAY), extra, folder)  # noqa: E731
    assert audit_window_neighbours(fixed, tmp_path / "fixed") is None  # refused when built


@pytest.mark.slow
def test_window_audit_catches_the_old_building_blocks(tmp_path: Path) -> None:
    fixed = lambda extra, folder: _blocks_releases(beam_window.FixedWindows(DAY), extra, folder)  # noqa: E731
    with _Patched(_broken_windows()):  # before: a window existed only if it had a record
        finding = audit_window_neighbours(fixed, tmp_path / "broken")
    assert finding is not None and "releases differ on one record" in finding


def _yaml_rows(with_extra: bool) -> list[beam_window.TimestampedValue]:
    rows = [beam.Row(color="red", age=str(10 + i)) for i in range(5)]
    out = [beam_window.TimestampedValue(r, T0 + 60 + i) for i, r in enumerate(rows)]
    if with_extra:
        out.append(beam_window.TimestampedValue(beam.Row(color="blue", age="70"), T0 + DAY + 60))
    return out


def _yaml_releases(step_windows: dict | None, input_windowfn: Any, with_extra: bool,
                   folder: Path) -> list:
    """The YAML step (3 rows per release, manifests) on timestamped rows; (output, window start)
    of every synthetic row plus the manifest files written."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "releases.json"
    with beam.Pipeline() as p:
        rows = p | beam.Create(_yaml_rows(with_extra))
        if input_windowfn is not None:
            rows = rows | beam.WindowInto(input_windowfn)
        synth = rows | yt.Synthesize(schema=_schema_file(folder), epsilon=1.0, rows=3, seed=2,
                                     windows=step_windows, manifest=str(folder / "m.json"))
        _collect(synth, out, "row")
    manifests = sorted(f.name for f in folder.glob("m*.json"))
    return [json.loads(out.read_text(encoding="utf-8")), manifests]


def _schema_file(folder: Path) -> str:
    path = folder / "schema.json"
    path.write_text(json.dumps(_SCHEMA_SPEC), encoding="utf-8")
    return str(path)


def test_yaml_step_releases_once_per_declared_window(tmp_path: Path) -> None:
    windows = {"start": T0, "end": T0 + 3 * DAY, "size": DAY}
    declared = lambda extra, folder: _yaml_releases(windows, None, extra, folder)  # noqa: E731
    assert audit_window_neighbours(declared, tmp_path / "declared") is None
    rows = json.loads((tmp_path / "declared" / "without" / "releases.json").read_text(encoding="utf-8"))
    assert sorted({w for _, w in rows}) == [T0, T0 + DAY, T0 + 2 * DAY]  # empty days released too
    assert len(list((tmp_path / "declared" / "without").glob("m.*.json"))) == 3  # a manifest each
    fixed = lambda extra, folder: _yaml_releases(None, beam_window.FixedWindows(DAY), extra, folder)  # noqa: E731
    assert audit_window_neighbours(fixed, tmp_path / "fixed") is None  # refused when built


@pytest.mark.slow
def test_window_audit_catches_the_old_yaml_step(tmp_path: Path) -> None:
    fixed = lambda extra, folder: _yaml_releases(None, beam_window.FixedWindows(DAY), extra, folder)  # noqa: E731
    with _Patched(_broken_windows()):
        finding = audit_window_neighbours(fixed, tmp_path / "broken")
    assert finding is not None and "releases differ on one record" in finding


# -- one bad row ----------------------------------------------------------------------------------
def _old_encode_process(self, rows):
    """The step before issue 15 without error_handling: a rejected row failed the run, its
    reason (naming the value) in the exception text."""
    batch, rejected = yt.encode_rows(self._schema, list(rows))
    for r in rejected:
        raise ValueError(f"BeamsynthSynthesize: input row {r.row} rejected: {r.reason}; configure "
                         "'error_handling: {output: NAME}' on the step")
    if len(batch):
        yield batch


def audit_bad_row(folder: Path, caplog: pytest.LogCaptureFixture) -> Finding:
    """None if one out-of-domain row neither fails the run nor shows its value in any exception
    or log text (logs captured from the in-process runner)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [beam.Row(color="red", age=str(i)) for i in range(6)] + [beam.Row(color=SECRET, age="5")]
    caplog.clear()
    try:
        with caplog.at_level(logging.DEBUG):
            p = beam.Pipeline()
            _ = p | beam.Create(rows) | yt.Synthesize(schema=_schema_file(folder), epsilon=1.0, rows=4)
            result = p.run()
            result.wait_until_finish()
    except Exception as exc:  # noqa: BLE001 (any failure of the run is the finding)
        leak = " (and the exception text carries the value)" if SECRET in str(exc) else ""
        return f"one bad row failed the run{leak}"
    leaked = [r.getMessage() for r in caplog.records if SECRET in r.getMessage()]
    if leaked:
        return f"log text carries the value: {leaked[0][:200]}"
    found = result.metrics().query(
        MetricsFilter().with_namespace("beamsynth").with_name("rows_rejected_schema"))["counters"]
    if sum(c.committed for c in found) != 1:
        return "the bad row was not counted"
    return None


def test_one_bad_row_neither_fails_the_run_nor_leaks(tmp_path: Path, caplog) -> None:
    assert audit_bad_row(tmp_path / "real", caplog) is None
    with mock.patch.object(yt._EncodeRowsFn, "process", _old_encode_process):
        finding = audit_bad_row(tmp_path / "broken", caplog)
    assert finding == "one bad row failed the run (and the exception text carries the value)"


# -- composition and seeded marking --------------------------------------------------------------
def audit_composition(folder: Path) -> Finding:
    """None if two steps of 0.6 each under a declared job budget of 1.0 fail when built."""
    from tests.pipeline.test_beam_yaml import _two_steps
    from tests.yaml_helpers import build

    folder.mkdir(parents=True, exist_ok=True)
    try:
        build(_two_steps(folder, (0.6, 0.6), ", job_budget: {epsilon: 1.0}"))
    except ValueError as exc:
        return None if "asks for ε=0.6 but only (ε=0.4, δ=0)" in str(exc) else f"other error: {exc}"
    return "two steps spending 0.6 + 0.6 of a 1.0 job budget were built"


def test_yaml_steps_compose(tmp_path: Path) -> None:
    pytest.importorskip("apache_beam.yaml.main", reason="Beam YAML needs apache-beam[yaml]")
    assert audit_composition(tmp_path / "real") is None
    with mock.patch.object(yt._JobLedger, "add", lambda self, *args: None):
        assert audit_composition(tmp_path / "broken") is not None  # one accountant per step


def audit_seeded(folder: Path, caplog: pytest.LogCaptureFixture) -> Finding:
    """None if a seeded step warns when built and counts its rows as not for release."""
    folder.mkdir(parents=True, exist_ok=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        p = beam.Pipeline()
        _ = (p | beam.Create([beam.Row(color="red", age="3")])
             | yt.Synthesize(schema=_schema_file(folder), epsilon=1.0, rows=4, seed=9))
        result = p.run()
        result.wait_until_finish()
    if not any("seeded: not for release" in r.getMessage() for r in caplog.records):
        return "no warning when the seeded step was built"
    found = result.metrics().query(
        MetricsFilter().with_namespace("beamsynth").with_name("seeded_rows_not_for_release"))["counters"]
    if sum(c.committed for c in found) != 4:
        return "seeded rows not counted as not for release"
    return None


def test_seeded_yaml_output_is_marked(tmp_path: Path, caplog) -> None:
    assert audit_seeded(tmp_path / "real", caplog) is None
    with mock.patch.object(yt.Synthesize, "mark_seeded", False):  # before: nothing marked
        assert audit_seeded(tmp_path / "broken", caplog) == "no warning when the seeded step was built"
