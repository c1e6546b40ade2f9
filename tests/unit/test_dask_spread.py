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


def test_reshuffle_deals_exactly_even_where_hashing_would_not():
    """200 sampling shards planned in one of 68 partitions (a 10M-row run): every partition gets
    2 or 3 (dask's own hash of the dealt key put 12 in one partition, 35 empty); partitions of one
    item each keep one each (their deal starts at their own index)."""
    import dask

    from beamsynth.runners.dask_runner import _spread

    skewed = db.concat([db.from_sequence(range(200), npartitions=1),
                        db.from_sequence(range(67), npartitions=67).filter(lambda _x: False)])
    with dask.config.set(scheduler="sync"):
        sizes = _spread(skewed).map_partitions(lambda p: [len(list(p))]).compute()
        assert sum(sizes) == 200 and max(sizes) == 3 and sorted(set(sizes)) == [0, 2, 3]
        assert sum(1 for s in sizes if s) == 68  # the 13 extra partitions of the shuffle stay empty
        singles = _spread(db.from_sequence(range(4), npartitions=4))
        assert singles.map_partitions(lambda p: [len(list(p))]).compute() == [1, 1, 1, 1]


def test_flatten_keeps_the_widest_inputs_partitions():
    import dask

    from beamsynth.runners.dask_runner import _flatten

    a = db.from_sequence(range(6), npartitions=3)
    b = db.from_sequence(range(10, 12), npartitions=2)
    flat = _flatten([a, b, a])
    assert flat.npartitions == 3  # db.concat: 8
    with dask.config.set(scheduler="sync"):
        assert flat.compute() == [0, 1, 10, 0, 1, 2, 3, 11, 2, 3, 4, 5, 4, 5]
    assert _flatten([a]) is a


def test_reshuffle_deals_a_one_partition_bag_as_wide_as_the_read():
    """After a CombineGlobally every step runs in one partition: the sampling shards planned
    there are dealt over ``width`` partitions (the read's file parts)."""
    import dask

    from beamsynth.runners.dask_runner import _spread

    one = db.from_sequence(range(20), npartitions=1)
    with dask.config.set(scheduler="sync"):
        sizes = _spread(one, width=7).map_partitions(lambda p: [len(list(p))]).compute()
        assert sorted(sizes) == [2, 3, 3, 3, 3, 3, 3]
        assert sorted(_spread(one, width=7).compute()) == list(range(20))
    assert _spread(one, width=1) is one


def test_group_all_groups_every_partition_in_one_task():
    from apache_beam.utils.windowed_value import WindowedValue

    from beamsynth.runners.dask_runner import _group_all

    def kv(k, v):
        return WindowedValue((k, v), 0, ())

    got = _group_all([kv(None, 1), kv("a", 2)], [], [kv(None, 3)])
    assert got == [(None, [1, 3]), ("a", [2])]


def test_steps_read_by_one_pardo_get_no_metrics_task():
    """A → B → C is one fused stage (one task per bundle, one metrics task); a second reader of
    B (D) joins the same stage instead of adding metrics tasks that keep B's outputs."""
    import apache_beam as beam
    from apache_beam.runners.dask.overrides import dask_overrides

    from beamsynth.runners.dask_runner import _BagVisitor, _ReadersVisitor

    p = beam.Pipeline()
    chain = p | beam.Create(range(4)) | "A" >> beam.Map(str) | "B" >> beam.Map(len)
    _ = chain | "C" >> beam.Map(abs)
    p.replace_all(dask_overrides())
    readers = _ReadersVisitor()
    p.visit(readers)
    visitor = _BagVisitor({}, readers.readers, readers.stages)
    p.visit(visitor)
    assert len(visitor.metric_bags) == 1
    _ = chain | "D" >> beam.Map(abs)  # B now has two readers, both in A's stage
    readers = _ReadersVisitor()
    p.visit(readers)
    visitor = _BagVisitor({}, readers.readers, readers.stages)
    p.visit(visitor)
    assert len(visitor.metric_bags) == 1
