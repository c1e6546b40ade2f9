"""The release order of plausible-deniability records: a function of the released multiset only."""

from __future__ import annotations

import numpy as np
import pytest

from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.plausible import (
    OrderReleased,
    ordered_release,
    release_order,
    release_shards,
)

SHAPE = (5, 3, 4)


def _codes(n: int = 400) -> np.ndarray:
    rs = RandomSource(seed=2)
    return np.stack([rs.child(i).integers(s, n) for i, s in enumerate(SHAPE)], axis=1)


def test_release_order_ignores_the_arrival_order():
    codes = _codes()
    def rs():  # a fresh stream per call, as each Order step derives its own
        return RandomSource(seed=9).child("plausible.order", 3, "global")

    ref = release_order(codes, rs())
    assert sorted(map(tuple, ref.tolist())) == sorted(map(tuple, codes.tolist()))  # a permutation
    for p in (1, 2, 3):
        perm = RandomSource(seed=p).child("perm").uniform(len(codes)).argsort()
        np.testing.assert_array_equal(release_order(codes[perm], rs()), ref)
    # not merely sorted: the permutation comes from the labelled stream
    other = release_order(codes, RandomSource(seed=9).child("plausible.order", 4, "global"))
    assert not np.array_equal(ref, other)
    assert not np.array_equal(ref, codes[np.lexsort(codes.T[::-1])])


def test_release_order_of_tiny_inputs():
    rs = RandomSource(seed=1)
    assert release_order(np.zeros((0, 3), np.int64), rs).shape == (0, 3)
    np.testing.assert_array_equal(release_order(np.array([[1, 2, 3]]), rs), [[1, 2, 3]])


def test_equal_rows_share_a_shard_and_shards_cover_the_rows():
    codes = np.concatenate([_codes(), _codes()[:50]])
    sh = release_shards(codes, SHAPE, 7)
    assert sh.min() >= 0 and sh.max() < 7
    np.testing.assert_array_equal(sh[-50:], sh[:50])
    parts = ordered_release(codes, shape=SHAPE, shards=7, seed=4)
    labels = [label for label, _ in parts]
    assert labels == sorted(labels) and len(set(labels)) == len(labels)
    rows = np.concatenate([r for _, r in parts])
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, codes.tolist()))


@pytest.mark.parametrize("shards", [0, -1, 2.5, True])
def test_order_released_validates_shards(shards):
    with pytest.raises(ValueError, match=rf"shards \({shards!r}\) must be an int >= 1"):
        OrderReleased(shape=SHAPE, shards=shards)
