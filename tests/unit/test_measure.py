"""One-pass marginal counting: exact arithmetic and CombineFn merging across shards."""

import itertools

import numpy as np
import pytest

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import ApproxDP, PureDP
from beamsynth.transforms.measure import (
    DPMarginals,
    MarginalCountsCombineFn,
    count_marginals,
    noisy_marginals,
)
from beamsynth.transforms.noise import RandomSource

SHAPE = (3, 4, 50)
SPECS = [(0,), (1,), (0, 1), (2, 0), (0, 1, 2)]


def _codes(n, seed=0):
    rng = RandomSource(seed=seed)
    return np.stack([rng.child(j).integers(s, n) for j, s in enumerate(SHAPE)], axis=1)


def _brute(codes, cols):
    table = np.zeros(tuple(SHAPE[c] for c in cols), dtype=np.int64)
    for row in codes:
        table[tuple(row[c] for c in cols)] += 1
    return table


def test_count_marginals_matches_brute_force_dense_and_sparse_paths():
    codes = _codes(200)  # the 3-way table (600 cells) takes the sparse path, 1-way the dense one
    for spec, got in zip(SPECS, count_marginals(codes, SPECS, SHAPE)):
        assert np.array_equal(got.reshape(_brute(codes, spec).shape), _brute(codes, spec))


def test_combinefn_merged_across_shards_equals_single_pass():
    codes = _codes(5000, seed=1)
    fn = MarginalCountsCombineFn(SPECS, SHAPE)
    single = fn.extract_output(fn.add_input(fn.create_accumulator(), EncodedBatch(codes)))
    # imitate a runner: split into uneven shards, add batches, merge partial merges, some empty
    cuts = [0, 1, 700, 701, 2500, 5000]
    accs = []
    for a, b in itertools.pairwise(cuts):
        acc = fn.create_accumulator()
        acc = fn.add_input(acc, EncodedBatch(codes[a:b]))
        accs.append(acc)
    accs.append(fn.create_accumulator())
    merged = fn.merge_accumulators([fn.merge_accumulators(accs[:3]), fn.merge_accumulators(accs[3:])])
    out = fn.extract_output(fn.compact(merged))
    for s, m in zip(single, out):
        assert np.array_equal(s, m)


def test_combinefn_empty_input_gives_zero_tables():
    fn = MarginalCountsCombineFn([(0, 1)], SHAPE)
    out = fn.extract_output(fn.merge_accumulators([fn.create_accumulator()]))
    assert out[0].shape == (3, 4) and out[0].sum() == 0


def test_merge_does_not_alias_inputs():
    fn = MarginalCountsCombineFn([(0,)], SHAPE)
    a = fn.add_input(None, EncodedBatch(_codes(10)))
    before = a[0].copy()
    fn.merge_accumulators([a, fn.add_input(None, EncodedBatch(_codes(10, 2)))])
    assert np.array_equal(a[0], before)


@pytest.mark.parametrize("specs,match", [
    ([], "at least one marginal"),
    ([(0, 0)], "must name distinct columns"),
    ([(5,)], "must name distinct columns"),
])
def test_combinefn_validation(specs, match):
    with pytest.raises(ValueError, match=match):
        MarginalCountsCombineFn(specs, SHAPE)


def test_noisy_marginals_scale_and_every_cell_noised():
    tables = [np.zeros((3, 4), dtype=np.int64)]
    out = noisy_marginals(tables, specs=[(0, 1)], names=["a", "b", "c"], budgets=[PureDP(epsilon=0.5)],
                          sensitivity=2, rs=RandomSource(seed=3))
    m = out[0]
    assert m.scale == 4.0 and m.names == ("a", "b") and m.values.shape == (3, 4)
    assert m.values.dtype == np.int64
    assert np.count_nonzero(m.values) > 0


def test_dpmarginals_validation():
    with pytest.raises(ValueError, match="need one budget per marginal"):
        DPMarginals(specs=[(0,)], shape=SHAPE, names=list("abc"), budgets=[])
    with pytest.raises(ValueError, match="must be pure"):
        DPMarginals(specs=[(0,)], shape=SHAPE, names=list("abc"),
                    budgets=[ApproxDP(epsilon=1.0, delta=1e-6)])
    with pytest.raises(ValueError, match=r"max_contributions \(0\)"):
        DPMarginals(specs=[(0,)], shape=SHAPE, names=list("abc"), budgets=[PureDP(epsilon=1.0)],
                    max_contributions=0)
