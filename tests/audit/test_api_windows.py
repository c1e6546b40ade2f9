"""Audit: the public API releases once per declared window, whether a window has records or not.

Neighbours D (dicts on day 1) and D' = D + one record r alone on day 2, an otherwise empty declared
window (day 3 empty in both). Through ``job.private(schema, windows=bs.DeclaredWindows(...))``,
``bs.Count``, ``bs.Marginals``, ``bs.Histogram`` and ``bs.IndependentSynthesis`` (typed outputs:
one element per release) must give the same releases per window, and the same public manifest
parts (spends, per-window spends, declaration); undeclared ``FixedWindows`` must be refused when
the pipeline is built. The check runs on the real code, which must pass, and on a broken variant,
which it must catch: ``combine_globally`` as ``CombineGlobally(fn).without_defaults()`` (the
behaviour before issue 15: a window released only when it held a record, ε = ∞).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.transforms import window as beam_window

import beamsynth as bs
from tests.audit.test_windows_yaml import (
    DAY,
    SCHEMA,
    T0,
    _broken_windows,
    _collect,
    _Patched,
    audit_window_neighbours,
)

pytestmark = pytest.mark.audit

DECLARED = bs.DeclaredWindows(start=T0, end=T0 + 3 * DAY, size=DAY)


def _records(with_extra: bool) -> list[beam_window.TimestampedValue]:
    rows = [{"color": c, "age": a} for c, a in [("red", 10), ("blue", 70), ("green", 30),
                                                 ("red", 55), ("blue", 5)]]
    out = [beam_window.TimestampedValue(r, T0 + 60 + i) for i, r in enumerate(rows)]
    if with_extra:  # r: alone in day 2
        out.append(beam_window.TimestampedValue({"color": "green", "age": 42}, T0 + DAY + 60))
    return out


def _api_releases(windowfn: Any, with_extra: bool, folder: Path, *, everything: bool = True) -> list:
    """(mechanism, window start) of every typed release, plus the manifest's public parts."""
    folder.mkdir(parents=True, exist_ok=True)
    job = bs.PrivacyJob(epsilon=4.0, seed=3)
    with beam.Pipeline() as p:
        records = p | beam.Create(_records(with_extra)) | "Stamp" >> beam.Map(lambda tv: tv)
        if windowfn is None:
            private = records | job.private(SCHEMA, windows=DECLARED)
        else:
            private = records | beam.WindowInto(windowfn) | job.private(SCHEMA)
        private.dead_letters | "Bad" >> beam.Map(print)
        out = [private | bs.Count(epsilon=1.0, typed=True),
               private | bs.Marginals(marginals=[("color", "age")], epsilon=1.0, typed=True)]
        if everything:
            out += [private | bs.Histogram(column="color", epsilon=1.0, tolerance=0.5, typed=True),
                    (private | bs.IndependentSynthesis(epsilon=1.0, rows=2, typed=True))["models"]]
        _collect([o | f"Name{i}" >> beam.Map(lambda _x, i=i: i) for i, o in enumerate(out)]
                 | beam.Flatten(), folder / "releases.json", "release")
        _ = p | bs.WriteManifest(job=job, path=str(folder / "manifest.json"))
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    public = {"budget": manifest["release"]["budget"],
              "windows": manifest["release"]["details"]["windows"]}
    return [json.loads((folder / "releases.json").read_text(encoding="utf-8")), public]


@pytest.mark.parametrize("everything", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_api_releases_once_per_declared_window(tmp_path: Path, everything: bool) -> None:
    declared = lambda extra, folder: _api_releases(None, extra, folder, everything=everything)  # noqa: E731
    assert audit_window_neighbours(declared, tmp_path / "declared") is None
    releases = json.loads((tmp_path / "declared" / "without" / "releases.json").read_text(
        encoding="utf-8"))
    assert sorted({w for _, w in releases}) == [T0, T0 + DAY, T0 + 2 * DAY]  # empty days too
    assert len(releases) == (4 if everything else 2) * 3  # one release per mechanism and day
    fixed = lambda extra, folder: _api_releases(beam_window.FixedWindows(DAY), extra, folder)  # noqa: E731
    assert audit_window_neighbours(fixed, tmp_path / "fixed") is None  # refused when built


@pytest.mark.slow
def test_api_window_audit_catches_releases_only_on_windows_with_records(tmp_path: Path) -> None:
    declared = lambda extra, folder: _api_releases(None, extra, folder, everything=False)  # noqa: E731
    with _Patched(_broken_windows()):
        finding = audit_window_neighbours(declared, tmp_path / "broken")
    assert finding is not None and "releases differ on one record" in finding
