"""The beamsynth DaskRunner streams elements through fused ParDo chains (issue 17).

Before, each ParDo was its own map over a dask partition returning a list, so a read part's task
held every raw block of the part before the encode step saw the first one: Dask workers' peak
memory grew with the rows one part holds (one 3M-row Parquet row group: 3,650 MiB against 351 at
100k rows). Now ParDos chained without side inputs run as one stage per partition, each element
pushed through the readers before the next is emitted, and only outputs leaving the stage are
kept. These tests run the runner's graph translation on dask's synchronous scheduler (no cluster,
a few seconds); both fail on the list-per-step translation (50 live elements; raw blocks kept).
"""

from __future__ import annotations

import weakref
from pathlib import Path

import apache_beam as beam
import pytest

pytest.importorskip("dask.bag", reason="pip install 'beamsynth[dask]'")

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"


class _Blob:
    """A large element stand-in; ``registry`` (a WeakSet) holds the live blobs of one producer."""

    def __init__(self, registry: weakref.WeakSet) -> None:
        self.registry = registry
        registry.add(self)


def _blobs(n: int):
    registry: weakref.WeakSet = weakref.WeakSet()
    for _ in range(n):
        yield _Blob(registry)


def _live(blob: _Blob) -> int:
    return len(blob.registry)


def _translate(p: beam.Pipeline):
    from apache_beam.runners.dask.overrides import dask_overrides

    from beamsynth.runners.dask_runner import _BagVisitor, _LiftCombinePerKey, _ReadersVisitor

    p.replace_all([_LiftCombinePerKey(), *dask_overrides()])
    readers = _ReadersVisitor()
    p.visit(readers)
    visitor = _BagVisitor({}, readers.readers, readers.stages)
    p.visit(visitor)
    return visitor


def test_a_chain_streams_one_element_at_a_time():
    """50 blobs emitted by one step, each read by the next: at most a few are alive at once
    (the list-per-step translation held all 50 when the reader saw the first)."""
    import dask

    p = beam.Pipeline()
    live = p | beam.Create([50]) | "Make" >> beam.FlatMap(_blobs) | "Live" >> beam.Map(_live)
    _ = (live, p | "None" >> beam.Create([])) | beam.Flatten()  # "Live"'s output leaves the stage
    visitor = _translate(p)
    with dask.config.set(scheduler="sync"):
        got = [wv.value for wv in visitor.bags[live].compute()]
    assert len(got) == 50
    assert max(got) <= 3, f"{max(got)} elements alive at once: the chain does not stream"


def test_raw_blocks_never_leave_the_reading_task():
    """``ReadRecords`` on the DaskRunner's single-output shapes, batches counted: the read, its
    type filters, the encode and the partial combine are one stage, so neither raw blocks nor
    encoded batches are a bag (a task result a worker holds); only dead letters, part counts and
    the combine's accumulators leave the reading task."""
    from beamsynth.pipelines.io.read import ReadRecords
    from beamsynth.schemas.schema import load_schema

    if not ADULT.exists():
        pytest.skip(f"{ADULT} absent")
    p = beam.Pipeline()
    out = p | "Read" >> ReadRecords(str(ADULT), load_schema("adult"), single_output=True,
                                    split_bytes=1 << 20)
    _ = out["batches"] | "Count" >> beam.combiners.Count.Globally()
    steps: dict[str, list[beam.PCollection]] = {}

    class _Outputs(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            steps[node.full_label] = list(node.outputs.values())

    p.visit(_Outputs())
    visitor = _translate(p)
    leaving = sorted(label.rsplit("/", 1)[-1] for label, pcs in steps.items()
                     if label.startswith(("Read/ReadRaw/ReadParts", "Read/EncodeRows/"))
                     and any(pc in visitor.bags for pc in pcs))
    assert leaving == ["EncodeRejected", "ReadPartsParts", "ReadPartsRejected"], leaving
    combine = [label for label, pcs in steps.items() if label.startswith("Count/")
               and any(pc in visitor.bags for pc in pcs)]
    assert combine and all("GroupByKey" in label or "GroupByWindow" in label
                           or "FinishCombine" in label or label.endswith(("UnKey", "InjectDefault"))
                           or "DoOnce" in label for label in combine), combine
