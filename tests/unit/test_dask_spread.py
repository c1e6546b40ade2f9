"""The beamsynth DaskRunner's ``Reshuffle`` deals a skewed bag's items over all its partitions
(Beam's DaskRunner made it the identity: every sampling shard of a model stayed in one task)."""

from __future__ import annotations

import pytest

db = pytest.importorskip("dask.bag", reason="pip install 'beamsynth[dask]'")


def test_reshuffle_spreads_a_skewed_bag_over_every_partition():
    import dask

    from beamsynth.runners.dask_runner import _spread

    skewed = db.concat([db.from_sequence(range(22), npartitions=1),
                        db.from_sequence(range(3), npartitions=3).filter(lambda _x: False)])
    assert skewed.map_partitions(lambda p: [len(list(p))]).compute(scheduler="sync") == [22, 0, 0, 0]
    spread = _spread(skewed)
    with dask.config.set(scheduler="sync"):
        sizes = spread.map_partitions(lambda p: [len(list(p))]).compute()
        assert sorted(sizes) == [5, 5, 6, 6]
        assert sorted(spread.compute()) == list(range(22))
    one = db.from_sequence(range(5), npartitions=1)
    assert _spread(one) is one
