"""``DaskRunner``: Beam's DaskRunner (apache-beam 2.77) with its translation gaps closed.

Beam's DaskRunner turns every primitive step into a ``dask.bag`` operation but (see
``docs/runners.md`` and :mod:`beamsynth.runners.probes`, one probe per gap):

1. computes only the **last-applied** step's bag, so a sink applied earlier (an output file next
   to a dead-letter file, a progress step applied after the sinks) silently never runs;
2. sends **every** output of a multi-output ParDo to every consumer;
3. drops what a DoFn emits from ``finish_bundle`` (results are collected before it is called);
4. recomputes a side input's whole upstream inside each consuming task (``list(bag)`` in a task),
   which made a side input fed by a ``GroupByKey`` of the main input silently wrong;
5. has no metrics (``metrics()`` raises), so the manifest's counts were ``null``;
6. ignores windows (``WindowInto`` and ``GroupAlsoByWindow`` are no-ops).

This runner keeps Beam's graph overrides (``Create``, ``GroupByKey``, ``Flatten``, ``Reshuffle``)
and its ``DaskOptions``, and translates the graph itself:

* ParDos are **fused into stages**, as Beam's own workers fuse them: a ParDo without side
  inputs whose input is another ParDo's output runs in that ParDo's stage, one task per
  partition (:func:`_run_stage`); an element a step emits is pushed at once through the steps
  reading it, so a read part's raw blocks are encoded and combined one at a time and never held
  together (before, each ParDo was a map returning a list: a Dask worker's peak memory grew with
  the rows of one read part, 3,650 MiB for a one-row-group 3M-row Parquet file against 351 MiB at
  100k rows);
* bags are kept **per output PCollection leaving a stage** (read by a ``GroupByKey``,
  ``Flatten``, ``Reshuffle``, a side input or a ParDo with side inputs); a stage's task returns
  ``(key, value)`` pairs and each such output selects its key (2), as a task named by the key
  (dask names tasks by a hash of function and arguments: a closure over the key would give
  every output the same name, hence the same bag);
* the bundle's outputs are collected **after** ``finish_bundle`` (3), called step by step in
  topological order so a step's ``finish_bundle`` outputs reach steps not yet finished;
* a side input is one ``dask.delayed`` list of its bag, an argument of the consuming tasks, so
  dask computes it **once** inside the same graph (4);
* each step of a bundle runs under its own Beam ``MetricsContainer``; the cumulative updates
  travel as more tagged elements and are merged in the launcher
  (:meth:`DaskRunnerResult.metrics`), so Beam counters work (5). A task dask re-runs after a lost
  worker replaces its result, so counts are exact. A stage whose only output leaving it is read
  by one ParDo alone hands its updates to that reader instead (:class:`_Carried`), so no bundle
  output waits for a metrics task;
* the run computes **every leaf** bag (steps nobody consumes: sinks, progress steps) plus the
  metrics in one graph, reduced to sizes on the workers so no element travels to the launcher (1).
  dask computes a task shared by several leaves once.

Windows: every ``ParDo`` subclass runs as a ParDo (Beam's runner skipped ``WindowInto`` and
``GroupAlsoByWindow``, so ``GroupByKey`` grouped across windows); values keep their windows in
the bags, so a windowed ``GroupByKey`` / combine gives one result per window (probe
``FixedWindows``). Elements of a ``Create`` get Beam's minimum timestamp.

Combines are **lifted** (:class:`_LiftCombinePerKey`, as Beam's DirectRunner does): every
``CombinePerKey`` (``CombineGlobally`` included) with non-merging windows runs as a per-bundle
partial combine, a ``GroupByKey`` of the accumulators, and the final merge. Beam's DaskRunner grouped
every input element of a combine under its key, so ``CombineGlobally`` gathered the whole data
set (every ``EncodedBatch``) in one task: a worker's peak memory grew with the input (1M Adult
rows: 755 MiB against 405 MiB on the DirectRunner).

Partitions follow the data, not the graph's ancestry: the ``GroupByKey`` of a ``CombineGlobally``
(one accumulator per bundle) is one task with one output partition, so the steps after it (the
model, the row count, shard planning) are one task each instead of one per read part; a
``Flatten`` concatenates its inputs partition by partition (``db.concat`` listed every input's
partitions: 5 times as many tasks as read parts after a few Flattens); a ``Reshuffle`` deals
exactly over as many partitions as the widest ``Create`` (:func:`_spread`). A 10M-row privbayes
``synthesize`` had 23,870 tasks (2,642 at 1M) in the launcher's scheduler.

A ``Create`` is split into one partition per element, up to 4 partitions per worker thread of
the cluster (:func:`_partition_cap`; Beam's default packed 128 elements into one partition, so a
few input files were all read by one task): a partition reads its file parts (16 MiB of CSV by
default) one after the other through the streaming read stage, so a task's memory does not grow
with its rows, and the graph's tasks follow the cluster, not the input's size. With one partition
per part (up to 256) a run had a task per part and step, and a worker keeps the state of nearly
every task it ran to the end of the run (:func:`_partition_cap`): 200k Adult rows read in 7 / 68 /
200 parts (2 workers × 1 thread) had 741 / 12,091 / 44,611 tasks in the scheduler, a worker
knew 388 / 5,937 / 23,036 and peaked at 369 / 351 / 476 MiB; with the cap 741 / 874 / 1,015
tasks, 336 / 412 / 566 known, 337 / 367 / 349 MiB, the same output bytes (docs/runners.md).
``--dask_npartitions`` / ``--dask_partition_size`` win. All five probes of
:mod:`beamsynth.runners.probes` are correct on this runner (``tests/pipeline/test_runners.py``).

Beam's bounded ``Read`` (``ReadFromText``, ``ReadFromParquet``, ``ReadFromParquetBatched``,
``ReadFromAvro``, any ``beam.io.Read`` of a ``BoundedSource``): Beam's DaskRunner replaced it with
a primitive it never translated, an empty bag (0 rows against 1,949 lines on the DirectRunner).
Here (:class:`_ReadBoundedSource`) the source is split in the launcher by its own
``split(desired_bundle_size)``, the desired size being its estimated size (file sizes, never the
contents) over the partitions (``--dask_npartitions``, else the cap above), at least
``_MIN_SPLIT_BYTES`` by default; each partition reads its splits (one, or several when a glob has
more files than partitions) through the source's range tracker as the root ParDo of a fused
stage, one element at a time (``tests/pipeline/test_dask_read.py``: the DirectRunner's elements
for text, .gz, globs, Parquet rows and batches, Avro; Adult's 5.6 MB CSV in 6 splits and 55.5 MB
in 8, worker peak RSS 193-195 vs 193-196 MiB). A ``process`` yielding batches
(``ReadFromParquet(as_rows=True)``) has its batches exploded into elements, as Beam's workers do.
Unbounded sources, splittable DoFns and other input-less primitives are refused when the
pipeline is built (:class:`_UnsupportedVisitor`); ``Impulse`` is its one empty element.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io.iobase import BoundedSource, SourceBundle
from apache_beam.metrics.execution import MetricsContainer
from apache_beam.metrics.metric import MetricResults
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor, PTransformOverride
from apache_beam.runners.common import Receiver
from apache_beam.runners.direct.direct_metrics import DirectMetrics
from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState
from apache_beam.transforms.combiners import LiftedCombinePerKey
from apache_beam.transforms.window import GlobalWindow, GlobalWindows, TimestampedValue, WindowFn
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

__all__ = ["BEAMSYNTH_DASK_RUNNER", "DaskRunner", "DaskRunnerResult"]

BEAMSYNTH_DASK_RUNNER = "beamsynth.runners.dask_runner.DaskRunner"
_METRICS = "__beamsynth_metrics__"  # tag of a bundle's metric updates (Beam tags are user names)
_MAX_CREATE_PARTITIONS = 256
_PARTITIONS_PER_THREAD = 4  # a Create's partitions per worker thread of the cluster (issue 17)
_MIN_SPLIT_BYTES = 1 << 20  # a bounded read's smallest desired split (Beam's smallest chunk)
_UNKNOWN_SIZE_SPLIT_BYTES = 64 << 20  # its split when the source cannot estimate its size


def _windowed(item: Any, window_fn: WindowFn | None) -> WindowedValue:
    """A bag element as a ``WindowedValue`` (global window unless it carries its own)."""
    if isinstance(item, WindowedValue):
        return item
    if isinstance(item, TimestampedValue) and window_fn is not None:
        ctx = WindowFn.AssignContext(item.timestamp, item.value)
        return WindowedValue(item.value, item.timestamp, tuple(window_fn.assign(ctx)))
    return WindowedValue(item, MIN_TIMESTAMP, (GlobalWindow(),))


def _value(item: Any) -> Any:
    return item.value if isinstance(item, WindowedValue) else item


class _Drop(Receiver):
    """Receiver of an output tag no step declared (Beam drops such outputs)."""

    def receive(self, windowed_value: WindowedValue) -> None:
        pass


class _Receivers(dict):
    """One ParDo's receivers by output tag (``None``: main); undeclared tags are dropped."""

    def __missing__(self, tag: str | None) -> Receiver:
        receiver = self[tag] = _Drop()
        return receiver


class _Push(Receiver):
    """One output of a stage's step: each element goes at once to the stage's steps reading it
    (their ``process`` runs under their own metrics container) and, if the output leaves the
    stage, to the task's result."""

    def __init__(self, run: _StageRun, readers: list[int], export: int | None,
                 batches: Any = None) -> None:
        self._run, self._readers, self._export = run, readers, export
        self._batches = batches  # the step's output BatchConverter (a process that yields batches)

    def receive(self, windowed_value: WindowedValue) -> None:
        run = self._run
        if self._export is not None:
            run.results.append(windowed_value if run.carry else (self._export, windowed_value))
        for i in self._readers:
            with run.scope(i):
                run.invokers[i].invoke_process(windowed_value)

    def receive_batch(self, windowed_batch: Any) -> None:
        """A batch from a ``process`` decorated ``@DoFn.yields_batches`` (``ReadFromParquet(
        as_rows=True)``'s Arrow table → Beam rows step), exploded into its elements as Beam's
        workers do for element consumers (before, the stages had no converter and would have
        passed the whole table on as one element)."""
        for windowed_value in windowed_batch.as_windowed_values(self._batches.explode_batch):
            self.receive(windowed_value)


@dataclass
class _SideSpec:
    view: type
    options: dict
    window_fn: Any


@dataclass
class _ParDoSpec:
    """One ParDo of a stage: its DoFn and, per output tag (``None``: main), the indices of the
    stage's steps reading it and its export key (``None``: read only inside the stage)."""

    fn: beam.DoFn
    label: str
    args: list
    kwargs: dict
    window_fn: Any
    outputs: dict[str | None, tuple[list[int], int | None]]


@dataclass
class _StageSpec:
    """A fused stage (pickled once per task by dask): ParDos in topological order, the first
    (the root) reading the task's partition and the side inputs, each other one reading one
    output of an earlier one as its only input."""

    steps: list[_ParDoSpec]
    sides: list[_SideSpec]


@dataclass
class _Carried:
    """A bundle's metric updates riding along its only consumer's input (see :func:`_run_stage`)."""

    updates: Any


class _StageRun:
    """The running state of one bundle of a stage: invokers, metrics containers, results."""

    def __init__(self, stage: _StageSpec, carry: bool, side_values: Sequence[list]) -> None:
        from apache_beam.runners.common import (
            DoFnContext,
            DoFnInvoker,
            DoFnSignature,
            _OutputHandler,
        )
        from apache_beam.runners.worker import statesampler
        from apache_beam.transforms.sideinputs import SideInputMap
        from apache_beam.utils import counters

        self.carry = carry
        self.results: list[Any] = []
        self.sampler = statesampler.StateSampler("", counters.CounterFactory())
        self.containers = [MetricsContainer(step.label) for step in stage.steps]
        self.invokers: list[Any] = []
        for i, step in enumerate(stage.steps):
            signature = DoFnSignature(step.fn)
            batches = getattr(step.fn, "output_batch_converter", None)
            yields_batches = getattr(signature.process_method.method_value,
                                     "_beam_yields_batches", False)
            receivers = _Receivers({tag: _Push(self, readers, export, batches)
                                    for tag, (readers, export) in step.outputs.items()})
            handler = _OutputHandler(window_fn=step.window_fn, main_receivers=receivers[None],
                                     tagged_receivers=receivers, per_element_output_counter=None,
                                     output_batch_converter=batches,
                                     process_yields_batches=yields_batches,
                                     process_batch_yields_elements=False)
            sides = [SideInputMap(s.view, s.options, [_windowed(v, s.window_fn) for v in values])
                     for s, values in zip(stage.sides, side_values)] if i == 0 else []
            self.invokers.append(DoFnInvoker.create_invoker(
                signature, handler, context=DoFnContext(step.label, state=None),
                side_inputs=sides, input_args=step.args, input_kwargs=step.kwargs,
                user_state_context=None, bundle_finalizer_param=beam.DoFn.BundleFinalizerParam()))
        self._labels = [step.label for step in stage.steps]

    def scope(self, i: int) -> Any:
        """Step ``i``'s state: Beam metrics reported in it go to its container."""
        return self.sampler.scoped_state(self._labels[i], "process",
                                         metrics_container=self.containers[i])

    def each(self, method: str) -> None:
        """``invoke_<method>`` of every step, in topological order (a ``finish_bundle``'s
        outputs reach steps that have not finished yet)."""
        for i, invoker in enumerate(self.invokers):
            with self.scope(i):
                getattr(invoker, f"invoke_{method}")()


def _run_stage(items: Iterable[Any], stage: _StageSpec, carry: bool, *side_values: list) -> list[Any]:
    """One dask partition = one bundle of a fused stage: setup and start every step, push each
    item through the stage (an element a step emits is processed by the steps reading it before
    the next one is emitted, as Beam's own workers run a fused stage), finish and tear down.

    Only outputs leaving the stage are kept: ``(export key, WindowedValue)`` each, plus
    ``(_METRICS, MetricUpdates)`` per step; with ``carry`` (one output leaving, read only by one
    ParDo) its ``WindowedValue`` and the metrics as :class:`_Carried` items, which the consumer
    passes on with its own. Before, each ParDo was its own map over the partition and returned a
    list: a read part's task held every raw block of the part (Python objects) before the encode
    step saw the first one, so a Dask worker's peak memory grew with the rows a part holds (a
    one-row-group Parquet file of 3M Adult rows is one part: 3,650 MiB against 351 MiB at 100k).
    A separate metrics task per bundle kept every bundle's outputs in memory until it ran, which
    dask put near the end: a worker held all sampled tables of a 10M-row run (2,155 MiB against
    662 MiB at 1M), hence :class:`_Carried`.
    """
    from apache_beam.runners.worker import statesampler

    run = _StageRun(stage, carry, side_values)
    root = stage.steps[0].window_fn
    carried = []
    previous = statesampler.get_current_tracker()
    statesampler.set_current_tracker(run.sampler)
    try:
        run.each("setup")
        run.each("start_bundle")
        for item in items:
            if isinstance(item, _Carried):  # an upstream bundle's metrics
                carried.append(item)
                continue
            with run.scope(0):
                run.invokers[0].invoke_process(_windowed(item, root))
        run.each("finish_bundle")  # before collecting: its outputs count too
        run.each("teardown")
    finally:
        statesampler.set_current_tracker(previous)
    updates = [c.get_cumulative() for c in run.containers]
    if carry:
        return [*run.results, *carried, *(_Carried(u) for u in updates)]
    return [*run.results, *((_METRICS, c.updates) for c in carried), *((_METRICS, u) for u in updates)]


def _select(partition: Iterable[tuple[Any, Any]], tag: Any) -> list[Any]:
    """The values of one output (export key, or ``_METRICS``) in a stage's ``(key, value)``
    pairs. A module function with the key as an argument: dask names a task by a hash of its
    function and arguments, and a closure over the key hashed the same for every key, so all
    outputs of a ParDo got one name (one bag) in the combined graph."""
    return [value for t, value in partition if t == tag]


def _concat(*parts: Sequence[Any]) -> list[Any]:
    return [x for part in parts for x in part]


def _size(partition: Iterable[Any]) -> list[int]:
    """A leaf partition reduced to its size: nothing but a number goes to the launcher."""
    n = 0
    for _ in partition:
        n += 1
    return [n]


def _group_key(item: Any) -> Any:
    return _value(item)[0]


def _group_value(kv: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
    """``(key, [ (key, WindowedValue) ...])`` → ``(key, [WindowedValue ...])`` for the
    GroupAlsoByWindow step that follows (``ReifyWindows`` put each value in its window)."""
    key, items = kv
    return key, [_value(item)[1] for item in items]


def _group_all(*partitions: Iterable[Any]) -> list[tuple[Any, list[Any]]]:
    """Every partition's items grouped by key in one task, keys in first-seen order: the
    ``GroupByKey`` of a ``CombineGlobally`` (one key per window, one accumulator per bundle)."""
    groups: dict[Any, list[Any]] = {}
    for partition in partitions:
        for item in partition:
            groups.setdefault(_group_key(item), []).append(item)
    return [_group_value(kv) for kv in groups.items()]


def _in_global_combine(node: AppliedPTransform) -> bool:
    """Whether a step is part of a ``CombineGlobally`` (its keys are None, or a hot-key fanout's
    few keys: the grouped accumulators are one per bundle, whatever the input's size)."""
    parent = node.parent
    while parent is not None:
        if isinstance(parent.transform, beam.CombineGlobally):
            return True
        parent = parent.parent
    return False


def _round_robin(partition: Iterable[Any], offsets: Iterable[int], npartitions: int) -> list[tuple[int, Any]]:
    """``((offset + position) mod npartitions, item)`` for every item of a partition; the offset is
    the partition's index, so partitions of one item each do not all deal to partition 0."""
    (offset,) = offsets
    return [((offset + i) % npartitions, item) for i, item in enumerate(partition)]


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


def _own_index(key: int) -> int:
    """The shuffle's "hash" of a dealt key: the key itself, so key ``k`` lands in partition ``k``."""
    return key


def _items(partition: Iterable[tuple[int, list[tuple[int, Any]]]]) -> list[Any]:
    return [item for _key, pairs in partition for _k, item in pairs]


def _spread(bag: Any, width: int = 1) -> Any:
    """A ``Reshuffle``: the bag's items dealt round robin over its partitions, exactly (Beam's
    DaskRunner made it the identity, so the sampling shards planned from one model all stayed in
    the one task holding the model: one worker sampled every shard and held every sampled table).

    The deal is exact: item ``k`` goes to partition ``k mod n`` (a task shuffle whose hash is the
    dealt key; dask's default hash of the key put up to 12 of 200 sampling shards in one of 68
    partitions and none in 35 others, 9 of 20 in one of 7 at 1M rows), so a partition holds at
    most ``ceil(items / n)`` items (sampling shards: 3 at 1M and at 10M Adult rows). ``n`` is the
    bag's partitions or ``width`` (the widest ``Create``: one per read file part), whichever is
    more: the steps after a ``CombineGlobally`` run in one partition, the shards planned there
    are dealt as wide as the input was read."""
    import dask.bag as db
    from dask.bag.core import groupby_tasks
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    n = max(bag.npartitions, width)
    if n <= 1:
        return bag
    name = "deal-" + tokenize(bag, n)
    dsk = {(name, i): (_round_robin, (bag.name, i) if i < bag.npartitions else [], [i], n)
           for i in range(n)}  # partitions past the bag's deal nothing
    dealt = db.Bag(HighLevelGraph.from_collections(name, dsk, dependencies=[bag]), name, n)
    return groupby_tasks(dealt, _first, hash=_own_index).map_partitions(_items)


def _flatten(bags: list[Any]) -> Any:
    """A ``Flatten``: partition ``j`` of the result concatenates partition ``j`` of every input
    that has one, so the result has as many partitions as the largest input (``db.concat`` lists
    every input's partitions: each Flatten added partitions, and the steps after the read had 5
    times as many tasks as read parts, 23,870 tasks for a 10M-row synthesize, in the launcher's
    scheduler)."""
    import dask.bag as db
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    if len(bags) == 1:
        return bags[0]
    name = "flatten-" + tokenize(*bags)
    width = max(b.npartitions for b in bags)
    dsk = {(name, j): (_concat, *[(b.name, j) for b in bags if j < b.npartitions])
           for j in range(width)}
    return db.Bag(HighLevelGraph.from_collections(name, dsk, dependencies=bags), name, width)


def _partition_cap(client: Any) -> int:
    """Partitions of a ``Create`` (the read's file parts): ``_PARTITIONS_PER_THREAD`` per worker
    thread of the cluster when the run starts (256 if it has none yet), so the graph's tasks follow
    the cluster, not the input's size. A worker keeps the state of every task it ran while a task
    depending on it is still known to it (``distributed``'s worker state: a released task is
    forgotten only after its dependents), and every task of a run leads to the final result, so a
    worker's memory grew with the tasks of the whole run, i.e. with the file parts (one task per
    part and step: 200k Adult rows read in 7 / 68 / 200 parts of one file, 2 workers × 1 thread,
    graphs of 582 / 6,647 / 21,768 tasks, the larger worker's peak RSS 369 / 351 / 476 MiB, 337 /
    367 / 349 with this cap). A partition reads its parts one after the other through the fused
    read stage, so a task's memory does not grow with them."""
    threads = sum(client.nthreads().values())
    if threads <= 0:
        return _MAX_CREATE_PARTITIONS
    return max(1, min(_MAX_CREATE_PARTITIONS, _PARTITIONS_PER_THREAD * threads))


class _LiftCombinePerKey(PTransformOverride):
    """``CombinePerKey`` → partial combine per bundle + ``GroupByKey`` of accumulators + merge
    (Beam's ``LiftedCombinePerKey``, the DirectRunner's override), for non-merging windows: the
    partial combine keeps one accumulator per (key, window), so a global combine moves one
    accumulator per bundle instead of every element."""

    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        if not isinstance(applied_ptransform.transform, beam.CombinePerKey):
            return False
        main = applied_ptransform.inputs[0]
        return not main.windowing.windowfn.is_merging()

    def get_replacement_transform_for_applied_ptransform(
            self, applied_ptransform: AppliedPTransform) -> beam.PTransform:
        transform = applied_ptransform.transform
        try:
            return LiftedCombinePerKey(transform.fn, transform.args, transform.kwargs)
        except NotImplementedError:  # 10 or more side-input arguments: left as it is
            return transform


def _read_split(split: SourceBundle) -> Iterable[Any]:
    """The elements of one split of a bounded source, read through the source's own range
    tracker one at a time (the fused stage's steps see each before the next is read)."""
    source = split.source
    return source.read(source.get_range_tracker(split.start_position, split.stop_position))


class _ReadSplit(beam.DoFn):
    """``SourceBundle`` → its elements (:func:`_read_split`): the root of a read's fused stage."""

    def process(self, split: SourceBundle) -> Iterable[Any]:
        yield from _read_split(split)


class _SourceSplits(beam.PTransform):
    """The DaskRunner's primitive of a bounded read: the source's ``SourceBundle`` splits, made
    when the runner builds the graph (:meth:`_BagVisitor._read_parts`), one partition each."""

    def __init__(self, source: BoundedSource) -> None:
        super().__init__()
        self.source = source

    def expand(self, pbegin: pvalue.PBegin) -> pvalue.PCollection:
        return pvalue.PCollection(pbegin.pipeline, is_bounded=True)

    def get_windowing(self, inputs: Any) -> beam.Windowing:
        return beam.Windowing(GlobalWindows())  # as Beam's Read


class _ReadBounded(beam.PTransform):
    """``beam.io.Read(BoundedSource)`` on the DaskRunner: the source's splits, each read by a
    ParDo in its own partition, so the steps after the read fuse into its stage."""

    def __init__(self, source: BoundedSource) -> None:
        super().__init__()
        self.source = source

    def expand(self, pbegin: pvalue.PBegin) -> pvalue.PCollection:
        return (pbegin
                | "Splits" >> _SourceSplits(self.source)  # SourceBundle, one per partition
                | "ReadSplit" >> beam.ParDo(_ReadSplit()))  # the source's elements


class _ReadBoundedSource(PTransformOverride):
    """``beam.io.Read`` of a ``BoundedSource`` (``ReadFromText``, ``ReadFromParquet``,
    ``ReadFromParquetBatched``, ``ReadFromAvro``, ...) → :class:`_ReadBounded`. Beam expands it to
    ``Impulse | Map(source) | SDFBoundedSourceReader`` (a splittable DoFn) and its DaskRunner
    replaced it with a ``_Read`` primitive it never translated: an empty bag, 0 rows read."""

    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        transform = applied_ptransform.transform
        return type(transform) is beam.io.Read and isinstance(transform.source, BoundedSource)

    def get_replacement_transform_for_applied_ptransform(
            self, applied_ptransform: AppliedPTransform) -> beam.PTransform:
        replacement = _ReadBounded(applied_ptransform.transform.source)
        element_type = next(iter(applied_ptransform.outputs.values())).element_type
        return replacement if element_type is None else replacement.with_output_types(element_type)


def _split_size(estimated: int | None, partitions: int, floor: int) -> int:
    """The desired split of a bounded read, in the source's units (bytes for files): its
    estimated size over ``partitions``, at least ``floor``. Public sizes only (file sizes from the
    file system), never the data's contents."""
    if not estimated:
        return _UNKNOWN_SIZE_SPLIT_BYTES
    return max(floor, math.ceil(estimated / partitions))


def _deal_parts(items: Sequence[Any], partitions: int) -> list[list[Any]]:
    """``items`` in order over ``min(len(items), partitions)`` contiguous parts whose sizes differ
    by at most one (one part, empty, if there are no items)."""
    n = max(1, min(len(items), partitions))
    return [list(items[i * len(items) // n:(i + 1) * len(items) // n]) for i in range(n)]


class _UnsupportedVisitor(PipelineVisitor):
    """Refuses, before any task runs, what the stages cannot run: a ``Read`` of anything but a
    ``BoundedSource`` (an ``UnboundedSource``, a runner-native source) and unbounded
    PCollections; splittable DoFns (SDF reads: ``ReadFromUnboundedSource``, ``PeriodicImpulse``,
    ``MatchContinuously``: the stages call ``process`` with no restriction); any other step
    without inputs but ``Create`` and ``Impulse`` (it became an empty bag: a job silently read
    0 rows, as Beam's ``Read`` did before :class:`_ReadBoundedSource`); and a ParDo whose DoFn
    has only ``process_batch`` (Beam DataFrame steps, ``WriteToCsv``: the stages call
    ``process``, a bare ``NotImplementedError`` mid-run after other outputs were written)."""

    def visit_transform(self, node: AppliedPTransform) -> None:
        from apache_beam.runners.common import DoFnSignature
        from apache_beam.runners.dask.overrides import _Create, _Read

        transform, label = node.transform, node.full_label
        use = ("nothing was run. Bounded reads (ReadFromText, ReadFromParquet, ReadFromAvro, "
               "beam.io.Read of a BoundedSource) and ReadAll* run on dask; or use --runner direct "
               "or direct-multi")
        if isinstance(transform, (_Read, beam.io.Read)):  # a primitive Read: not bounded
            source = getattr(transform, "source", None)
            raise NotImplementedError(
                f"the dask runner cannot run step {label!r}: Beam's Read of a "
                f"{type(source).__name__}, which is not a BoundedSource (unbounded or "
                f"runner-native); {use}")
        unbounded = [tag for tag, pcoll in node.outputs.items()
                     if isinstance(pcoll, pvalue.PCollection) and not pcoll.is_bounded]
        if unbounded:
            raise NotImplementedError(
                f"the dask runner cannot run step {label!r}: its output is unbounded (a "
                f"streaming source); the dask runner runs bounded pipelines only; {use}")
        fn = getattr(transform, "fn", None) if isinstance(transform, beam.ParDo) else None
        if fn is not None and DoFnSignature(fn).is_splittable_dofn():
            raise NotImplementedError(
                f"the dask runner cannot run step {label!r}: {type(fn).__name__} is a splittable "
                "DoFn (SDF: ReadFromUnboundedSource, PeriodicImpulse, MatchContinuously, ...), "
                f"which the dask runner's stages cannot split or checkpoint; {use}")
        if fn is not None and not fn._process_defined and fn._process_batch_defined:
            raise NotImplementedError(
                f"the dask runner cannot run step {label!r}: {type(fn).__name__} is a "
                "batched DoFn (process_batch only), as Beam DataFrame steps and WriteToCsv use; "
                "nothing was run. Write with WriteToText/WriteToParquet (WriteToParquet given a "
                "pyarrow schema: without one it converts schema'd rows with a batched DoFn; for "
                "rows, beam.Map(lambda r: r._asdict()) | WriteToParquet(path, "
                "bs.arrow_schema(pcoll))), or use --runner direct or direct-multi")
        inputs = [i for i in node.inputs if not isinstance(i, pvalue.PBegin)]
        if not inputs and not isinstance(transform, (_Create, beam.Impulse, _SourceSplits)):
            raise NotImplementedError(
                f"the dask runner cannot run step {label!r}: {type(transform).__name__} is a "
                f"primitive without inputs the dask runner does not translate; {use}")


class _ReadersVisitor(PipelineVisitor):
    """PCollection → the steps reading it, ``(step, "main" | "side")``; and the fused stages:
    a ParDo without side inputs whose input is a ParDo's output joins that ParDo's stage
    (``stages``: the root of each stage → its ParDos in topological order)."""

    def __init__(self) -> None:
        self.readers: dict[pvalue.PCollection, list[tuple[AppliedPTransform, str]]] = {}
        self.stages: dict[AppliedPTransform, list[AppliedPTransform]] = {}
        self._stage_of: dict[pvalue.PCollection, AppliedPTransform] = {}  # ParDo output → root

    def visit_transform(self, node: AppliedPTransform) -> None:
        for i in node.inputs:
            if not isinstance(i, pvalue.PBegin):
                self.readers.setdefault(i, []).append((node, "main"))
        for si in node.side_inputs:
            self.readers.setdefault(si.pvalue, []).append((node, "side"))
        if isinstance(node.transform, beam.ParDo):
            main = node.inputs[0] if node.inputs else None
            root = None if node.side_inputs else self._stage_of.get(main)
            if root is None:  # a stage's root reads a bag (and the side inputs)
                root = node
                self.stages[root] = []
            self.stages[root].append(node)
            for pcoll in node.outputs.values():
                self._stage_of[pcoll] = root


class _BagVisitor(PipelineVisitor):
    """Beam graph → dask bags, one per output PCollection (see the module docstring)."""

    def __init__(self, bag_kwargs: dict[str, Any],
                 readers: dict[pvalue.PCollection, list[tuple[AppliedPTransform, str]]],
                 stages: dict[AppliedPTransform, list[AppliedPTransform]],
                 max_partitions: int = _MAX_CREATE_PARTITIONS) -> None:
        self._bag_kwargs = bag_kwargs
        self._max_partitions = max_partitions  # a Create's partitions (see _partition_cap)
        self.readers = readers  # the steps reading each PCollection ("main" or "side")
        self.stages = stages  # fused stages: root ParDo → its ParDos
        self.bags: dict[pvalue.PCollection, Any] = {}
        self.metric_bags: list[Any] = []
        self.consumed: set[pvalue.PCollection] = set()
        self.width = 1  # partitions of the widest Create or bounded read so far

    def visit_transform(self, node: AppliedPTransform) -> None:
        from apache_beam.runners.dask.overrides import (
            _Create,
            _Flatten,
            _GroupByKeyOnly,
            _Reshuffle,
        )

        inputs = [i for i in node.inputs if not isinstance(i, pvalue.PBegin)]
        self.consumed.update(inputs)
        self.consumed.update(si.pvalue for si in node.side_inputs)
        outputs = list(node.outputs.items())
        kind = type(node.transform)
        if kind is _Create:
            self._set(outputs, self._create(node.transform.values))
        elif kind is _SourceSplits:
            splits, partitions = self._read_parts(node.transform.source)
            parts = _deal_parts(splits, partitions)
            # always `partitions` partitions (empty ones past the splits): the split count follows
            # the file sizes, and the partitions after the read (rows' order, a default sink's
            # file count) must not (rule 7)
            self._set(outputs, self._parts(parts + [[] for _ in range(partitions - len(parts))],
                                           "read-splits"))
        elif kind is beam.Impulse:  # one empty bytes element (Beam's Impulse), was an empty bag
            self._set(outputs, self._parts([[b""]], "impulse"))
        elif isinstance(node.transform, beam.ParDo):  # WindowInto, GroupAlsoByWindow too
            self._pardo(node, inputs, outputs)
        elif kind is _GroupByKeyOnly:
            bag = self.bags[inputs[0]]
            if _in_global_combine(node):  # one partition: every step after it is one task
                self._set(outputs, self._group_all(bag))
            else:
                self._set(outputs, bag.groupby(_group_key).map(_group_value))
        elif kind is _Reshuffle:
            self._set(outputs, _spread(self.bags[inputs[0]], self.width))
        elif kind is _Flatten:
            bags = [self.bags[i] for i in inputs]
            self._set(outputs, _flatten(bags) if bags else self._create([]))
        elif inputs:  # Beam's DaskRunner treats every other primitive as the identity
            self._set(outputs, self.bags[inputs[0]])
        else:
            self._set(outputs, self._create([]))

    @staticmethod
    def _group_all(bag: Any) -> Any:
        import dask.bag as db
        from dask.base import tokenize
        from dask.highlevelgraph import HighLevelGraph

        name = "group-all-" + tokenize(bag)
        dsk = {(name, 0): (_group_all, *[(bag.name, i) for i in range(bag.npartitions)])}
        return db.Bag(HighLevelGraph.from_collections(name, dsk, dependencies=[bag]), name, 1)

    def _set(self, outputs: list[tuple[Any, pvalue.PCollection]], bag: Any) -> None:
        for _, pcoll in outputs:
            self.bags[pcoll] = bag

    def _create(self, values: Sequence[Any]) -> Any:
        import dask.bag as db

        items = list(values)
        npartitions = self._bag_kwargs.get("npartitions")
        partition_size = self._bag_kwargs.get("partition_size")
        if npartitions and partition_size:
            raise ValueError(f"give --dask_npartitions ({npartitions}) or --dask_partition_size "
                             f"({partition_size}), not both")
        if partition_size:  # the user's choice: partitions follow the element count
            bag = db.from_sequence(items, npartitions=max(1, math.ceil(len(items) / partition_size)))
            self.width = max(self.width, bag.npartitions)
            return bag
        # always `n` partitions (empty ones past the elements): a Create of a user's records, or of
        # file parts whose count follows file sizes, must not set the width of the steps after it
        # (rows' order, a default sink's file count; rule 7). from_sequence would give fewer
        # partitions than asked for (10 elements into 8 -> 5)
        n = max(1, int(npartitions) if npartitions else self._max_partitions)
        parts = _deal_parts(items, n)
        return self._parts(parts + [[] for _ in range(n - len(parts))], "create")

    def _read_parts(self, source: BoundedSource) -> tuple[list[SourceBundle], int]:
        """A bounded source's splits by its own ``split(desired_bundle_size)``, and the partitions
        they go to: ``--dask_npartitions``, else the cluster's cap (:func:`_partition_cap`). The
        desired split is the source's estimated size (bytes: public file sizes) over those
        partitions, at least ``_MIN_SPLIT_BYTES`` unless ``--dask_npartitions`` is given; a file
        is at least one split (a compressed one exactly one), so a glob of many small files has
        more splits than partitions and a partition reads several, one after the other."""
        npartitions = self._bag_kwargs.get("npartitions")
        partitions = npartitions or self._max_partitions
        floor = 1 if npartitions else _MIN_SPLIT_BYTES
        desired = _split_size(source.estimate_size(), partitions, floor)
        return list(source.split(desired)), partitions

    def _parts(self, parts: list[list[Any]], label: str) -> Any:
        """A bag whose partition ``i`` holds ``parts[i]`` (at least one partition)."""
        import dask.bag as db
        from dask.base import tokenize

        parts = parts or [[]]
        name = f"{label}-{tokenize(parts)}"
        self.width = max(self.width, len(parts))
        return db.Bag({(name, i): part for i, part in enumerate(parts)}, name, len(parts))

    def _pardo(self, node: AppliedPTransform, inputs: list[pvalue.PCollection],
               outputs: list[tuple[Any, pvalue.PCollection]]) -> None:
        """A stage's root: the whole fused stage as one task per partition (:func:`_run_stage`),
        one bag per output leaving it. Any other ParDo runs inside its stage."""
        import dask

        steps = self.stages.get(node)
        if steps is None:
            return
        index = {step: i for i, step in enumerate(steps)}
        specs, exports = [], []
        for step in steps:
            transform = step.transform
            args, kwargs = transform.args, transform.kwargs  # side inputs as ArgumentPlaceholders
            main = next(iter(step.main_inputs.values()))
            window_fn = main.windowing.windowfn if hasattr(main, "windowing") else None
            main_tag = getattr(transform, "_main_tag", None) or None
            outs: dict[str | None, tuple[list[int], int | None]] = {}
            for tag, pcoll in step.outputs.items():
                want = None if tag is None or tag == main_tag else tag  # main output: untagged
                readers = self.readers.get(pcoll, [])
                inside = [index[r] for r, kind in readers if kind == "main" and r in index]
                export = None
                if len(inside) < len(readers):  # read outside the stage: a bag of its own
                    export = len(exports)
                    exports.append(pcoll)
                outs[want] = (inside, export)
            specs.append(_ParDoSpec(transform.fn, transform.label, list(args), kwargs, window_fn, outs))
        sides, side_values = [], []
        for si in node.side_inputs:
            sides.append(_SideSpec(type(si), si._view_options(), si._window_mapping_fn))
            side_bag = self.bags[si.pvalue]
            # unoptimized: an optimized copy of the side input's graph would reuse the main
            # graph's task names with other contents (dask: "different run_spec for key")
            side_values.append(dask.delayed(_concat)(*side_bag.to_delayed(optimize_graph=False)))
        carry = len(exports) == 1 and self._only_pardo_reads(exports[0])
        raw = self.bags[inputs[0]].map_partitions(_run_stage, _StageSpec(specs, sides), carry,
                                                  *side_values)
        if carry:  # WindowedValue per element, _Carried per bundle: one task chain, no select
            self.bags[exports[0]] = raw
            return
        # (export key, WindowedValue) per element leaving, (_METRICS, MetricUpdates) per step
        self.metric_bags.append(raw.map_partitions(_select, _METRICS))
        for key, pcoll in enumerate(exports):
            self.bags[pcoll] = raw.map_partitions(_select, key)

    def _only_pardo_reads(self, pcoll: pvalue.PCollection) -> bool:
        """Whether one ParDo reads ``pcoll``, as its main input, and nothing else does."""
        readers = self.readers.get(pcoll, [])
        return (len(readers) == 1 and readers[0][1] == "main"
                and isinstance(readers[0][0].transform, beam.ParDo))

    def leaves(self) -> list[Any]:
        """Bags of PCollections no step consumes (sinks, progress steps, ...)."""
        seen, out = set(), []
        for pcoll, bag in self.bags.items():
            if pcoll not in self.consumed and id(bag) not in seen:
                seen.add(id(bag))
                out.append(bag)
        return out


def _overrides() -> list[PTransformOverride]:
    """The graph overrides, in order: combines lifted before Beam's ``GroupByKey`` override;
    bounded reads by :class:`_ReadBoundedSource` (Beam's ``ReadOverride`` made every ``Read`` a
    primitive it never translated), so other Reads expand as Beam expands them (a
    ``PTransform`` source runs, an ``UnboundedSource``'s SDF is refused); then Beam's
    ``Create``, ``Reshuffle``, ``GroupByKey`` and ``Flatten`` overrides."""
    from apache_beam.runners.dask.overrides import dask_overrides

    beams = [o for o in dask_overrides() if type(o).__name__ != "ReadOverride"]
    return [_LiftCombinePerKey(), _ReadBoundedSource(), *beams]


def _quiet_dashboard(dask_options: dict[str, Any]) -> None:
    """The runner's own ``LocalCluster`` serves its HTTP endpoints on a free port unless bokeh
    (the dashboard) is installed. ``distributed`` binds 8787 by default and, when another cluster
    (another run, a notebook) holds it, warns ``UserWarning: Port 8787 is already in use. Perhaps
    you already have a cluster running?`` (4 lines on the terminal) and takes another port
    anyway; without bokeh (``beamsynth[dask]`` does not install it) there is no dashboard to find
    there. With bokeh, or a cluster of the user's, nothing changes."""
    if dask_options.get("address") or dask_options.get("scheduler_file"):
        return
    if importlib.util.find_spec("bokeh") is None:
        dask_options.setdefault("dashboard_address", ":0")


def _owns_cluster(client: Any) -> bool:
    """Whether ``client`` started its own ``LocalCluster`` (no ``--dask_client_address`` or
    scheduler file): only then are its workers' heartbeats ours to stop."""
    return getattr(client, "cluster", None) is not None


def _close(client: Any, future: Any = None) -> None:
    """Close the runner's client, and with it the ``LocalCluster`` it started, after stopping the
    workers' heartbeats and closing the workers with time to exit
    (:mod:`beamsynth.runners.dask_shutdown`). Both are best effort: whatever they raise (a worker
    already gone) never replaces the run's own outcome. ``future``: the run's result, released
    first, so that no worker closes holding a result the scheduler would log as lost."""
    if future is not None:
        with contextlib.suppress(Exception):  # a courtesy, as below
            future.release()
    if _owns_cluster(client):
        from beamsynth.runners.dask_shutdown import close_workers, stop_heartbeats

        try:
            client.run(stop_heartbeats, on_error="ignore")
            client.cluster.sync(close_workers, client.cluster)  # no "still alive ... killing"
        except Exception:  # noqa: BLE001 - a shutdown courtesy; the close below still runs
            pass
    client.close()


@dataclass
class DaskRunnerResult(PipelineResult):
    """A running pipeline: one future for the whole graph, Beam metrics when it is done.

    The run's ``distributed.Client`` (made by the runner) is closed when the run ends, and with
    it a ``LocalCluster`` it started; a cluster given by ``--dask_client_address`` stays up.
    """

    client: Any
    future: Any

    def __post_init__(self) -> None:
        super().__init__(PipelineState.RUNNING)
        self._metrics: DirectMetrics | None = None

    def wait_until_finish(self, duration: int | None = None) -> str:
        """Wait (``duration`` in ms, None: forever); raises what a task raised."""
        if self._state in (PipelineState.DONE, PipelineState.FAILED, PipelineState.CANCELLED):
            return self._state
        try:
            results = self.future.result(timeout=None if duration is None else duration / 1000)
        except TimeoutError:
            return self._state  # still running
        except BaseException:
            self._state = PipelineState.FAILED
            _close(self.client, self.future)
            raise
        _close(self.client, self.future)  # the runner's own client (and its LocalCluster)
        metrics = DirectMetrics()
        for item in results:
            if not isinstance(item, int):  # leaf sizes are ints, metric updates are not
                metrics.commit_logical(None, item)
        self._metrics = metrics
        self._state = PipelineState.DONE
        return self._state

    def cancel(self) -> str:
        """Cancel the graph's computation."""
        self._state = PipelineState.CANCELLING
        self.client.cancel([self.future])
        self._state = PipelineState.CANCELLED
        return self._state

    def metrics(self) -> MetricResults:
        """Beam metrics of every step (after :meth:`wait_until_finish`)."""
        if self._metrics is None:
            raise RuntimeError("metrics are known when the pipeline has finished: call "
                               "wait_until_finish() first")
        return self._metrics


class DaskRunner(PipelineRunner):
    """Runs a pipeline on a dask.distributed client with Beam's gaps closed (module docstring).

    Options are Beam's ``DaskOptions`` (``--dask_client_address``, ``--dask_npartitions``, ...).
    Without an address a ``LocalCluster`` is started by ``distributed.Client()``.
    """

    def run_pipeline(self, pipeline: beam.Pipeline, options: PipelineOptions) -> DaskRunnerResult:
        try:
            import dask
            import dask.bag as db
            import distributed
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError("the dask runner needs dask[distributed]: pip install "
                              "'beamsynth[dask]'") from exc
        from apache_beam.runners.dask.dask_runner import DaskOptions

        dask_options = options.view_as(DaskOptions).get_all_options(drop_default=True,
                                                                    current_only=True)
        bag_kwargs = DaskOptions._extract_bag_kwargs(dask_options)
        _quiet_dashboard(dask_options)
        pipeline.replace_all(_overrides())
        pipeline.visit(_UnsupportedVisitor())  # before a cluster starts or a task runs
        client = distributed.Client(**dask_options)
        try:
            if _owns_cluster(client):  # a quiet shutdown (dask_shutdown); never on a user's cluster
                from beamsynth.runners.dask_shutdown import Heartbeats

                client.register_plugin(Heartbeats(), name=Heartbeats.name)
            cap = _partition_cap(client)
            readers = _ReadersVisitor()
            pipeline.visit(readers)
            visitor = _BagVisitor(bag_kwargs, readers.readers, readers.stages, cap)
            pipeline.visit(visitor)  # splits bounded sources (file sizes) in the launcher
            sizes = [leaf.map_partitions(_size) for leaf in visitor.leaves()]
            everything = db.concat(sizes + visitor.metric_bags) if sizes or visitor.metric_bags \
                else db.from_sequence([], npartitions=1)
            (graph,) = dask.optimize(everything)
            return DaskRunnerResult(client, client.compute(graph))
        except BaseException:
            _close(client)  # a failed build (a missing file while splitting) leaves no client
            raise

