"""BoundContributions emits batches whose content does not depend on arrival order.

Steps that key seeded randomness on batch content (e.g. the plausible-deniability candidates)
need this for a seeded multi-worker run to equal the single-process one.
"""

import numpy as np

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.units import _BoundShardFn


def _batches(n=2000, users=300):
    rs = RandomSource(seed=3)
    pids = np.array([f"u{i}" for i in rs.integers(users, n)], dtype=object)
    codes = np.stack([rs.child(1).integers(7, n), rs.child(2).integers(4, n)], axis=1)
    return [EncodedBatch(codes[s:s + 250], pids[s:s + 250]) for s in range(0, n, 250)]


def _emit(batches):
    out = list(_BoundShardFn(2, 11, "bound").process((5, batches), window=None))
    return [(b.codes.tobytes(), tuple(b.pids.tolist())) for b in out]


def test_same_batches_whatever_the_arrival_order():
    batches = _batches()
    reference = _emit(batches)
    assert reference and sum(len(p) for _, p in reference) < 2000  # some rows were dropped
    for perm_seed in (1, 2):
        order = RandomSource(seed=perm_seed).uniform(len(batches)).argsort()
        assert _emit([batches[i] for i in order]) == reference


def test_rows_come_out_sorted_by_id_then_codes():
    (codes, pids), = [(np.frombuffer(c, dtype=np.int64).reshape(-1, 2), p) for c, p in _emit(_batches())]
    keys = list(zip(pids, map(tuple, codes.tolist())))
    assert keys == sorted(keys)
