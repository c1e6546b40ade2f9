"""Running row counts on the terminal: one count per process and run over every bundle (every
unpickled copy of the DoFn), printed at 1-2-5 milestones, so the lines only go up and are few."""

from __future__ import annotations

import pickle
import re

import numpy as np

from beamsynth.pipelines.methods import progress
from beamsynth.pipelines.methods.progress import RowProgressFn, next_milestone
from beamsynth.schemas.schema import EncodedBatch


def _batch(n: int) -> EncodedBatch:
    return EncodedBatch(np.zeros((n, 2), dtype=np.int32), None)


def _counts(err: str, label: str) -> list[int]:
    return [int(m) for m in re.findall(rf"{label}: rows used (\d+)", err)]


def test_next_milestone():
    assert [next_milestone(x) for x in (0, 1, 2, 4, 5, 9, 10, 19, 49_999, 50_000)] == [
        1, 2, 5, 5, 10, 10, 20, 20, 50_000, 100_000]


def test_bundles_share_one_monotone_count(capsys, monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 1e9)
    fn = RowProgressFn("t")
    copies = [pickle.loads(pickle.dumps(fn)) for _ in range(3)]  # one per bundle, as Beam does
    sizes = [300, 7, 900, 50, 2000, 10, 4000, 1]
    for i, n in enumerate(sizes):
        assert list(copies[i % 3].process(_batch(n)))[0].codes.shape[0] == n
    shown = _counts(capsys.readouterr().err, "t")
    assert shown == sorted(shown) and shown[-1] <= sum(sizes)
    # printed only when a milestone is passed: 300 (1..200), 1207 (500, 1000), 3257 (2000),
    # 7267 (5000); not for every batch
    assert shown == [300, 1207, 3257, 7267]
    other = RowProgressFn("t")  # a second run in this process starts its own count
    list(other.process(_batch(5)))
    assert _counts(capsys.readouterr().err, "t") == [5]


def test_heartbeat_prints_between_milestones(capsys, monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0.0)
    fn = RowProgressFn("h")
    for _ in range(4):
        list(fn.process(_batch(3)))
    assert _counts(capsys.readouterr().err, "h") == [3, 6, 9, 12]
