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
make the number of releases depend on the data and are refused. :class:`CombineDeclaredWindows`
itself combines under ``AfterWatermark()``, which closes a window when it fires: the default
trigger, even with zero lateness, fired a second release for a record arriving while the
watermark sat exactly at the window's end (TestStream: day 2 released as 0, then as 7).

Late records (a stream): a release fires once, so a record arriving after it is dropped by
Beam. :class:`SplitLate` decides once per record whether it is late (one grouping under
:func:`late_windowing`, the late-branch windowing also used by ``pipelines/stream.py``'s
``LateCount``) and routes the late ones away *before* any release step, which the public API
turns into dead letters (``transforms/private.py``).

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
from apache_beam.utils.timestamp import Duration
from apache_beam.utils.windowed_value import PaneInfoTiming

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.conventions import display_items, keywords_checked

__all__ = [
    "CombineDeclaredWindows",
    "DeclaredWindows",
    "DropOutsideDeclared",
    "Heartbeat",
    "HeartbeatCombineFn",
    "Heartbeats",
    "LATE_LATENESS",
    "SplitLate",
    "check_release_windowing",
    "declared_range",
    "epoch_seconds",
    "is_late_pane",
    "iso_seconds",
    "late_windowing",
    "window_text",
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
        raise TypeError(f"{name} must be epoch seconds (int) or an aware datetime, got {value!r}"
                        + _iso_hint(value))
    return value


def _iso_hint(value: Any) -> str:
    """For ISO 8601 text (``"2024-01-01T00:00:00Z"``, H87), the datetime to pass instead."""
    try:
        parsed = _dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return ""
    if parsed is None:
        return ""
    utc = "" if parsed.tzinfo is not None else ".replace(tzinfo=datetime.timezone.utc)"
    return f"; pass datetime.datetime.fromisoformat({value!r}){utc}"


def declared_range(windows_start: Any, windows_end: Any, window_seconds: Any, *,
                   names: tuple[str, str, str] = ("windows_start", "windows_end", "window_seconds"),
                   ) -> tuple[int, int | None]:
    """Validated ``(start, end or None)`` epoch seconds of declared fixed windows.

    Windows are aligned to the epoch: both ends must be multiples of ``window_seconds``; ``end``
    (exclusive) is after ``start``, or ``None`` for every window from ``start`` on. ``names``: the
    caller's names of the three parameters, for messages.
    """
    n_start, n_end, n_size = names
    if isinstance(window_seconds, bool) or not isinstance(window_seconds, int) or window_seconds < 1:
        raise ValueError(f"{n_size} ({window_seconds!r}) must be an int >= 1")
    start = epoch_seconds(windows_start, n_start)
    end = None if windows_end is None else epoch_seconds(windows_end, n_end)
    for name, value in ((n_start, start), (n_end, end)):
        if value is not None and value % window_seconds:
            raise ValueError(f"{name} ({value}) must be a multiple of {n_size} "
                             f"({window_seconds}): windows are aligned to the epoch")
    if end is not None and end <= start:
        raise ValueError(f"{n_end} ({end}) must be after {n_start} ({start})")
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

    Give it to ``job.private(schema, windows=bs.DeclaredWindows(start=..., end=..., size=...))``
    (or window the timestamped input with ``beam.WindowInto(...)`` before ``job.private``, like
    ``FixedWindows``). Every beamsynth release step downstream then releases exactly once per
    declared window (data or not); a record stamped outside ``[start, end)`` is a dead letter
    (``timestamp ... is outside the declared windows ...``), counted as read and rejected in the
    manifest. ``start``/``end`` are
    epoch seconds or timezone-aware datetimes, multiples of ``size``; ``end=None`` declares every
    window from ``start`` on (an unbounded stream: heartbeats from ``PeriodicImpulse``). Declare
    the range, never read it off the data.
    """

    @keywords_checked  # DeclaredWindows(0, 3600, 600): the values echoed as the keyword call
    def __init__(self, *, start: int | _dt.datetime, end: int | _dt.datetime | None,
                 size: int) -> None:
        self.declared_start, self.declared_end = declared_range(
            start, end, size, names=("start", "end", "size"))
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

    def outside_reason(self, timestamp: Any) -> str:
        """Dead-letter reason of an element stamped outside every declared window (its own
        timestamp and the declared range only)."""
        end = "open" if self.declared_end is None else iso_seconds(self.declared_end)
        return (f"timestamp {event_time_text(timestamp)} is outside the declared windows "
                f"[{iso_seconds(self.declared_start)}, {end})")

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


def declared_instead(fn: Any) -> str:
    """What ``job.private(schema, windows=fn)`` got, and the declared windows to pass instead:
    ``FixedWindows(size=3600s): ...; declare the public range instead: windows=bs.DeclaredWindows(
    start=..., end=..., size=3600)`` (H87: the refusal showed ``<... FixedWindows object at 0x...>``)."""
    if not isinstance(fn, beam_window.WindowFn):
        return f"{type(fn).__name__} ({fn!r})"
    size = _secs(fn.size)[:-1] if isinstance(fn, beam_window.FixedWindows) else "..."
    return (f"{_describe_windowfn(fn)}: a Beam window opens only where a record falls, which a "
            "release must not reveal; declare the public range instead: "
            f"windows=bs.DeclaredWindows(start=..., end=..., size={size})")


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
        # AfterWatermark() finishes a window when it fires: the default trigger fires again for a
        # record arriving while the watermark is exactly at the window's end (a second release)
        once = {"trigger": beam_trigger.AfterWatermark(),
                "accumulation_mode": beam_trigger.AccumulationMode.DISCARDING,
                "timestamp_combiner": w.timestamp_combiner, "allowed_lateness": w.allowed_lateness}
        inside = (pcoll
                  | "DropOutside" >> DropOutsideDeclared(self._windows)
                  | "FireOnce" >> beam.WindowInto(w.windowfn, **once))
        # input elements stamped in a declared window
        beats = (pcoll.pipeline
                 | "Heartbeats" >> Heartbeats(self._windows)
                 | "WindowHeartbeats" >> beam.WindowInto(w.windowfn, **once))
        # one Heartbeat per declared window
        partial = inside | "Accumulate" >> beam.CombineGlobally(_AccumulateFn(self._fn)).without_defaults()
        # fn's accumulator per window holding records. Heartbeats join after this GroupByKey, not
        # before: flattening a new root into the output of a side-input consumer stalls the
        # FnApiRunner ("watermark-pending bundles did not execute")
        return ((partial, beats)
                | "WithHeartbeats" >> beam.Flatten()
                | "Combine" >> beam.CombineGlobally(HeartbeatCombineFn(self._fn)).without_defaults())
        # fn's output, once per declared window


# -- late records ------------------------------------------------------------------------------
#: Seconds after its end that a window's late branch keeps catching late records (a year; Beam
#: drops records later than that without a trace: docs/streaming.md "Late data").
LATE_LATENESS = 365 * 86_400


def late_windowing(windowfn: beam_window.WindowFn, allowed_lateness: int = 0, *,
                   early: bool = False) -> beam.WindowInto:
    """The windowing of a late branch: the on-time pane when the watermark passes a window's end,
    then one ``LATE`` pane per late arrival (:func:`is_late_pane`), for
    ``max(allowed_lateness, LATE_LATENESS)`` seconds; discarding, so each record is in one pane.
    ``early=True`` also fires a pane per arrival before the end, so the branch holds no records
    while it waits for the watermark."""
    return beam.WindowInto(
        windowfn,
        trigger=beam_trigger.AfterWatermark(
            early=beam_trigger.AfterCount(1) if early else None, late=beam_trigger.AfterCount(1)),
        accumulation_mode=beam_trigger.AccumulationMode.DISCARDING,
        allowed_lateness=Duration(seconds=max(int(allowed_lateness), LATE_LATENESS)))


def is_late_pane(pane: Any) -> bool:
    """Whether a pane of a :func:`late_windowing` branch holds records that arrived after the
    window's on-time pane fired."""
    return pane.timing == PaneInfoTiming.LATE


def window_text(window: Any) -> str:
    """``[start, end)`` of a window, ISO 8601 UTC (dead-letter reasons)."""
    return f"[{iso_seconds(window.start)}, {iso_seconds(window.end)})"


class _ShardFn(beam.DoFn):
    """element → ``(shard, element)``, shards taken in turn (any key works: a key's panes only
    spread the grouping; which records are late is decided per window)."""

    def __init__(self, shards: int) -> None:
        self._shards = shards

    def setup(self) -> None:
        self._next = 0

    def process(self, element: Any) -> Iterable[tuple[int, Any]]:
        self._next = (self._next + 1) % self._shards
        yield self._next, element


class _RouteLateFn(beam.DoFn):
    """``(shard, records)`` of one pane → the records: on the main output when the pane is early
    or on time, on ``late`` when it is late (in their window)."""

    def process(self, keyed: tuple[int, Iterable[Any]],
                pane=beam.DoFn.PaneInfoParam) -> Iterable[Any]:
        if is_late_pane(pane):
            for element in keyed[1]:
                yield beam.pvalue.TaggedOutput(SplitLate.LATE, element)
        else:
            yield from keyed[1]


class SplitLate(beam.PTransform):
    """Records of declared windows → ``{"on_time", "late"}``: each record exactly once, on
    ``late`` if it reaches the split after its window's release fired, else on ``on_time``.

    One decision per record, made by one grouping with :func:`late_windowing` (early panes per
    arrival, so nothing is held while a window is open): the records of early and on-time panes
    go on (``on_time``, windowed again like the input and stamped at their window's end, which
    Beam's watermark holds keep on time for every release downstream: a release fires once its
    input watermark passes the window's end, and a record of an on-time pane holds that
    watermark until it is consumed); the records of late panes go to ``late`` (in their window).
    A release downstream therefore never sees a late record (it can neither drop one unseen nor
    fire again for it). Records later than ``LATE_LATENESS`` after their window's end are dropped
    by Beam, uncounted. Only for unbounded input: a bounded one has no late records.
    """

    LATE = "late"

    def __init__(self, shards: int = 16, label: str | None = None) -> None:
        super().__init__(label)
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards ({shards!r}) must be an int >= 1")
        self._shards = shards

    def display_data(self) -> dict[str, Any]:
        """The late branch's settings (public; no data values)."""
        return display_items(step="records late for their window's release to 'late'",
                             late_lateness_seconds=LATE_LATENESS, shards=self._shards)

    def expand(self, pcoll):
        w = pcoll.windowing
        windows = check_release_windowing(pcoll, "SplitLate")
        if windows is None:
            raise ValueError(f"{_full_label(pcoll, 'SplitLate')}: input must be windowed with "
                             f"DeclaredWindows, not the global window; see {_DOCS}")
        routed = (pcoll
                  | "Shard" >> beam.ParDo(_ShardFn(self._shards))
                  | "LateWindowing" >> late_windowing(windows, int(w.allowed_lateness.micros) // 10**6,
                                                      early=True)
                  | "Panes" >> beam.GroupByKey()
                  # (shard, records) per pane: early/on-time or late
                  | "Route" >> beam.ParDo(_RouteLateFn()).with_outputs(self.LATE, main="on_time"))
        on_time = routed.on_time | "Rewindow" >> beam.WindowInto(
            w.windowfn, trigger=w.triggerfn, accumulation_mode=w.accumulation_mode,
            timestamp_combiner=w.timestamp_combiner, allowed_lateness=w.allowed_lateness)
        # records in time for their window's release, windowed like the input
        return {"on_time": on_time, "late": routed[self.LATE]}
        # late: records that arrived after their window's release, in their window
