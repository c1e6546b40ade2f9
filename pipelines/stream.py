"""Windowed (streaming) synthesis: one DP release per event-time window.

:class:`WindowedSynthesis` takes timestamped ``EncodedBatch`` elements (bounded or unbounded,
e.g. from Pub/Sub or Beam's ``TestStream``), assigns them to fixed event-time windows (daily by
default) and runs the ``synthesize`` steps **per window**: bound contributions, DP count, the
method's measurements, sampling. Every window with input yields one release: a synthetic file
``OUT`` with the window start inserted before the extension and its own manifest, written by the
pipeline (:class:`WindowRelease` describes both).

Budget: the :class:`~beamsynth.pipelines.synthesize.SynthesisPlan` spends its budget once, at
build time, **per window**: every window's release costs the plan's total (ε, δ) and its
manifest lists the same spends. Randomness of window ``w`` is drawn from
``(seed, step, ..., w.start, w.end)``, so a seeded stream gives the same releases on any runner.

Guarantee across windows: contribution bounding is per window (``max_contributions`` records per
privacy unit per window). A unit present in ``w`` windows is protected by basic composition at
``w·ε`` (``w·δ``); a unit present in one window, at ``ε``. Releases are per-window ε-DP.

Late data: windows fire once, when the watermark passes their end (``AfterWatermark`` without
late firings, discarding panes), so a window is released exactly once and its budget is spent
once. Records arriving after that (behind the watermark by more than ``allowed_lateness``, or
after the on-time pane fired) are **dropped** from the release; a separate branch counts them per
window (``late_rows`` in :class:`LateCount`, an exact operational count: not DP, do not publish).
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms import trigger
from apache_beam.transforms import window as beam_window
from apache_beam.utils.timestamp import Duration

from beamsynth.pipelines.io import table_to_csv_text
from beamsynth.pipelines.manifest import build_manifest, manifest_path, write_json_atomic
from beamsynth.pipelines.synthesize import SynthesisPlan, synthesize_batches
from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.units import BoundContributions

__all__ = [
    "DAY",
    "LateCount",
    "WindowRelease",
    "WindowedSynthesis",
    "window_output_path",
]

DAY = 86_400


@dataclass(frozen=True)
class WindowRelease:
    """One window's release, as recorded in its manifest.

    Attributes:
      start, end: the event-time window, ISO 8601 UTC.
      rows_out: synthetic rows written (the DP count, post-processed).
      synthetic: path of the window's synthetic CSV file.
      manifest: path of the window's manifest.
      budget: the window's budget (accountant form: total, spends, sums).
    """

    start: str
    end: str
    rows_out: int
    synthetic: str
    manifest: str
    budget: dict[str, Any]


@dataclass(frozen=True)
class LateCount:
    """Exact number of records that arrived too late for the release of a window (not DP)."""

    start: str
    end: str
    late_rows: int


def _iso(ts: Any) -> str:
    return _dt.datetime.fromtimestamp(float(ts), tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def window_output_path(output: str, window: Any) -> str:
    """``OUT`` with the window start inserted before the extension: ``day.csv`` →
    ``day.20240101T000000Z.csv``."""
    stamp = _iso(window.start).replace("-", "").replace(":", "")
    root, ext = os.path.splitext(output)
    return f"{root}.{stamp}{ext}"


class _WriteWindowReleaseFn(beam.DoFn):
    """Writes one window's synthetic CSV and manifest (atomic renames; rerun-safe)."""

    def __init__(self, *, plan_info: dict[str, Any], output: str, column_names: list[str]) -> None:
        self._info, self._output, self._names = plan_info, output, column_names

    def process(self, keyed, window=beam.DoFn.WindowParam) -> Iterable[WindowRelease]:
        rows = 0
        tables: list[pa.Table] = []
        for tag, value in keyed[1]:
            if tag == "rows":
                rows = int(value)
            else:
                tables.append(value)
        # shards in content order: the file does not depend on arrival order or worker
        chunks = sorted(table_to_csv_text(t) for t in tables)
        path = window_output_path(self._output, window)
        text = ",".join(self._names) + "\n" + "".join(chunks)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
        written = sum(t.num_rows for t in tables)
        info = self._info
        manifest = build_manifest(
            command="synthesize --stream", method=info["method"], inputs=["stream"],
            outputs={"synthetic": path, "manifest": manifest_path(path)},
            schema_name=info["schema_name"], schema_fingerprint=info["schema_fingerprint"],
            accountant=info["budget"], seed=info["seed"], privacy_unit=info["privacy_unit"],
            counts={"rows_out": written},
            details={"window": {"start": _iso(window.start), "end": _iso(window.end)},
                     "rows_planned": rows, "guarantee": info["guarantee"],
                     "late_data": info["late_data"], "method": info["method_details"]},
        )
        write_json_atomic(manifest_path(path), manifest)
        yield WindowRelease(_iso(window.start), _iso(window.end), written, path,
                            manifest_path(path), info["budget"])


class _CountLateFn(beam.DoFn):
    """Per pane of the late-counting branch: emit the count of LATE panes only."""

    def process(self, count: int, window=beam.DoFn.WindowParam,
                pane=beam.DoFn.PaneInfoParam) -> Iterable[LateCount]:
        if pane.timing == beam.utils.windowed_value.PaneInfoTiming.LATE and count:
            yield LateCount(_iso(window.start), _iso(window.end), int(count))


def _batch_rows(batch: EncodedBatch) -> int:
    return len(batch)


def _tag_table(table: pa.Table) -> tuple[int, tuple[str, Any]]:
    return 0, ("table", table)


class WindowedSynthesis(beam.PTransform):
    """Per-window DP synthesis of timestamped ``EncodedBatch`` input; one release per window.

    Args:
      plan: from :func:`~beamsynth.pipelines.synthesize.plan_synthesis`; its budget is the budget
        **of each window** (spent once, at build time).
      output: synthetic file pattern (``.csv``); window files are ``window_output_path(output, w)``.
      window_seconds: fixed event-time window length (default one day).
      allowed_lateness: seconds a window stays open for the late-data count after the watermark
        passes its end (late records are counted, never released).

    Input: ``PCollection[EncodedBatch]`` with event timestamps (one window per batch).
    Output: ``{"releases": PCollection[WindowRelease], "late": PCollection[LateCount],
    "tables": PCollection[pyarrow.Table], "batches": bounded PCollection[EncodedBatch]}``.
    """

    def __init__(self, *, plan: SynthesisPlan, output: str, window_seconds: int = DAY,
                 allowed_lateness: int = 0, label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(plan, SynthesisPlan):
            raise TypeError(f"plan must be a SynthesisPlan, got {type(plan).__name__}")
        if isinstance(window_seconds, bool) or not isinstance(window_seconds, int) or window_seconds < 1:
            raise ValueError(f"window_seconds ({window_seconds!r}) must be an int >= 1")
        if isinstance(allowed_lateness, bool) or not isinstance(allowed_lateness, int) or allowed_lateness < 0:
            raise ValueError(f"allowed_lateness ({allowed_lateness!r}) must be an int >= 0")
        if not output.lower().endswith(".csv"):
            raise ValueError(f"output ({output!r}) must be a .csv path for windowed releases")
        self._plan, self._output = plan, output
        self._seconds, self._lateness = window_seconds, allowed_lateness

    def _plan_info(self) -> dict[str, Any]:
        plan, cfg = self._plan, self._plan.config
        return {
            "method": plan.method.name,
            "method_details": plan.method.details(),
            "schema_name": plan.schema.name,
            "schema_fingerprint": plan.schema.fingerprint(),
            "budget": plan.accountant.to_dict(),
            "seed": cfg.seed,
            "privacy_unit": {"privacy_id": plan.schema.privacy_id,
                             "max_contributions": cfg.max_contributions,
                             "per": "window",
                             "neighbouring": "add/remove one privacy unit"},
            "guarantee": ("per-window DP at the budget above; a privacy unit present in w windows "
                          "is protected at w times that budget (basic composition)"),
            "late_data": {"allowed_lateness_seconds": self._lateness,
                          "policy": "one on-time release per window; late records dropped and "
                                    "counted (operational, not DP)"},
        }

    def expand(self, batches):
        plan, cfg = self._plan, self._plan.config
        windowed = batches | "Window" >> beam.WindowInto(
            beam_window.FixedWindows(self._seconds),
            trigger=trigger.AfterWatermark(),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
            allowed_lateness=Duration(seconds=self._lateness))
        # EncodedBatch per daily window, fired once
        late = (
            batches
            | "WindowForLate" >> beam.WindowInto(
                beam_window.FixedWindows(self._seconds),
                trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING,
                allowed_lateness=Duration(seconds=max(self._lateness, 365 * DAY)))
            | "RowsPerBatch" >> beam.Map(_batch_rows)
            | "SumRows" >> beam.CombineGlobally(sum).without_defaults()
            | "LatePanes" >> beam.ParDo(_CountLateFn())
        )
        # LateCount per late pane
        if plan.schema.privacy_id is not None:
            windowed = windowed | "BoundContributions" >> BoundContributions(
                max_contributions=cfg.max_contributions, seed=cfg.seed)
            # EncodedBatch, <= k rows per privacy id per window
        tables, _models, rows = synthesize_batches(windowed, plan, side_input=False)
        # pyarrow.Table shards; rows: int per window
        # pyarrow.Table shards
        releases = (
            (tables | "KeyTables" >> beam.Map(_tag_table),
             rows | "KeyPlanned" >> beam.Map(lambda r: (0, ("rows", r))))
            | "JoinTables" >> beam.Flatten()
            | "GroupWindow" >> beam.GroupByKey()
            # (0, Iterable[("rows", n) | ("table", Table)]) per window
            | "WriteRelease" >> beam.ParDo(_WriteWindowReleaseFn(
                plan_info=self._plan_info(), output=self._output,
                column_names=list(plan.schema.names)))
            # WindowRelease per window
        )
        return {"releases": releases, "late": late, "tables": tables, "batches": windowed}

