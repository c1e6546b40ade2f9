"""The beamsynth DaskRunner's tasks follow the cluster, not the input's size (issue 17).

A ``Create`` (the read's file parts) was split into one partition per element, up to 256, so a
run had one task per file part and step: a 10M-row CSV is 68 parts of 16 MiB. A dask worker keeps
the state of every task it ran while a task depending on it is still known to it, and every task
of a run leads to its final result, so worker memory grew with the parts (200k Adult rows read in
7 / 68 / 200 parts, 2 workers: worker peak RSS 334 / 401 / 466 MiB). Now a ``Create`` has at most
``_PARTITIONS_PER_THREAD`` partitions per worker thread. These tests translate pipelines with a
client stand-in (no cluster, dask's synchronous scheduler); the first fails on the old runner
(200 partitions, 10 times the tasks of 20 elements).
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

pytest.importorskip("dask.bag", reason="pip install 'beamsynth[dask]'")

SEEN: list[int] = []  # sums recorded by the sink (the sync scheduler runs in this process)


class _Client:
    """``distributed.Client`` stand-in: a cluster of ``threads`` worker threads; keeps the graph."""

    threads = 2
    graph = None

    def __init__(self, **_kwargs) -> None:
        pass

    def nthreads(self) -> dict[str, int]:
        return {f"w{i}": 1 for i in range(_Client.threads)}

    def compute(self, graph):
        _Client.graph = graph
        return None

    def close(self) -> None:
        pass

    @classmethod
    def current(cls, allow_global: bool = True):  # dask asks for a default client: none
        raise ValueError("no client")


def _record(total: int) -> None:
    SEEN.append(total)


def _run(n: int, monkeypatch) -> tuple[int, int]:
    """(tasks of the graph, partitions of the ``Create``) of ``Create(range(n)) | x+1 | sum``."""
    import distributed

    from beamsynth.runners import dask_runner

    monkeypatch.setattr(distributed, "Client", _Client)
    widths = []
    create = dask_runner._BagVisitor._create

    def spy(self, values):
        bag = create(self, values)
        widths.append(bag.npartitions)
        return bag

    monkeypatch.setattr(dask_runner._BagVisitor, "_create", spy)
    p = beam.Pipeline()
    _ = (p | beam.Create(range(n)) | beam.Map(lambda x: x + 1) | beam.CombineGlobally(sum)
         | beam.Map(_record))
    dask_runner.DaskRunner().run_pipeline(p, PipelineOptions([]))
    SEEN.clear()
    _Client.graph.compute(scheduler="sync")
    assert SEEN == [n * (n + 1) // 2]
    return len(dict(_Client.graph.__dask_graph__())), max(widths)


def test_tasks_do_not_grow_with_the_elements_of_a_create(monkeypatch):
    """24 and 240 file parts on a cluster of 2 threads: 8 partitions, the same tasks (the old
    runner: 24 and 240 partitions, the tasks growing with them)."""
    tasks_24, width_24 = _run(24, monkeypatch)
    tasks_240, width_240 = _run(240, monkeypatch)
    assert width_24 == width_240 == 8
    assert tasks_240 == tasks_24, (tasks_24, tasks_240)


def test_the_width_after_a_create_never_follows_its_element_count(monkeypatch):
    """1, 5, 10 and 24 elements (a user's records, or file parts whose count follows file sizes):
    always the cap's 8 partitions and the same graph, so nothing after the Create (rows' order, a
    default sink's file count) follows the count (rule 7). Before: 1 / 5 / 5 / 8 partitions
    (dask's from_sequence puts 10 elements into 5)."""
    runs = [_run(n, monkeypatch) for n in (1, 5, 10, 24)]
    assert [width for _, width in runs] == [8, 8, 8, 8]
    assert len({tasks for tasks, _ in runs}) == 1, runs


def test_partition_cap_follows_the_cluster(monkeypatch):
    from beamsynth.runners.dask_runner import _MAX_CREATE_PARTITIONS, _partition_cap

    for threads, cap in ((1, 4), (2, 8), (16, 64), (1000, _MAX_CREATE_PARTITIONS),
                         (0, _MAX_CREATE_PARTITIONS)):  # no worker yet: Beam's old width
        monkeypatch.setattr(_Client, "threads", threads)
        assert _partition_cap(_Client()) == cap
