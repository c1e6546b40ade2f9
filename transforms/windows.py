"""Declared event-time windows: the only non-global windowing a DP release accepts.

A Beam window exists only once an element lands in it. A measurement that released once per
non-empty window (``CombineGlobally(...).without_defaults()``) would therefore release on a
window whose only record is Alice's and release nothing without her: the *existence* of the
release reveals her (ε = ∞). So every release step in beamsynth (each goes through
:func:`~beamsynth.transforms.measure.combine_globally`) checks the windowing of its input when the
pipeline is built (:func:`check_release_windowing`):

* the **global window** with the default trigger: one release, on empty input too;
* :class:`DeclaredWindows` (fixed event-time windows over a declared, public range): exactly one
  release per declared window, whether or not it holds records. Each measurement flattens one
  :class:`Heartbeat` per declared window (stamped at the window start) into its combine, which
  ignores it (:class:`HeartbeatCombineFn`), so every declared window has an element and
  fires once (:class:`CombineDeclaredWindows`). Records stamped outside the declared range are dropped before the measurement
  (:class:`DropOutsideDeclared`, counted in the ``beamsynth/rows_outside_declared_windows``
  metric, exact and not DP: an operational count for the data owner);
* anything else (``FixedWindows``, ``SlidingWindows``, ``Sessions``, the global window with a
  data-driven trigger, …) is refused with a :class:`ValueError` naming the step, the windowing and
  the fix.

Triggers: a release must fire once per window. Accepted are the default trigger (with zero
allowed lateness on declared windows: with lateness the default trigger fires again for every late
record) and ``AfterWatermark()`` without early or late firings (any allowed lateness: late records
are dropped). Early/late firings, ``AfterCount``, ``Repeatedly``, processing-time triggers would
make the number of releases depend on the data and are refused.

:class:`DeclaredWindows` is a ``FixedWindows`` (it assigns the same windows and runs on every
runner as fixed windows); it only carries the declared range, which the checks read at build time.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable
from typing import Any

import apache_beam as beam
from apache_beam.transforms import trigger as beam_trigger
from apache_beam.transforms import window as beam_window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.conventions import display_items

__all__ = [
    "CombineDeclaredWindows",
    "DeclaredWindows",
    "DropOutsideDeclared",
    "Heartbeat",
    "HeartbeatCombineFn",
    "Heartbeats",
    "check_release_windowing",
    "declared_range",
    "epoch_seconds",
    "iso_seconds",
]

METRICS_NAMESPACE = "beamsynth"
_DOCS = "docs/streaming.md"


def epoch_seconds(value: Any, name: str) -> int:
    """Whole epoch seconds of an int or a timezone-aware datetime (``name`` for messages)."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise ValueError(f"{name} ({value!r}) must be timezone-aware (e.g. tzinfo=timezone.utc)")
        ts = value.timestamp()
        if ts != int(ts):
            raise ValueError(f"{name} ({value!r}) must be a whole second")
        return int(ts)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be epoch seconds (int) or an aware datetime, got {value!r}")
    return value


def declared_range(windows_start: Any, windows_end: Any, window_seconds: Any) -> tuple[int, int | None]:
    """Validated ``(start, end or None)`` epoch seconds of declared fixed windows.

    Windows are aligned to the epoch: both ends must be multiples of ``window_seconds``; ``end``
    (exclusive) is after ``start``, or ``None`` for every window from ``start`` on.
    """
    if isinstance(window_seconds, bool) or not isinstance(window_seconds, int) or window_seconds < 1:
        raise ValueError(f"window_seconds ({window_seconds!r}) must be an int >= 1")
    start = epoch_seconds(windows_start, "windows_start")
    end = None if windows_end is None else epoch_seconds(windows_end, "windows_end")
    for name, value in (("windows_start", start), ("windows_end", end)):
        if value is not None and value % window_seconds:
            raise ValueError(f"{name} ({value}) must be a multiple of window_seconds "
                             f"({window_seconds}): windows are aligned to the epoch")
    if end is not None and end <= start:
        raise ValueError(f"windows_end ({end}) must be after windows_start ({start})")
    return start, end


def iso_seconds(ts: Any) -> str:
    """An event time (epoch seconds or a Beam ``Timestamp``) as ISO 8601 UTC, e.g.
    ``2024-01-01T00:00:00Z`` (the ``window_start`` of API output rows)."""
    return _dt.datetime.fromtimestamp(float(ts), tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_iso = iso_seconds


def event_time_text(ts: Any) -> str:
    """:func:`iso_seconds`, or a hint for Beam's minimum/maximum timestamps (rows never stamped):
    the event time a dead letter's reason echoes."""
    try:
        return iso_seconds(ts)
    except (OverflowError, ValueError, OSError):
        return f"{float(ts):.0f} (none assigned? stamp the elements upstream)"


class DeclaredWindows(beam_window.FixedWindows):
    """Fixed event-time windows of ``size`` seconds over the public range ``[start, end)``.

    Use it like ``FixedWindows``: ``pcoll | beam.WindowInto(DeclaredWindows(start=..., end=...,
    size=...))``. Every beamsynth release step downstream then releases exactly once per declared
    window (data or not) and drops records stamped outside ``[start, end)``. ``start``/``end`` are
    epoch seconds or timezone-aware datetimes, multiples of ``size``; ``end=None`` declares every
    window from ``start`` on (an unbounded stream: heartbeats from ``PeriodicImpulse``). Declare
    the range, never read it off the data.
    """

    def __init__(self, *, start: int | _dt.datetime, end: int | _dt.datetime | None,
                 size: int) -> None:
        self.declared_start, self.declared_end = declared_range(start, end, size)
        super().__init__(size)
        self.seconds = size

    def window_starts(self) -> list[int] | None:
        """The start of every declared window (``None`` when the range is open-ended)."""
        if self.declared_end is None:
            return None
        return list(range(self.declared_start, self.declared_end, self.seconds))

    def start_labels(self) -> list[str] | None:
        """Every declared window's start as ISO 8601 UTC, as in the ``window_start`` field of API
        output rows (``None`` when the range is open-ended): the names of per-window files, known
        before any data is read."""
        starts = self.window_starts()
        return None if starts is None else [iso_seconds(t) for t in starts]

    def contains(self, timestamp: Any) -> bool:
        """Whether an event time (epoch seconds) lies in a declared window."""
        t = float(timestamp)
        return t >= self.declared_start and (self.declared_end is None or t < self.declared_end)

    def describe(self) -> dict[str, Any]:
        """JSON form for manifests: the declaration (public)."""
        return {"start": _iso(self.declared_start),
                "end": None if self.declared_end is None else _iso(self.declared_end),
                "window_seconds": self.seconds}

    def __eq__(self, other: object) -> bool:
        return (type(other) is DeclaredWindows and other.seconds == self.seconds
                and other.declared_start == self.declared_start
                and other.declared_end == self.declared_end)

    def __hash__(self) -> int:
        return hash((DeclaredWindows, self.seconds, self.declared_start, self.declared_end))

    def __repr__(self) -> str:
        return (f"DeclaredWindows(start={self.declared_start}, end={self.declared_end}, "
                f"size={self.seconds})")


def _trigger_fires_once(windowing: Any, declared: bool) -> bool:
    trig = windowing.triggerfn
    if isinstance(trig, beam_trigger.DefaultTrigger):
        # the default trigger fires again for every late record when lateness > 0
        return not declared or int(windowing.allowed_lateness.micros) == 0
    return type(trig) is beam_trigger.AfterWatermark and trig.early is None and trig.late is None


def _secs(duration: Any) -> str:
    return f"{int(duration.micros) / 1e6:g}s"


def _describe_windowfn(fn: Any) -> str:
    """A readable form of a WindowFn for messages (Beam's have no useful repr)."""
    if isinstance(fn, (beam_window.FixedWindows, beam_window.SlidingWindows)):
        extra = f", period={_secs(fn.period)}" if isinstance(fn, beam_window.SlidingWindows) else ""
        return f"{type(fn).__name__}(size={_secs(fn.size)}{extra})"
    if isinstance(fn, beam_window.Sessions):
        return f"Sessions(gap={_secs(fn.gap_size)})"
    return type(fn).__name__


def _full_label(pcoll: beam.PCollection, step: str) -> str:
    """``step`` prefixed with the composite being expanded (e.g. ``DPCount/CountRows``)."""
    current = getattr(pcoll.pipeline, "_current_transform", None)
    outer = getattr(current(), "full_label", "") if callable(current) else ""
    return f"{outer}/{step}" if outer else step


def check_release_windowing(pcoll: beam.PCollection, step: str, *,
                            qualify: bool = True) -> DeclaredWindows | None:
    """The declared windows of ``pcoll`` (``None``: the global window), or ``ValueError``.

    Called when the pipeline is built, before any data is read, by every step that releases
    per window. ``step`` names the step in the message, prefixed with the composite being
    expanded unless ``qualify`` is false.
    """
    windowing = pcoll.windowing
    fn = windowing.windowfn
    step = _full_label(pcoll, step) if qualify else step
    declared = isinstance(fn, DeclaredWindows)
    if not declared and not isinstance(fn, beam_window.GlobalWindows):
        raise ValueError(
            f"{step}: input is windowed with {_describe_windowfn(fn)}; a release per window that opens only when a "
            "record arrives would reveal that record (ε = ∞). Window the input with "
            "beam.WindowInto(DeclaredWindows(start=..., end=..., size=...)) from "
            "beamsynth.transforms.windows (one release per declared window, with or without "
            f"records) or keep the global window; see {_DOCS}")
    if not _trigger_fires_once(windowing, declared):
        raise ValueError(
            f"{step}: trigger {windowing.triggerfn!r} (allowed lateness "
            f"{_secs(windowing.allowed_lateness)}) can fire more than once per window, so the number of "
            "releases would depend on the data; use the default trigger (no allowed lateness) or "
            f"AfterWatermark() without early/late firings; see {_DOCS}")
    return fn if declared else None


class Heartbeat:
    """The element a declared window gets even when no record lands in it (carries nothing)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Heartbeat)

    def __hash__(self) -> int:
        return hash(Heartbeat)

    def __repr__(self) -> str:
        return "Heartbeat()"


def _heartbeat_at(ts: Any) -> beam_window.TimestampedValue:
    return beam_window.TimestampedValue(Heartbeat(), float(ts))


class Heartbeats(beam.PTransform):
    """One :class:`Heartbeat` per declared window, stamped at the window start (global window;
    window it like the data). A bounded ``Create`` for a closed range, ``PeriodicImpulse`` (every
    ``size`` seconds from ``start``, processing time) for an open one."""

    def __init__(self, windows: DeclaredWindows, label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(windows, DeclaredWindows):
            raise TypeError(f"windows must be DeclaredWindows, got {type(windows).__name__}")
        self._windows = windows

    def display_data(self) -> dict[str, Any]:
        """The declared windows (public; no data values)."""
        return display_items(step="one heartbeat per declared window", **_declared(self._windows))

    def expand(self, pbegin):
        starts = self._windows.window_starts()
        if starts is None:
            ticks = pbegin | "Tick" >> PeriodicImpulse(
                start_timestamp=self._windows.declared_start,
                fire_interval=float(self._windows.seconds))
        else:
            ticks = pbegin | "WindowStarts" >> beam.Create(starts)
        # window start (epoch seconds) per declared window
        return ticks | "Stamp" >> beam.Map(_heartbeat_at)
        # Heartbeat stamped at its window start


def _rows(element: Any) -> int:
    return len(element) if isinstance(element, EncodedBatch) else 1


class _DropOutsideFn(beam.DoFn):
    def __init__(self, windows: DeclaredWindows) -> None:
        self._windows = windows

    def process(self, element: Any, ts=beam.DoFn.TimestampParam) -> Iterable[Any]:
        if self._windows.contains(ts):
            yield element
        else:
            beam.metrics.Metrics.counter(METRICS_NAMESPACE, "rows_outside_declared_windows").inc(
                _rows(element))


class DropOutsideDeclared(beam.PTransform):
    """Elements stamped outside the declared range are dropped (counted in the exact, non-DP
    metric ``beamsynth/rows_outside_declared_windows``: rows of an ``EncodedBatch``, else 1);
    the rest pass unchanged. Each element is judged on its own timestamp (stable)."""

    def __init__(self, windows: DeclaredWindows, label: str | None = None) -> None:
        super().__init__(label)
        self._windows = windows

    def display_data(self) -> dict[str, Any]:
        """The declared windows (public; no data values)."""
        return display_items(step="drop (and count) elements outside the declared windows",
                             **_declared(self._windows))

    def expand(self, pcoll):
        return pcoll | "DropOutside" >> beam.ParDo(_DropOutsideFn(self._windows))


def _declared(windows: DeclaredWindows) -> dict[str, Any]:
    end = windows.declared_end
    return {"windows_start": windows.declared_start, "windows_end": "open" if end is None else end,
            "window_seconds": windows.seconds}


class _AccumulateFn(beam.CombineFn):
    """``fn`` whose output is its (merged, compacted) accumulator: the first of two stages."""

    def __init__(self, fn: beam.CombineFn) -> None:
        self._fn = fn

    def setup(self, *args: Any, **kwargs: Any) -> None:
        self._fn.setup(*args, **kwargs)

    def create_accumulator(self) -> Any:
        return self._fn.create_accumulator()

    def add_input(self, acc: Any, element: Any) -> Any:
        return self._fn.add_input(acc, element)

    def merge_accumulators(self, accumulators: Any) -> Any:
        return self._fn.merge_accumulators(accumulators)

    def compact(self, acc: Any) -> Any:
        return self._fn.compact(acc)

    def extract_output(self, acc: Any) -> Any:
        return self._fn.compact(acc)

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        self._fn.teardown(*args, **kwargs)


class HeartbeatCombineFn(_AccumulateFn):
    """Second stage: merges ``fn``'s accumulators (inputs) and ignores :class:`Heartbeat` inputs,
    so a window holding only its heartbeat yields ``fn``'s output on empty input."""

    def add_input(self, acc: Any, element: Any) -> Any:
        if isinstance(element, Heartbeat):
            return acc
        return self._fn.merge_accumulators([acc, element])

    def extract_output(self, acc: Any) -> Any:
        return self._fn.extract_output(acc)


class CombineDeclaredWindows(beam.PTransform):
    """``CombineGlobally(fn)`` that emits exactly once per declared window, with or without records.

    Input elements stamped outside the declared range are dropped (:class:`DropOutsideDeclared`);
    the rest are combined into ``fn``'s accumulator per window; one :class:`Heartbeat` per
    declared window, windowed like the input, is flattened with those accumulators and a second
    combine (:class:`HeartbeatCombineFn`) merges them ignoring the heartbeat, so a window without
    records yields ``fn``'s output on empty input.
    """

    def __init__(self, fn: beam.CombineFn, windows: DeclaredWindows, label: str | None = None) -> None:
        super().__init__(label)
        if not isinstance(windows, DeclaredWindows):
            raise TypeError(f"windows must be DeclaredWindows, got {type(windows).__name__}")
        self._fn, self._windows = fn, windows

    def display_data(self) -> dict[str, Any]:
        """The combine and the declared windows (public; no data values)."""
        return display_items(step="combine once per declared window, with or without records",
                             combine_fn=type(self._fn).__name__, **_declared(self._windows))

    def expand(self, pcoll):
        w = pcoll.windowing
        inside = pcoll | "DropOutside" >> DropOutsideDeclared(self._windows)
        # input elements stamped in a declared window
        beats = (pcoll.pipeline
                 | "Heartbeats" >> Heartbeats(self._windows)
                 | "WindowHeartbeats" >> beam.WindowInto(
                     w.windowfn, trigger=w.triggerfn, accumulation_mode=w.accumulation_mode,
                     timestamp_combiner=w.timestamp_combiner, allowed_lateness=w.allowed_lateness))
        # one Heartbeat per declared window
        partial = inside | "Accumulate" >> beam.CombineGlobally(_AccumulateFn(self._fn)).without_defaults()
        # fn's accumulator per window holding records. Heartbeats join after this GroupByKey, not
        # before: flattening a new root into the output of a side-input consumer stalls the
        # FnApiRunner ("watermark-pending bundles did not execute")
        return ((partial, beats)
                | "WithHeartbeats" >> beam.Flatten()
                | "Combine" >> beam.CombineGlobally(HeartbeatCombineFn(self._fn)).without_defaults())
        # fn's output, once per declared window
