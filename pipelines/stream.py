"""Windowed (streaming) synthesis: one DP release per event-time window.

:class:`WindowedSynthesis` takes timestamped ``EncodedBatch`` elements (bounded or unbounded,
e.g. from Pub/Sub or Beam's ``TestStream``), assigns them to fixed event-time windows (daily by
default) and runs the ``synthesize`` steps **per window**: bound contributions, DP count, the
method's measurements, sampling. Every **declared** window yields exactly one release, whether or
not it received records: a synthetic file ``OUT`` with the window start inserted before the
extension and its own manifest, written by the pipeline (:class:`WindowRelease` describes both).
Rows stream to the file: each sampled table is written to a part file of its window
(``.beamsynth-temp-<window file>-<run id>/`` next to ``OUT``) where it is sampled, the window's
group holds part paths only, and the release step concatenates the parts in (window, shard)
order under a CSV-escaped header, then deletes the folder. Memory per window is one table.

Declared windows: the set of released windows is public and fixed before any data is seen
(``windows_start``, ``windows_end``, ``window_seconds``). One **empty** ``EncodedBatch`` per
declared window (:class:`WindowHeartbeat`) is flattened with the data after contribution
bounding, so each declared window has an element and its measurements fire on it (DP counts and
marginals are defined on empty input). Without it a window would be released only if it had
input, and the existence of a release would reveal whether one unit's record was there (ε = ∞).
Records stamped outside the declared range never create a window: they go to the ``outside``
output (an exact operational count, not DP) and are dropped. Only methods whose measurements emit
on an empty window are accepted (:data:`EMPTY_WINDOW_METHODS`).

Budget: the :class:`~beamsynth.pipelines.methods.synthesize.SynthesisPlan` spends its budget once, at
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
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms import trigger
from apache_beam.transforms import window as beam_window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.utils.timestamp import Duration

from beamsynth.pipelines.io import filesystem as fs
from beamsynth.pipelines.io.manifest import build_manifest, manifest_path, write_json_atomic
from beamsynth.pipelines.io.records import METRICS_NAMESPACE
from beamsynth.pipelines.io.single_file import (
    TEMP_PREFIX,
    _PartCodec,
    _WritePartFn,
    join_part_files,
)
from beamsynth.pipelines.methods.synthesize import SynthesisPlan, synthesize_batches
from beamsynth.schemas.schema import EncodedBatch, Schema
from beamsynth.transforms.conventions import display_items, element_types
from beamsynth.transforms.units import BoundContributions
from beamsynth.transforms.windows import DeclaredWindows, is_late_pane, late_windowing
from beamsynth.transforms.windows import declared_range as _declared_range

__all__ = [
    "DAY",
    "EMPTY_WINDOW_METHODS",
    "LateCount",
    "OutsideCount",
    "WindowHeartbeat",
    "WindowRelease",
    "WindowedSynthesis",
    "empty_batch",
    "window_output_path",
]

DAY = 86_400

#: Methods whose every measurement emits a DP result on a window holding only the empty
#: heartbeat batch (checked by tests). ``plausible`` releases only records that pass its test, so
#: an empty window releases no rows; ``sbhg``'s measurements fire on every declared window (the
#: heartbeats of ``combine_globally``) but its per-window files are not tested end to end:
#: :class:`WindowedSynthesis` refuses both.
EMPTY_WINDOW_METHODS = ("independent", "privbayes")


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


@dataclass(frozen=True)
class OutsideCount:
    """Exact number of records in one input batch stamped outside the declared windows (not DP).

    Such records are dropped, never released and never open a window.
    """

    timestamp: str
    rows: int


def _iso(ts: Any) -> str:
    return _dt.datetime.fromtimestamp(float(ts), tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def window_output_path(output: str, window: Any) -> str:
    """``OUT`` with the window start inserted before the extension: ``day.csv`` →
    ``day.20240101T000000Z.csv``."""
    stamp = _iso(window.start).replace("-", "").replace(":", "")
    root, ext = os.path.splitext(output)
    return f"{root}.{stamp}{ext}"


def _window_temp_folder(output: str, run_id: str, window: Any) -> str:
    """The part folder of one window's release: ``.beamsynth-temp-<window file>-<run id>``."""
    folder, name = FileSystems.split(window_output_path(output, window))
    return FileSystems.join(folder, f"{TEMP_PREFIX}{name}-{run_id}")


class _WriteWindowPartFn(_WritePartFn):
    """pyarrow.Table → a part file in its window's temporary folder; emits
    ``(label, digest, path, rows)`` (in the table's window)."""

    def __init__(self, codec: _PartCodec, output: str, run_id: str) -> None:
        super().__init__(codec, "")
        self._output, self._run_id = output, run_id

    def _folder(self, window: Any) -> str:
        return _window_temp_folder(self._output, self._run_id, window)


class _WriteWindowReleaseFn(beam.DoFn):
    """Writes one window's synthetic CSV (its part files concatenated in label order: window,
    sampling shard) and manifest; rerun-safe.

    Memory: the window's group holds part paths and row counts only (never rows); the file is
    written by streaming part after part (``join_part_files``: staged under a temporary name,
    renamed, parts deleted; a retry after that re-writes only the manifest).
    """

    def __init__(self, *, plan_info: dict[str, Any], output: str, column_names: list[str],
                 run_id: str) -> None:
        self._info, self._output, self._names = plan_info, output, column_names
        self._run_id = run_id
        self._codec = _PartCodec("csv", column_names, None, None)

    def process(self, keyed, window=beam.DoFn.WindowParam) -> Iterable[WindowRelease]:
        rows = 0
        parts: list[tuple[str, str, str, int]] = []
        for tag, value in keyed[1]:
            if tag == "rows":
                rows = int(value)
            else:
                parts.append(value)
        # parts in (label, digest) order: the file does not depend on arrival order or worker
        parts.sort()
        path = window_output_path(self._output, window)
        join_part_files([p[2] for p in parts], _window_temp_folder(self._output, self._run_id, window),
                        path, self._codec.concatenate)
        written = sum(p[3] for p in parts)
        info = self._info
        manifest = build_manifest(
            command="synthesize --stream", method=info["method"], inputs=["stream"],
            outputs={"synthetic": path, "manifest": manifest_path(path)},
            schema_name=info["schema_name"], schema_fingerprint=info["schema_fingerprint"],
            accountant=info["budget"], seed=info["seed"], privacy_unit=info["privacy_unit"],
            counts={"rows_out": written},
            details={"window": {"start": _iso(window.start), "end": _iso(window.end)},
                     "rows_planned": rows, "guarantee": info["guarantee"],
                     "late_data": info["late_data"], "declared_windows": info["declared_windows"],
                     "method": info["method_details"]},
        )
        write_json_atomic(manifest_path(path), manifest)
        yield WindowRelease(_iso(window.start), _iso(window.end), written, path,
                            manifest_path(path), info["budget"])


class _CountLateFn(beam.DoFn):
    """Per pane of the late-counting branch: emit the count of LATE panes only."""

    def process(self, count: int, window=beam.DoFn.WindowParam,
                pane=beam.DoFn.PaneInfoParam) -> Iterable[LateCount]:
        if is_late_pane(pane) and count:
            yield LateCount(_iso(window.start), _iso(window.end), int(count))


def empty_batch(schema: Schema) -> EncodedBatch:
    """An ``EncodedBatch`` with no rows for ``schema`` (code dtype as ``encode_columns``)."""
    dtype = np.int32 if all(c.cells < 2**31 for c in schema.columns) else np.int64
    pids = None if schema.privacy_id is None else np.empty(0, dtype=object)
    return EncodedBatch(np.zeros((0, len(schema.columns)), dtype=dtype), pids)


class _EmptyBatchAtFn(beam.DoFn):
    """Timestamp (epoch seconds) → empty batch stamped at that time (a window's heartbeat)."""

    def __init__(self, schema: Schema) -> None:
        self._schema = schema

    def process(self, ts: Any) -> Iterable[Any]:
        yield beam_window.TimestampedValue(empty_batch(self._schema), float(ts))


@element_types(output=EncodedBatch)
class WindowHeartbeat(beam.PTransform):
    """One empty ``EncodedBatch`` per declared window, stamped at the window start.

    ``windows_end`` given: a bounded ``Create`` of ``(windows_end - windows_start) /
    window_seconds`` heartbeats. ``windows_end=None`` (an open-ended, unbounded stream):
    ``PeriodicImpulse`` firing every ``window_seconds`` from ``windows_start`` (processing
    time; past windows fire at once), so every window from ``windows_start`` on gets its
    heartbeat before the watermark can pass it. Apply to a pipeline; output in the global window
    (window it like the data).
    """

    def __init__(self, *, schema: Schema, windows_start: int | _dt.datetime,
                 windows_end: int | _dt.datetime | None, window_seconds: int = DAY,
                 label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(schema, Schema):
            raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
        self._start, self._end = _declared_range(windows_start, windows_end, window_seconds)
        self._schema, self._seconds = schema, window_seconds

    def display_data(self) -> dict[str, Any]:
        """The declared windows (public; no data values)."""
        return display_items(step="one empty batch per declared window",
                             windows_start=_iso(self._start),
                             windows_end="open" if self._end is None else _iso(self._end),
                             window_seconds=self._seconds)

    def expand(self, pbegin):
        if self._end is None:
            ticks = pbegin | "Tick" >> PeriodicImpulse(
                start_timestamp=self._start, fire_interval=float(self._seconds))
            # Timestamp per window start, unbounded
        else:
            ticks = pbegin | "WindowStarts" >> beam.Create(
                list(range(self._start, self._end, self._seconds)))
            # int window start per declared window
        return ticks | "EmptyBatch" >> beam.ParDo(_EmptyBatchAtFn(self._schema))
        # empty EncodedBatch stamped at its window start


class _SplitDeclaredFn(beam.DoFn):
    """Batches stamped inside ``[start, end)`` pass; others go to ``outside`` (counted)."""

    OUTSIDE = "outside"

    def __init__(self, start: int, end: int | None) -> None:
        self._start, self._end = start, end

    def process(self, batch: EncodedBatch, ts=beam.DoFn.TimestampParam) -> Iterable[Any]:
        t = float(ts)
        if t >= self._start and (self._end is None or t < self._end):
            yield batch
            return
        beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows_outside_windows").inc(len(batch))
        yield beam.pvalue.TaggedOutput(self.OUTSIDE, OutsideCount(_iso(t), len(batch)))


def _batch_rows(batch: EncodedBatch) -> int:
    return len(batch)


def _tag_part(part: tuple[str, str, str, int]) -> tuple[int, tuple[str, Any]]:
    return 0, ("part", part)


@element_types(input=EncodedBatch, outputs={"releases": WindowRelease, "late": LateCount,
                                            "outside": OutsideCount, "tables": pa.Table,
                                            "batches": EncodedBatch})
class WindowedSynthesis(beam.PTransform):
    """Per-window DP synthesis of timestamped ``EncodedBatch`` input; one release per window.

    Args:
      plan: from :func:`~beamsynth.pipelines.methods.synthesize.plan_synthesis`; its budget is the budget
        **of each window** (spent once, at build time). Its method must be one of
        :data:`EMPTY_WINDOW_METHODS`.
      output: synthetic file pattern (``.csv``); window files are ``window_output_path(output, w)``.
      windows_start: start of the first declared window (epoch seconds or an aware datetime, a
        multiple of ``window_seconds``). Public: declare it, never read it off the data.
      windows_end: end (exclusive) of the last declared window, same form; ``None`` declares every
        window from ``windows_start`` on (unbounded stream; heartbeats from ``PeriodicImpulse``).
      window_seconds: fixed event-time window length (default one day).
      allowed_lateness: seconds a window stays open for the late-data count after the watermark
        passes its end (late records are counted, never released).

    Every declared window gets exactly one release, with or without records; records outside
    the declared range are dropped and counted (``outside``).

    Input: ``PCollection[EncodedBatch]`` with event timestamps (one window per batch).
    Output: ``{"releases": PCollection[WindowRelease], "late": PCollection[LateCount],
    "outside": PCollection[OutsideCount], "tables": PCollection[pyarrow.Table],
    "batches": bounded PCollection[EncodedBatch] (heartbeats included)}``.
    """

    def __init__(self, *, plan: SynthesisPlan, output: str, windows_start: int | _dt.datetime,
                 windows_end: int | _dt.datetime | None, window_seconds: int = DAY,
                 allowed_lateness: int = 0, label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(plan, SynthesisPlan):
            raise TypeError(f"plan must be a SynthesisPlan, got {type(plan).__name__}")
        if plan.method.name not in EMPTY_WINDOW_METHODS:
            raise ValueError(
                f"method {plan.method.name!r} cannot release an empty window (a window without "
                f"records would get no release, revealing that it was empty); windowed synthesis "
                f"supports {list(EMPTY_WINDOW_METHODS)}")
        self._start, self._end = _declared_range(windows_start, windows_end, window_seconds)
        if isinstance(allowed_lateness, bool) or not isinstance(allowed_lateness, int) or allowed_lateness < 0:
            raise ValueError(f"allowed_lateness ({allowed_lateness!r}) must be an int >= 0")
        if not output.lower().endswith(".csv"):
            raise ValueError(f"output ({output!r}) must be a .csv path for windowed releases")
        if fs.is_local(output):  # workers may run in another folder than the launcher
            output = os.path.abspath(output)
        self._plan, self._output = plan, output
        self._run_id = uuid.uuid4().hex  # names the windows' temporary part folders
        self._seconds, self._lateness = window_seconds, allowed_lateness

    def remove_temp_folders(self) -> list[str]:
        """Delete the windows' temporary part folders left by a failed run; returns them (see
        :func:`~beamsynth.pipelines.io.single_file.remove_temp_folders_on_failure`)."""
        folder, _ = FileSystems.split(self._output)
        pattern = FileSystems.join(folder, f"{TEMP_PREFIX}*-{self._run_id}", "*")
        found = sorted({FileSystems.split(m.path)[0]
                        for m in FileSystems.match([pattern])[0].metadata_list})
        if found:
            FileSystems.delete(found)
        return found

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
            "declared_windows": {"start": _iso(self._start),
                                 "end": None if self._end is None else _iso(self._end),
                                 "window_seconds": self._seconds,
                                 "policy": "one release per declared window, with or without "
                                           "records; records outside dropped and counted "
                                           "(operational, not DP)"},
        }

    def _window(self) -> beam.WindowInto:
        return beam.WindowInto(
            DeclaredWindows(start=self._start, end=self._end, size=self._seconds),
            trigger=trigger.AfterWatermark(),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
            allowed_lateness=Duration(seconds=self._lateness))

    def display_data(self) -> dict[str, Any]:
        """Method, the budget of each window and the declared windows (no data values)."""
        total = self._plan.accountant.total
        return display_items(
            mechanism=f"{self._plan.method.name} synthesis per declared window",
            epsilon_per_window=total.epsilon, delta_per_window=total.delta,
            declared_cells=sum(self._plan.schema.shape),
            windows_start=_iso(self._start),
            windows_end="open" if self._end is None else _iso(self._end),
            window_seconds=self._seconds, allowed_lateness=self._lateness)

    def expand(self, batches):
        plan, cfg = self._plan, self._plan.config
        split = batches | "DeclaredWindows" >> beam.ParDo(
            _SplitDeclaredFn(self._start, self._end)).with_outputs(_SplitDeclaredFn.OUTSIDE,
                                                                   main="inside")
        batches, outside = split["inside"], split[_SplitDeclaredFn.OUTSIDE]
        # EncodedBatch stamped in a declared window; OutsideCount per dropped batch
        windowed = batches | "Window" >> self._window()
        # EncodedBatch per daily window, fired once
        late = (
            batches
            | "WindowForLate" >> late_windowing(beam_window.FixedWindows(self._seconds), self._lateness)
            | "RowsPerBatch" >> beam.Map(_batch_rows)
            | "SumRows" >> beam.CombineGlobally(sum).without_defaults()
            | "LatePanes" >> beam.ParDo(_CountLateFn())
        )
        # LateCount per late pane
        if plan.schema.privacy_id is not None:
            windowed = windowed | "BoundContributions" >> BoundContributions(
                max_contributions=cfg.max_contributions, seed=cfg.seed)
            # EncodedBatch, <= k rows per privacy id per window
        heartbeats = (
            batches.pipeline
            | "Heartbeat" >> WindowHeartbeat(schema=plan.schema, windows_start=self._start,
                                             windows_end=self._end, window_seconds=self._seconds)
            | "WindowHeartbeat" >> self._window())
        # one empty EncodedBatch per declared window (after bounding: bounding drops empty input)
        windowed = (windowed, heartbeats) | "WithHeartbeats" >> beam.Flatten()
        # EncodedBatch per window; every declared window has at least the empty batch
        tables, _models, rows = synthesize_batches(windowed, plan, side_input=False)
        # pyarrow.Table shards (labelled window, shard); rows: int per window
        names = list(plan.schema.names)
        parts = tables | "WriteParts" >> beam.ParDo(_WriteWindowPartFn(
            _PartCodec("csv", names, None, None), self._output, self._run_id))
        # (label, digest, part path, rows) per window: rows written where they are sampled
        releases = (
            (parts | "KeyParts" >> beam.Map(_tag_part),
             rows | "KeyPlanned" >> beam.Map(lambda r: (0, ("rows", r))))
            | "JoinTables" >> beam.Flatten()
            | "GroupWindow" >> beam.GroupByKey()
            # (0, Iterable[("rows", n) | ("part", (label, digest, path, rows))]) per window
            | "WriteRelease" >> beam.ParDo(_WriteWindowReleaseFn(
                plan_info=self._plan_info(), output=self._output, column_names=names,
                run_id=self._run_id))
            # WindowRelease per window
        )
        return {"releases": releases, "late": late, "outside": outside, "tables": tables,
                "batches": windowed}

